"""A steady stream of one-image OCR requests, for the fault tests (restarts, node loss), until the
test has seen what it waits for: however fast the machine, it does not run dry first.

Each request shows a word and asks either for that word or for another one, so a lost answer,
an error or a score that belongs to another request are all caught.
"""

from __future__ import annotations

import pickle
import threading
import time
from dataclasses import dataclass, field

import requests

from testing.clock import wait_until
from testing.images import render_text

WORDS = ["Open", "Bakery", "Garden", "Coffee", "Hotel", "Pizza"]


@dataclass(frozen=True)
class Case:
    body: bytes
    matches: bool


def cases(size: int = 256) -> list[Case]:
    """Every word asked for itself and for the next word: high and low expected scores."""
    out = []
    for i, word in enumerate(WORDS):
        image = render_text(word, size=size)
        for asked, matches in ((word, True), (WORDS[(i + 1) % len(WORDS)], False)):
            body = pickle.dumps({"images": [image], "prompts": [f'a sign that says "{asked}"'], "metadata": {}})
            out.append(Case(body, matches))
    return out


@dataclass
class Outcome:
    case: Case
    status: int | str
    score: float | None
    started: float


@dataclass
class RequestStream:
    """``threads`` clients posting back to back until the ``with`` block ends (``max_seconds``
    only stops a hang)."""

    url: str
    threads: int = 4
    max_seconds: float = 600.0
    timeout: float = 60.0
    outcomes: list[Outcome] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._cases = cases()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._sent = 0
        self._workers = [threading.Thread(target=self._client, daemon=True) for _ in range(self.threads)]

    def __enter__(self) -> RequestStream:
        self._deadline = time.monotonic() + self.max_seconds
        for worker in self._workers:
            worker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for worker in self._workers:
            worker.join(self.timeout + 5)

    def _next_case(self) -> Case | None:
        with self._lock:
            if self._stop.is_set() or time.monotonic() > self._deadline:
                return None
            self._sent += 1
            return self._cases[self._sent % len(self._cases)]

    def _client(self) -> None:
        session = requests.Session()
        while (case := self._next_case()) is not None:
            started = time.monotonic()
            try:
                response = session.post(self.url + "/", data=case.body, timeout=self.timeout)
                score = pickle.loads(response.content)["scores"][0] if response.status_code == 200 else None
                outcome = Outcome(case, response.status_code, score, started)
            except requests.RequestException as exc:
                outcome = Outcome(case, type(exc).__name__, None, started)
            with self._lock:
                self.outcomes.append(outcome)

    def answered_since(self, moment: float) -> int:
        """Requests started after ``moment`` (time.monotonic) and answered 200."""
        with self._lock:
            return sum(o.started > moment and o.status == 200 for o in self.outcomes)

    def wait_answered_since(self, moment: float, count: int) -> None:
        wait_until(lambda: self.answered_since(moment) >= count, f"{count} answers", pause_s=0.05)

    def failures(self) -> list[str]:
        """Every request not answered 200 with a score on the right side of 0.5."""
        bad = []
        for o in self.outcomes:
            if o.status != 200:
                bad.append(f"status {o.status}")
            elif (o.score >= 0.9) != o.case.matches or (not o.case.matches and o.score >= 0.5):
                bad.append(f"score {o.score} for a case that {'matches' if o.case.matches else 'does not match'}")
        return bad
