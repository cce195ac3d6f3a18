"""Admission of a request's samples: only work that every sample can run at its full limits
before the deadline, the node's other admitted work included.

Each sample costs, at its limits, CPU seconds (its tests' CPU limits, no more than its wall
time on every core) and slot seconds (its tests' wall limits, no more than its sample's):
``Cost``. A worker's admitted samples share its cores and its run slots, requests in turn
(``FairSlots``), so any of them may finish last: a request is admitted when all the admitted
work and its own fit by the earliest deadline among them, on the cores (CPU seconds / cores)
and on the slots (slot seconds / slots, plus the longest sample's share: Graham's bound on a
list schedule). A
request that could not fit alone is a 413; one that does not fit beside the others, a 503
before it starts. Each sample gives its cost back as it ends.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from common.errors import Overloaded, PayloadTooLarge


@dataclass(frozen=True)
class Cost:
    """What one sample may take at its limits: CPU seconds and seconds of a run slot."""

    cpu_s: float
    slot_s: float


class Admitted:
    """One request's admitted samples: ``done(i)`` gives sample ``i``'s cost back."""

    def __init__(self, admission: Admission, costs: Sequence[Cost], expires: float) -> None:
        self._admission = admission
        self.costs: dict[int, Cost] = dict(enumerate(costs))
        self.expires = expires

    def done(self, index: int) -> None:
        self._admission.give_back(self, index)


class Admission:
    """The work a worker has admitted, against its ``cores`` and ``slots``; deadlines are read
    on ``clock`` (a test moves one by hand)."""

    def __init__(self, cores: int, slots: int, setting: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.cores = cores
        self.slots = slots
        self.setting = setting
        self.clock = clock
        self._lock = threading.Lock()
        self._admitted: set[Admitted] = set()

    @contextlib.contextmanager
    def admit(self, costs: Sequence[Cost], expires: float) -> Iterator[Admitted]:
        """Hold ``costs`` (one per sample) until the request ends, or refuse it (413 / 503)."""
        request = Admitted(self, costs, expires)
        now = self.clock()
        alone = self._needs([request])
        if alone > expires - now:
            raise PayloadTooLarge(
                f"the request's {len(costs)} samples need up to {alone:.0f} s of this node at their time limits "
                f"({self.cores} cores, {self.slots} run slots); its deadline allows {max(0.0, expires - now):.0f} s: "
                f"split the request, or lower the time limits ({self.setting})"
            )
        with self._lock:
            others = list(self._admitted)
            needed = self._needs([*others, request])
            by = min(r.expires for r in [*others, request]) - now
            if needed > by:
                raise Overloaded(
                    f"the node's admitted work and this request's need up to {needed:.0f} s at their time limits, "
                    f"{max(0.0, by):.0f} s are left before the earliest deadline; retry later"
                )
            self._admitted.add(request)
        try:
            yield request
        finally:
            with self._lock:
                self._admitted.discard(request)

    def give_back(self, request: Admitted, index: int) -> None:
        with self._lock:
            request.costs.pop(index, None)

    def _needs(self, requests: Sequence[Admitted]) -> float:
        """Seconds the samples of ``requests`` take at most, run together on this node."""
        costs = [cost for request in requests for cost in request.costs.values()]
        if not costs:
            return 0.0
        on_cores = sum(cost.cpu_s for cost in costs) / self.cores
        longest = max(cost.slot_s for cost in costs)
        on_slots = sum(cost.slot_s for cost in costs) / self.slots + (1 - 1 / self.slots) * longest
        return max(on_cores, on_slots)

    def stats(self) -> dict[str, float]:
        with self._lock:
            costs = [cost for request in self._admitted for cost in request.costs.values()]
            return {
                "requests": len(self._admitted),
                "samples": len(costs),
                "cpu_s": round(sum(c.cpu_s for c in costs), 1),
                "slot_s": round(sum(c.slot_s for c in costs), 1),
            }
