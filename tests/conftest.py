"""Shared fixtures: the repo root on sys.path, a real OCR service under gunicorn, and the fuzzers' hold on it."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testing import server as server_module
from testing.server import Server, gunicorn_server

if TYPE_CHECKING:
    from testing.fuzz import Target

# How every unit test in tests/ is marked: ``pytestmark = pytest.mark.unit`` or ``@pytest.mark.unit``.
UNIT_MARK = re.compile(rb"\bmark\.unit\b")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--collect-every-module",
        action="store_true",
        help="with -m unit, import the test modules that mark no test unit too (pytest_ignore_collect)",
    )


def unit_loop(config: pytest.Config) -> bool:
    """``-m unit`` alone: the quick in-process loop, spared what only the integration tier needs."""
    return config.getoption("markexpr", "").strip() == "unit" and not config.getoption("collect_every_module")


def pytest_configure(config: pytest.Config) -> None:
    """The unit loop runs no fuzzer: Hypothesis's plugin, which imports all of Hypothesis (about
    3 s of CPU) for its end-of-session summary, is left out of it."""
    if unit_loop(config):
        config.pluginmanager.set_blocked("hypothesispytest")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With ``-m unit``, a test module whose source never names the ``unit`` mark holds no test
    that runs: it is not imported, which spares the quick loop the integration tier's imports
    (tests/test_unit_collection.py checks that the same unit tests are collected either way)."""
    if not unit_loop(config) or not collection_path.name.startswith("test_") or collection_path.suffix != ".py":
        return None
    return True if UNIT_MARK.search(collection_path.read_bytes()) is None else None


@pytest.fixture(scope="session")
def ocr_server(tmp_path_factory) -> Iterator[Server]:
    """One OCR worker with small limits, shared by the OCR tests that do not kill it."""
    from testing.ocr import OCR_LIMITS  # imported by the OCR server's tests only

    with gunicorn_server("ocr", OCR_LIMITS, threads=128, log_dir=tmp_path_factory.mktemp("logs")) as server:
        yield server


@pytest.fixture(scope="module")
def fuzzed(ocr_server: Server) -> Iterator[Target]:
    """The shared OCR server; after the module, its worker must still be the one it started with."""
    from testing.fuzz import Target  # hypothesis: imported by the fuzzers only

    target = Target(ocr_server, ocr_server.worker_pids())
    yield target
    assert ocr_server.worker_pids() == target.workers, ocr_server.logs()
    assert requests.get(ocr_server.url + "/health", timeout=5).status_code == 200


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test not marked ``unit`` is an integration test (real gunicorn, sandboxes, nginx);
    a unit test bounds no wall or CPU time (those are marked ``timing``, in the integration tier).
    The long runs marked ``corpus`` are deselected unless asked for (``-m corpus`` or
    ``SCORER_TEST_CORPUS=1``): the suite's own run reports nothing skipped."""
    for item in items:
        if item.get_closest_marker("unit") is None:
            item.add_marker(pytest.mark.integration)
        elif item.get_closest_marker("timing") is not None:
            raise pytest.UsageError(f"{item.nodeid} is marked unit and timing: a unit test bounds no time")
    asked = os.environ.get("SCORER_TEST_CORPUS") == "1" or "corpus" in config.getoption("markexpr", "")
    if not asked:
        long_runs = [item for item in items if item.get_closest_marker("corpus") is not None]
        if long_runs:
            config.hook.pytest_deselected(items=long_runs)
            items[:] = [item for item in items if item.get_closest_marker("corpus") is None]


@pytest.fixture(autouse=True)
def _unit_tests_start_no_server(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test marked ``unit`` that starts a gunicorn service fails at once, so the quick loop
    (``-m unit``) stays in-process."""
    if request.node.get_closest_marker("unit") is not None:
        monkeypatch.setattr(server_module, "UNIT_TEST", request.node.nodeid)
