"""The worker's reclaimer (common/pipeline/memory.py): the memory is reclaimed once no request is in
flight, never while one is, once per quiet spell; and a reclaim collects reference cycles and
trims malloc. The quiet spell runs on a clock the tests move by hand."""

from __future__ import annotations

import ctypes.util
import gc
import platform
import threading
import weakref

import pytest

from common.pipeline import memory
from common.pipeline.memory import Reclaimer, reclaim_memory
from testing.clock import ManualClock

pytestmark = pytest.mark.unit

QUIET_S = 0.5


def test_nothing_is_due_while_a_request_is_in_flight() -> None:
    clock = ManualClock()
    reclaimer = Reclaimer(QUIET_S, reclaim=lambda: None, clock=clock)
    assert reclaimer.due_in() is None  # no request yet
    with reclaimer.request():
        with reclaimer.request():
            pass
        clock.advance(10 * QUIET_S)
        assert reclaimer.due_in() is None  # one still in flight, however long it runs
    assert reclaimer.due_in() == QUIET_S


def test_the_quiet_spell_starts_again_with_each_request_that_ends() -> None:
    clock = ManualClock()
    reclaimer = Reclaimer(QUIET_S, reclaim=lambda: None, clock=clock)
    with reclaimer.request():
        pass
    clock.advance(QUIET_S / 2)
    assert reclaimer.due_in() == QUIET_S / 2
    with reclaimer.request():
        pass
    assert reclaimer.due_in() == QUIET_S
    clock.advance(QUIET_S)
    assert reclaimer.due_in() == 0


def test_memory_is_reclaimed_once_per_quiet_spell_with_no_request_in_flight() -> None:
    clock = ManualClock()
    reclaimed = threading.Semaphore(0)
    in_flight_at_reclaim: list[int] = []

    def reclaim() -> None:
        in_flight_at_reclaim.append(reclaimer._active)
        reclaimed.release()

    reclaimer = Reclaimer(QUIET_S, reclaim=reclaim, clock=clock)
    with reclaimer.request():
        pass
    clock.advance(QUIET_S)
    assert reclaimed.acquire(timeout=60)  # a guard against a hang, never a measure
    assert in_flight_at_reclaim == [0]
    assert reclaimer.due_in() is None  # nothing ended since: no second reclaim, however long it stays idle
    clock.advance(100 * QUIET_S)
    assert reclaimer.due_in() is None and in_flight_at_reclaim == [0]
    with reclaimer.request():
        pass
    assert reclaimer.due_in() == QUIET_S
    clock.advance(QUIET_S)
    assert reclaimed.acquire(timeout=60)
    assert in_flight_at_reclaim == [0, 0]


def test_a_failing_reclaim_leaves_the_reclaimer_running() -> None:
    clock = ManualClock()
    failed, done = threading.Event(), threading.Event()

    def reclaim() -> None:
        if not failed.is_set():
            failed.set()
            raise RuntimeError("no malloc_trim here")
        done.set()

    reclaimer = Reclaimer(QUIET_S, reclaim=reclaim, clock=clock)
    with reclaimer.request():
        pass
    clock.advance(QUIET_S)
    assert failed.wait(60)
    with reclaimer.request():
        pass
    clock.advance(QUIET_S)
    assert done.wait(60)


def test_a_reclaim_collects_reference_cycles_and_trims_malloc(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a refused request's exception holds (its frames, in a cycle) is freed by the
    reclaim, not left to the collector's next run; then malloc's free memory is trimmed."""
    trims: list[int] = []
    monkeypatch.setattr(memory, "_TRIM", lambda: trims.append(1))

    class Held:
        pass

    held = Held()
    held.itself = held  # a reference cycle: only the cyclic collector frees it
    gone = weakref.ref(held)
    gc.disable()
    try:
        del held
        assert gone() is not None
        reclaim_memory()
        assert gone() is None
    finally:
        gc.enable()
    assert trims == [1]


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_glibcs_malloc_trim_is_found() -> None:
    assert ctypes.util.find_library("c") and memory._malloc_trim() is not None
