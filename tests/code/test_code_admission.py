"""Admission against a running server made small (2 slots, 60 s deadline): a request is taken
on only when every sample can run every test at its full limits before the deadline, beside
the work already admitted; the rest is refused before any of it runs, never graded `timeout`."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import requests

from testing.clock import wait_until
from testing.server import Server, gunicorn_server
from testing.timing import within

ENV = {
    "SCORER_CODE_INFRA_FAILURE_SCORE": "nan",
    "SCORER_CODE_MAX_PARALLEL": "2",
    "SCORER_CODE_TEST_CPU_S": "2",
    "SCORER_CODE_TEST_WALL_S": "4",
    "SCORER_CODE_SAMPLE_WALL_S": "16",
    "SCORER_CODE_MEMORY_MB": "256",
    "SCORER_REQUEST_TIMEOUT_S": "60",
}
# Correct A+B that spends 0.3 s of CPU first.
BUSY = (
    "import time\nstart = time.process_time()\nwhile time.process_time() - start < 0.3:\n    pass\n"
    "print(sum(map(int, input().split())))"
)
CPP_SUM = "#include <iostream>\nint main() { long a, b; std::cin >> a >> b; std::cout << a + b << std::endl; }"
LABEL = {"inputs": ["1 2", "3 4", "5 6", "7 8"], "outputs": ["3", "7", "11", "15"]}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with gunicorn_server("code", ENV, threads=16, log_dir=tmp_path_factory.mktemp("logs")) as srv:
        yield srv


def post(url: str, samples: int) -> tuple[requests.Response, float]:
    body = {"responses": [f"```python\n{BUSY}\n```"] * samples, "prompts": ["p"] * samples, "labels": [LABEL] * samples}
    started = time.monotonic()
    response = requests.post(url + "/score", json=body, timeout=120)
    return response, time.monotonic() - started


@pytest.mark.timing
def test_a_request_the_node_cannot_finish_is_refused_before_it_runs(server: Server) -> None:
    """100 correct samples x 4 tests of 0.3 s of CPU (over 60 s on 2 cores, a 60 s deadline): a
    413 at once, not correct samples graded `timeout`; 4 of them fit and all pass."""
    big, seconds = post(server.url, 100)
    assert big.status_code == 413 and "split the request" in big.text, (big.status_code, big.text[:500])
    assert seconds < within(5.0), f"refused after {seconds:.1f} s"  # grading would take a minute
    fits, _ = post(server.url, 4)
    assert fits.status_code == 200 and fits.json()["scores"] == [1.0] * 4, fits.text[:500]


@pytest.mark.timing
def test_a_request_beside_admitted_work_is_503_before_it_runs(server: Server) -> None:
    """Two requests that each fit alone but not together: the second is answered 503 at once
    (retried by trainers), and the first still passes every sample."""
    first: dict[str, object] = {}
    thread = threading.Thread(target=lambda: first.update(zip(("response", "seconds"), post(server.url, 4))))
    thread.start()
    wait_until_admitted(server.url, samples=4)
    second, seconds = post(server.url, 4)
    thread.join()
    assert second.status_code == 503 and "retry later" in second.text, (second.status_code, second.text[:500])
    assert seconds < within(5.0), f"refused after {seconds:.1f} s"  # grading would take a minute
    response = first["response"]
    assert isinstance(response, requests.Response) and response.json()["scores"] == [1.0] * 4, response.text[:500]


def test_a_run_code_call_beside_admitted_work_is_sandbox_fusions_retried_504(server: Server) -> None:
    """SandboxFusion's ``/run_code`` shares the admission: with the node's time taken by a
    graded request (6 samples: 56 of its 60 s on 2 slots), a C++ run (its build and its test,
    14 s more on a slot) is refused at once with the status verl's client retries, and it runs once
    the node is free again."""
    first: dict[str, object] = {}
    thread = threading.Thread(target=lambda: first.update(zip(("response", "seconds"), post(server.url, 6))))
    thread.start()
    wait_until_admitted(server.url, samples=6)
    run = {"code": CPP_SUM, "language": "cpp", "stdin": "2 3"}
    refused = requests.post(server.url + "/run_code", json=run, timeout=120)
    thread.join()
    assert refused.status_code == 504 and "retry later" in refused.text, (refused.status_code, refused.text[:500])
    response = first["response"]
    assert isinstance(response, requests.Response) and response.json()["scores"] == [1.0] * 6, response.text[:500]
    ran = requests.post(server.url + "/run_code", json=run, timeout=120)
    assert ran.status_code == 200 and ran.json()["run_result"]["stdout"] == "5\n", ran.text[:500]


def wait_until_admitted(url: str, samples: int) -> None:
    """Until the server holds ``samples`` admitted samples (``/info``), whatever the machine's load."""

    def admitted() -> bool:
        return requests.get(url + "/info", timeout=30).json()["model"]["admission"]["samples"] >= samples

    wait_until(admitted, f"{samples} samples admitted", pause_s=0.05)
