"""Shared fixtures: the repo root on sys.path, a real OCR service under gunicorn, and the fuzzers' hold on it."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testing import server as server_module
from testing.fuzz import Target
from testing.ocr import OCR_LIMITS
from testing.server import Server, gunicorn_server


@pytest.fixture(scope="session")
def ocr_server(tmp_path_factory) -> Iterator[Server]:
    """One OCR worker with small limits, shared by the OCR tests that do not kill it."""
    with gunicorn_server("ocr", OCR_LIMITS, threads=128, log_dir=tmp_path_factory.mktemp("logs")) as server:
        yield server


@pytest.fixture(scope="module")
def fuzzed(ocr_server: Server) -> Iterator[Target]:
    """The shared OCR server; after the module, its worker must still be the one it started with."""
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
