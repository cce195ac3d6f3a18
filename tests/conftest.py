"""Shared fixtures: the repo root on sys.path and a real OCR service under gunicorn."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests import server as server_module
from tests.server import Server, gunicorn_server

OCR_LIMITS = {
    "SCORER_MAX_ITEMS": "32",
    "SCORER_MAX_PIXELS": str(2048 * 2048),
    "SCORER_MAX_REQUEST_PIXELS": str(4 * 2048 * 2048),
    # Under the default (6 Mpx), over the 736x736 the tests' 512x512 images are read at: an image
    # read at the limit takes a few seconds on a loaded 2-core CPU, which the fuzzer allows.
    "SCORER_OCR_MAX_INPUT_PIXELS": str(1_500_000),
    "SCORER_MAX_BODY_BYTES": str(8 * 1024 * 1024),
    "SCORER_MAX_PROMPT_CHARS": "2000",
    # Batched detection, as on a GPU (the CPU default is 1 image per call, measured faster there).
    "SCORER_OCR_DET_BATCH": "8",
}


@pytest.fixture(scope="session")
def ocr_server(tmp_path_factory) -> Iterator[Server]:
    """One OCR worker with small limits, shared by the OCR tests that do not kill it."""
    with gunicorn_server("ocr", OCR_LIMITS, threads=128, log_dir=tmp_path_factory.mktemp("logs")) as server:
        yield server


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test not marked ``unit`` is an integration test (real gunicorn, sandboxes, nginx)."""
    for item in items:
        if item.get_closest_marker("unit") is None:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(autouse=True)
def _unit_tests_start_no_server(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test marked ``unit`` that starts a gunicorn service fails at once, so the quick loop
    (``-m unit``) stays in-process."""
    if request.node.get_closest_marker("unit") is not None:
        monkeypatch.setattr(server_module, "UNIT_TEST", request.node.nodeid)
