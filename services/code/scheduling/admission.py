"""Admission of a request's samples by what the node really does, and each sample's plan.

Work is counted in slot seconds: the wall time a sample holds a run slot, which is what the
node runs out of (a slot's wall time stretches when the cores are shared, and so does what
is measured). ``Rates`` keeps, per language, the slot seconds a test has cost here lately.

Every admitted sample is guaranteed its *floor*: ``PLAN_MARGIN`` times what its tests cost at
the measured rate (as measured when it is counted, so that the floors of samples already
admitted follow what the node learns), at least ``PLAN_FLOOR_S``, never more than its full limits (its *worst*).
A request is admitted when its client's queued work, its own included, still finishes by
its deadline (with a margin: ``ADMITTED_SHARE``) with each sample at its floor, the clients
taking the slots in turn (``FairSlots``), so a client's many requests or slow programs delay
another client by no more than that client's own share. Otherwise it is refused at once with a 503 and the seconds until
enough work has drained (``Retry-After``). Work that waits for a slot counts against its
own deadline.

When a sample takes its slot its *plan* is fixed: its full limits when its request has the
node to itself and fits there at them (what a quiet node always gave); else its floor plus a
share of the slack the node has before its deadline beyond every waiting sample's floor (up to
``PLAN_STRETCH`` floors beside other requests): a burst shares the node between its samples.
The plan is the sample's wall time (``Job.sample_s``): a sample still running at its plan
has spent it (``timeout``, the program's verdict), unless the node has since learned the plan
was short (``floor_shown``, ``Grader._run``): then it is run once more at a new plan; one cut
earlier by the deadline ran late through no choice of its own (no verdict). Everything it was
counted for is given back when it ends, and its slot time over the tests that ended on their
own is measured into ``Rates`` (a spinner's tests never end on their own: spinners raise no
one's floor, and the plans they hold while they run are what tightens admission; a heavy
program's completed tests raise the rate within a few samples).
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from common.limits.errors import Overloaded, PayloadTooLarge

# A sample's floor: this many times its tests' measured cost, at least this many seconds.
PLAN_MARGIN = 1.5
PLAN_FLOOR_S = 1.5
# A sample beside others is planned no more than this many floors.
PLAN_STRETCH = 3.0
# Of the time before a deadline, the part admitted work may fill at its floors: the rest is the
# margin for a measured rate that runs late and for the slots not freeing all at once.
ADMITTED_SHARE = 0.8
# The weight of each new measurement in a language's rate: about the last 20 samples count,
# but a rising cost counts at once (a few samples), so that heavier programs get their floors.
RATE_WEIGHT = 0.05
RISING_WEIGHT = 0.25
# A language's rate before anything of it was measured (the start it decays from: a node's first
# run, cold, costs many times its later ones), per test, and a build's.
FIRST_TEST_S = 0.05
FIRST_BUILD_S = 2.0


class Rates:
    """Per language, the slot seconds a test (and a build) took here lately, counted over the
    tests that ended on their own (``Grader._measure``): a decayed mean, quicker to rise."""

    def __init__(self, first_test_s: float = FIRST_TEST_S, first_build_s: float = FIRST_BUILD_S) -> None:
        self._lock = threading.Lock()
        self._first = first_test_s, first_build_s
        self._test_s: dict[str, float] = {}
        self._build_s: dict[str, float] = {}

    def test_s(self, language: str) -> float:
        with self._lock:
            return self._test_s.get(language, self._first[0])

    def build_s(self, language: str) -> float:
        with self._lock:
            return self._build_s.get(language, self._first[1])

    def measured(self, language: str, slot_s: float, tests: int, build_s: float | None = None) -> None:
        """A sample of ``language`` held its slot ``slot_s`` for ``tests`` tests (those it reached)."""
        with self._lock:
            # A language's first measurement replaces the guess it started from: a burst's first
            # wave is planned at the guess, and its samples cut short re-run at what it showed.
            if tests > 0:
                old = self._test_s.get(language)
                self._test_s[language] = slot_s / tests if old is None else _decayed(old, slot_s / tests)
            if build_s is not None:
                old = self._build_s.get(language)
                self._build_s[language] = build_s if old is None else _decayed(old, build_s)

    def stats(self) -> dict[str, dict[str, float]]:
        with self._lock:
            return {
                "test_s": {name: round(value, 4) for name, value in self._test_s.items()},
                "build_s": {name: round(value, 3) for name, value in self._build_s.items()},
            }


def _decayed(old: float, new: float) -> float:
    weight = RISING_WEIGHT if new > old else RATE_WEIGHT
    return (1 - weight) * old + weight * new


@dataclass(frozen=True)
class Cost:
    """One sample's work in slot seconds: ``expected`` at the rate measured *now* (a sample
    admitted before a burst's first runs were measured starts at what they showed), its
    ``worst`` at its full limits, and the ``floor`` it is guaranteed."""

    rates: Rates
    language: str
    tests: int
    worst: float
    builds: bool = False

    @property
    def expected(self) -> float:
        build = self.rates.build_s(self.language) if self.builds else 0.0
        return self.tests * self.rates.test_s(self.language) + build

    @property
    def floor(self) -> float:
        return min(self.worst, max(PLAN_MARGIN * self.expected, PLAN_FLOOR_S))


class Admitted:
    """One request's samples: ``started(i)`` fixes sample ``i``'s plan when it takes its slot,
    ``done(i)`` gives it back."""

    def __init__(self, admission: Admission, client: str, costs: Sequence[Cost], expires: float) -> None:
        self._admission = admission
        self.client = client
        self.costs: dict[int, Cost] = dict(enumerate(costs))  # the samples not done yet
        self.running: dict[int, tuple[float, float]] = {}  # index -> (started, plan)
        self.expires = expires

    def waiting(self) -> list[Cost]:
        return [cost for index, cost in self.costs.items() if index not in self.running]

    def plans_left(self, now: float) -> list[float]:
        """Of each running sample, the seconds of its plan still to come."""
        return [max(0.0, start + plan - now) for start, plan in self.running.values()]

    def started(self, index: int, at_least: float = 0.0) -> float:
        """Sample ``index`` took its slot: its plan, in seconds of wall time from now (on a
        re-run, ``at_least`` what its first run showed it needs, within its limits)."""
        return self._admission.start(self, index, at_least)

    def floor(self, index: int) -> float:
        """Sample ``index``'s floor at the rate measured now."""
        return self.costs[index].floor

    def done(self, index: int) -> None:
        self._admission.give_back(self, index)


class Admission:
    """The work a worker has admitted, against its ``slots``; time is read on ``clock``."""

    def __init__(self, slots: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.slots = slots
        self.clock = clock
        self._lock = threading.Lock()
        self._admitted: set[Admitted] = set()
        self.refused = 0

    @contextlib.contextmanager
    def admit(self, client: str, costs: Sequence[Cost], expires: float) -> Iterator[Admitted]:
        """Hold ``costs`` (one per sample) for ``client`` until the request ends, or refuse it:
        413 when even a quiet node could not grade it by ``expires`` at the measured rate, 503
        (with the seconds to wait) when the work admitted before it leaves it no room."""
        request = Admitted(self, client, costs, expires)
        now = self.clock()
        alone = _finish([cost.expected for cost in costs], self.slots)
        if alone > expires - now:
            raise PayloadTooLarge(
                f"the request's {len(costs)} samples need about {alone:.0f} s of this node at its measured rate "
                f"({self.slots} run slots); its deadline allows {max(0.0, expires - now):.0f} s: split the request"
            )
        with self._lock:
            late = self._late([*self._admitted, request], client, now)
            if late > 0:
                self.refused += 1
                raise Overloaded(
                    f"the node's admitted work leaves this request no room before its deadline at the measured rate "
                    f"({self.slots} run slots); retry in {math.ceil(late)} s",
                    retry_after_s=math.ceil(late),
                )
            self._admitted.add(request)
        try:
            yield request
        finally:
            with self._lock:
                self._admitted.discard(request)

    def _late(self, requests: Sequence[Admitted], client: str, now: float) -> float:
        """How many seconds past its deadline ``client``'s queued work ends (<= 0: none), every
        sample at its floor, the clients taking the slots in turn: each other client is ahead of
        it by at most as much as it has queued itself. (A newcomer may so delay a client that
        filled the node alone: that client's own next requests are then the ones refused.)"""
        waiting: dict[str, list[float]] = defaultdict(list)  # client -> its waiting samples' floors
        running: dict[str, list[float]] = defaultdict(list)  # client -> its running samples' plans left
        for request in requests:
            waiting[request.client] += [cost.floor for cost in request.waiting()]
            running[request.client] += request.plans_left(now)
        total = {name: sum(waiting[name]) + sum(running[name]) for name in {*waiting, *running}}
        ahead = sum(min(work, total[client]) for name, work in total.items() if name != client)
        # A waiting sample starts once the work before it has filled every slot (Graham's bound).
        longest = max(waiting[client], default=0.0)
        ends = max(max(running[client], default=0.0), (ahead + total[client] - longest) / self.slots + longest)
        expires = min(request.expires for request in requests if request.client == client)
        return ends - ADMITTED_SHARE * (expires - now)

    def start(self, request: Admitted, index: int, at_least: float = 0.0) -> float:
        """The plan of sample ``index`` as it takes its slot: its full limits when its request is
        alone on the node and all of it fits there at them; else its floor and a share of the
        slack beyond every queued sample's floor before its deadline (ending by it, and beside
        other requests no more than ``PLAN_STRETCH`` floors, so that the first samples of a
        burst, starting before the rest has arrived, cannot take the time of those behind)."""
        with self._lock:
            now = self.clock()
            request.running.pop(index, None)  # a sample re-run after a sandbox failure is planned anew
            cost = request.costs[index]
            left = request.expires - now
            alone = self._alone(request)
            if alone and self._fits_at_limits(request, now):
                plan = cost.worst
            else:
                waiting, running = self._queued(now)  # this sample's floor among the waiting
                slack = self.slots * left - sum(waiting) - sum(running)
                # A quarter of a part each, at most: a sample holds its slot for more than its plan
                # (its start and end), the slots do not free all at once, and the samples of a
                # burst still on their way (about a slot's worth) have a part too.
                share = max(0.0, slack) / (4 * len(waiting) + self.slots)
                # Its floor is its own, late or not; its share of the slack ends by its deadline.
                most = left if alone else min(left, PLAN_STRETCH * cost.floor)
                plan = max(cost.floor, min(cost.floor + share, most))
            plan = min(cost.worst, max(plan, at_least))
            request.running[index] = (now, plan)
            return plan

    def _alone(self, request: Admitted) -> bool:
        return all(not other.costs for other in self._admitted if other is not request)

    def _fits_at_limits(self, request: Admitted, now: float) -> bool:
        worst = [cost.worst for cost in request.waiting()]
        return _finish([*request.plans_left(now), *worst], self.slots) <= ADMITTED_SHARE * (request.expires - now)

    def _queued(self, now: float) -> tuple[list[float], list[float]]:
        """Every admitted sample's floor while it waits, and what is left of its plan while it runs."""
        waiting = [cost.floor for request in self._admitted for cost in request.waiting()]
        running = [left for request in self._admitted for left in request.plans_left(now)]
        return waiting, running

    def give_back(self, request: Admitted, index: int) -> None:
        with self._lock:
            request.costs.pop(index, None)
            request.running.pop(index, None)

    def stats(self) -> dict[str, float]:
        with self._lock:
            now = self.clock()
            waiting, running = self._queued(now)
            return {
                "requests": len(self._admitted),
                "clients": len({r.client for r in self._admitted}),
                "samples": len(waiting) + len(running),
                "waiting": len(waiting),
                "running": len(running),
                "planned_s": round(sum(waiting) + sum(running), 1),
                "refused": self.refused,
                "slots": self.slots,
                "plan": {
                    "margin": PLAN_MARGIN,
                    "floor_s": PLAN_FLOOR_S,
                    "stretch": PLAN_STRETCH,
                    "admitted_share": ADMITTED_SHARE,
                },
            }


def floor_shown(slot_s: float, tests: int, ended: int) -> float:
    """The floor a sample's own run showed it needs when its plan cut it: its slot time over the
    tests that ended on their own and the one cut, for all ``tests``. A spinner shows nothing."""
    return PLAN_MARGIN * slot_s * tests / (ended + 1) if ended else 0.0


def _finish(seconds: Sequence[float], slots: int) -> float:
    """When work of ``seconds`` per sample ends on ``slots`` slots, taken in list order (Graham)."""
    if not seconds:
        return 0.0
    longest = max(seconds)
    return (sum(seconds) - longest) / slots + longest
