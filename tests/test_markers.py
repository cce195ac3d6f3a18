"""The quick loop stays in-process: a test marked ``unit`` cannot start a gunicorn service, and
bounds no wall or CPU time (those tests are marked ``timing``, docs/testing.md)."""

from __future__ import annotations

import pytest

from testing.server import gunicorn_server

pytestmark = pytest.mark.unit


def test_a_unit_test_that_starts_a_server_fails_at_once() -> None:
    with pytest.raises(RuntimeError, match="marked unit"), gunicorn_server("ocr"):
        pass


def test_every_test_is_unit_or_integration(request: pytest.FixtureRequest) -> None:
    items = request.session.items
    assert items and all(
        (item.get_closest_marker("unit") is None) != (item.get_closest_marker("integration") is None) for item in items
    )


def test_no_unit_test_bounds_time(request: pytest.FixtureRequest) -> None:
    both = [
        item.nodeid
        for item in request.session.items
        if item.get_closest_marker("unit") is not None and item.get_closest_marker("timing") is not None
    ]
    assert not both
