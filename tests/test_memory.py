"""The worker's reclaimer (common/memory.py): the memory is reclaimed once no request is in
flight, never while one is, once per quiet spell."""

from __future__ import annotations

import threading

import pytest

from common.memory import Reclaimer, reclaim_memory

pytestmark = pytest.mark.unit


def test_memory_is_reclaimed_once_the_last_request_ends() -> None:
    reclaimed = threading.Semaphore(0)
    calls: list[int] = []
    reclaimer = Reclaimer(quiet_s=0.05, reclaim=lambda: (calls.append(reclaimer._active), reclaimed.release()))
    with reclaimer.request():
        with reclaimer.request():
            pass
        assert not reclaimed.acquire(timeout=0.5)  # one still in flight
    assert reclaimed.acquire(timeout=30)
    assert calls == [0]
    assert not reclaimed.acquire(timeout=0.3)  # nothing ended since: no second reclaim
    with reclaimer.request():
        pass
    assert reclaimed.acquire(timeout=30) and calls == [0, 0]


def test_a_failing_reclaim_leaves_the_reclaimer_running() -> None:
    failed, done = threading.Event(), threading.Event()

    def reclaim() -> None:
        if not failed.is_set():
            failed.set()
            raise RuntimeError("no malloc_trim here")
        done.set()

    reclaimer = Reclaimer(quiet_s=0.01, reclaim=reclaim)
    with reclaimer.request():
        pass
    assert failed.wait(30)
    with reclaimer.request():
        pass
    assert done.wait(30)


def test_reclaim_memory_runs_here() -> None:
    reclaim_memory()
