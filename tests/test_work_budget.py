"""The work budget on its own (``SCORER_MAX_WORK_BYTES``): what a request holds, a request that
does not fit waiting for room in deadline order until its deadline, and requests that hold bytes
and all want more never waiting on each other to their deadlines."""

from __future__ import annotations

import threading

import pytest

from common.limits.budget import WorkBudget, hold_work, tentative_work, trial_work
from common.limits.deadlines import Deadline
from common.limits.errors import Overloaded, PayloadTooLarge, ScorerError
from testing.clock import ManualClock, wait_until

pytestmark = pytest.mark.unit

SETTING = "SCORER_MAX_WORK_BYTES"


class Request(threading.Thread):
    """One request on its own thread: holds each of ``steps`` in turn (bytes of work; those
    after the first once ``ask`` is set), says so (``holds``: the steps held so far) and ends
    once ``finish`` is set; ``error`` is its refusal."""

    def __init__(self, budget: WorkBudget, deadline: Deadline, *steps: int, admitted: list[str] | None = None) -> None:
        super().__init__(daemon=True)
        self.budget, self.deadline, self.steps = budget, deadline, steps
        self.admitted = admitted
        self.holds = 0
        self.ask = threading.Event()
        self.finish = threading.Event()
        self.error: ScorerError | None = None

    def run(self) -> None:
        try:
            with self.budget.request(self.deadline):
                for step, nbytes in enumerate(self.steps):
                    if step:
                        self.ask.wait(60)  # a guard against a hang, never a measure
                    hold_work(nbytes, "decoded images")
                    self.holds += 1
                    if self.admitted is not None:
                        self.admitted.append(self.name)
                self.finish.wait(60)  # a guard against a hang, never a measure
        except ScorerError as exc:
            self.error = exc

    def holding(self, steps: int) -> Request:
        wait_until(lambda: self.holds == steps or not self.is_alive(), f"{self.name} holds {steps} steps")
        assert self.holds == steps, self.error
        return self

    def ended(self) -> Request:
        self.finish.set()
        self.join(60)
        assert not self.is_alive(), f"{self.name} still waits"
        return self


def start(budget: WorkBudget, name: str, deadline: Deadline, *steps: int, **kwargs) -> Request:
    request = Request(budget, deadline, *steps, **kwargs)
    request.name = name
    request.start()
    return request


def in_line(budget: WorkBudget, count: int) -> None:
    wait_until(lambda: len(budget._line) == count, f"{count} requests waiting for work bytes")


def test_work_bytes_are_held_until_the_request_ends_and_a_request_alone_over_the_budget_is_413() -> None:
    budget = WorkBudget(1000, SETTING)
    hold_work(10**9, "anything")  # outside a request: nothing held
    with budget.request(Deadline(60)):
        hold_work(600, "decoded images")
        with pytest.raises(PayloadTooLarge, match=r"\(SCORER_MAX_WORK_BYTES\), split the request"):
            hold_work(401, "OCR inputs")  # the request alone: over the whole budget, at once
        assert budget.held == 600
    assert budget.held == 0
    with budget.request(Deadline(60)):
        hold_work(1000, "decoded images")  # given back: the whole budget again


def test_a_refused_check_holds_nothing_and_a_trial_holds_nothing_at_all() -> None:
    budget = WorkBudget(1000, SETTING)
    with budget.request(Deadline(60)):
        hold_work(300, "decoded images")
        with pytest.raises(PayloadTooLarge), tentative_work():
            hold_work(400, "OCR inputs")
            hold_work(400, "more OCR inputs")  # the check refuses after holding some
        assert budget.held == 300
        with tentative_work():
            hold_work(200, "kept")
        assert budget.held == 500
        for _ in range(10):
            with trial_work():
                hold_work(900, "one sample alone")  # each trial alone: under the budget
        with pytest.raises(PayloadTooLarge), trial_work():
            hold_work(900, "one sample")
            hold_work(101, "past the whole budget")
        assert budget.held == 500
    assert budget.held == 0


def test_a_request_that_does_not_fit_waits_for_room_instead_of_a_503() -> None:
    """On 1bbc00e the second request was a 503 at once (a pickle body's 500: VeRL-Omni's client
    lost 28 to 72 of 128 one-image requests to them); now it waits for the first to end."""
    clock = ManualClock()
    budget = WorkBudget(1000, SETTING)
    first = start(budget, "first", Deadline(60, clock=clock), 600).holding(1)
    second = start(budget, "second", Deadline(60, clock=clock), 500)
    in_line(budget, 1)
    assert second.holds == 0 and budget.held == 600
    first.ended()
    second.holding(1)
    assert budget.held == 500 and len(budget._line) == 0
    assert second.ended().error is None and budget.held == 0


def test_waiters_get_room_earliest_deadline_first_and_a_request_holding_some_before_any() -> None:
    """Requests holding nothing get in earliest deadline first, whatever their arrival; one that
    already holds bytes and wants more goes before them: it cannot give its bytes back until it
    has finished."""
    clock = ManualClock()
    budget = WorkBudget(1000, SETTING)
    admitted: list[str] = []
    holder = start(budget, "holder", Deadline(90, clock=clock), 400, 600, admitted=admitted).holding(1)
    other = start(budget, "other", Deadline(90, clock=clock), 500).holding(1)
    holder.ask.set()  # waits for other to end
    in_line(budget, 1)
    waiters = []
    for count, seconds in enumerate((30, 10, 20), 2):
        waiters.append(start(budget, f"due in {seconds}s", Deadline(seconds, clock=clock), 1000, admitted=admitted))
        in_line(budget, count)
    for request in waiters:
        request.finish.set()  # each ends once it is in
    other.ended()
    holder.holding(2).ended()
    for request in waiters:
        request.join(60)
    assert admitted == ["holder", "holder", "due in 10s", "due in 20s", "due in 30s"]
    assert all(request.error is None for request in waiters) and budget.held == 0


def test_a_wait_ends_at_the_request_s_deadline_with_a_retryable_503() -> None:
    clock = ManualClock()
    budget = WorkBudget(1000, SETTING)
    big = start(budget, "big", Deadline(60, clock=clock), 600).holding(1)
    small = start(budget, "small", Deadline(60, clock=clock), 300).holding(1)
    soon = start(budget, "soon", Deadline(10, clock=clock), 500)
    in_line(budget, 1)
    later = start(budget, "later", Deadline(30, clock=clock), 500)
    in_line(budget, 2)
    clock.advance(10)
    small.ended()  # room made, not enough: the line looks at the clock again
    soon.join(60)
    assert isinstance(soon.error, Overloaded) and soon.holds == 0
    assert "deadline passed" in soon.error.message and "(SCORER_MAX_WORK_BYTES); retry later" in soon.error.message
    assert later.is_alive() and later.holds == 0 and len(budget._line) == 1  # its deadline is still ahead
    big.ended()
    assert later.holding(1).ended().error is None and budget.held == 0


@pytest.mark.parametrize("latest_asks_last", [True, False], ids=["the latest asks last", "the latest asks first"])
def test_requests_holding_bytes_that_all_want_more_never_wait_on_each_other(latest_asks_last: bool) -> None:
    """Two requests hold 400 of 1000 each and each wants 300 more: neither can ever fit while
    the other holds its 400. The first to ask waits (the other may still end); once every
    request holding bytes waits for more, the one due last is refused at once (a retryable 503)
    and gives its bytes back, and the other goes on. The clock never moves: a wait to the
    deadlines would hang here."""
    clock = ManualClock()
    budget = WorkBudget(1000, SETTING)
    early = start(budget, "early", Deadline(20, clock=clock), 400, 300).holding(1)
    late = start(budget, "late", Deadline(30, clock=clock), 400, 300).holding(1)
    first, second = (early, late) if latest_asks_last else (late, early)
    first.ask.set()
    in_line(budget, 1)
    assert first.is_alive() and first.error is None  # the other still runs: it may end
    second.ask.set()
    late.join(60)
    assert isinstance(late.error, Overloaded) and late.holds == 1, late.error
    assert "all wait for more" in late.error.message and "(SCORER_MAX_WORK_BYTES)" in late.error.message
    assert early.holding(2).ended().error is None and budget.held == 0


def test_the_last_running_holder_ending_leaves_no_wait_that_cannot_end() -> None:
    """Two requests wait for more while a third holds bytes and may still end; when it ends the
    room is not enough for either, and the one due last gives up at once."""
    clock = ManualClock()
    budget = WorkBudget(1000, SETTING)
    early = start(budget, "early", Deadline(20, clock=clock), 300, 500).holding(1)
    late = start(budget, "late", Deadline(30, clock=clock), 300, 500).holding(1)
    running = start(budget, "running", Deadline(10, clock=clock), 300).holding(1)
    early.ask.set()
    late.ask.set()
    in_line(budget, 2)
    assert early.is_alive() and late.is_alive() and budget.held == 900
    running.ended()
    late.join(60)
    assert isinstance(late.error, Overloaded) and "all wait for more" in late.error.message
    assert early.holding(2).ended().error is None and budget.held == 0
