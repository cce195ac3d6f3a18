"""The OCR fuzzers' request check (``tests/test_fuzz.py``, ``tests/test_fuzz_decode.py``): a
score per image or a clear 4xx, in time, from the worker that was there before; and their
hypothesis settings."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import requests
from hypothesis import HealthCheck, settings

from common.sdk.client import parse_answer
from testing.server import Server
from testing.timing import within

CLEAR_ERRORS = {400, 413, 415, 422}
# A refusal slower than this is a finding, and so is a 200 slower than this per image read: a
# request that costs seconds beyond the work its images ask for is a way to stall a node.
ANSWER_WITHIN_S = within(5.0)


def fuzz(examples: int) -> settings:
    """``examples`` per property in the suite; SCORER_FUZZ_EXAMPLES overrides them all."""
    return settings(
        max_examples=int(os.environ.get("SCORER_FUZZ_EXAMPLES", examples)),
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
    )


@dataclass
class Target:
    """The server under fuzzing and the worker it had when fuzzing began."""

    server: Server
    workers: list[int]

    @property
    def url(self) -> str:
        return self.server.url


def check(target: Target, body: bytes, content_type: str = "application/octet-stream") -> None:
    """One request: a score per image or a clear 4xx, in time, from the worker that was there before."""
    started = time.perf_counter()
    try:
        response = requests.post(target.url + "/", data=body, headers={"Content-Type": content_type}, timeout=60)
    except requests.RequestException as exc:  # the worker died under the request
        raise AssertionError(f"no answer ({exc}); body {body[:200]!r}\n{target.server.logs()}") from None
    seconds = time.perf_counter() - started
    answer = parse_answer(response.content, response.headers.get("Content-Type", ""))
    assert target.server.worker_pids() == target.workers, f"worker replaced; body {body[:200]!r}"
    if response.status_code == 200:
        assert isinstance(answer["scores"], list) and all(isinstance(s, float) for s in answer["scores"]), answer
        # Images within every limit are read, each up to SCORER_OCR_MAX_INPUT_PIXELS: the budget
        # is per image read (on a loaded 2-core CPU, RapidOCR takes 2-3 s at the tests' 1.5 Mpx).
        budget = ANSWER_WITHIN_S * max(1, len(answer["scores"]))
        assert seconds < budget, f"200 in {seconds:.1f}s for {len(answer['scores'])} images; body {body[:200]!r}"
        return
    assert seconds < ANSWER_WITHIN_S, f"{response.status_code} in {seconds:.1f}s: {answer}; body {body[:200]!r}"
    assert response.status_code in CLEAR_ERRORS, (response.status_code, answer, body[:200])
    assert isinstance(answer.get("error"), str) and len(answer["error"]) > 10, answer
    assert len(response.content) < 4096, f"an error body of {len(response.content)} bytes"
