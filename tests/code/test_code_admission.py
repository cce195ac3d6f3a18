"""Bursts as trainers send them, against a code server pinned to 2 cores on its defaults
(7 run slots for one client, a 110 s deadline): graded at the node's measured rate, not
refused at the samples' worst case. OpenRLHF sends one request per sample, all at once, and
tries 5 times, 1 s apart; verl retries 504 only."""

from __future__ import annotations

import http.client
import json
import math
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from testing.clock import wait_until
from testing.code import busy_slots, post_from, sandbox_processes, sandbox_uids, verl_client
from testing.server import Server, gunicorn_server
from testing.timing import within

ENV = {"SCORER_CODE_INFRA_FAILURE_SCORE": "nan"}
CPUS = {0, 1}
BURST = 256
APLUSB = "a, b = map(int, input().split())\nprint(a + b)"
SPIN = "while True:\n    pass"
LABEL = {"inputs": [f"{i} {i + 1}" for i in range(10)], "outputs": [str(2 * i + 1) for i in range(10)]}
JAVA_APLUSB = """import java.util.Scanner;
public class Main {
    public static void main(String[] args) {
        Scanner in = new Scanner(System.in);
        System.out.println(in.nextLong() + in.nextLong());
    }
}"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with gunicorn_server("code", ENV, log_dir=tmp_path_factory.mktemp("logs"), cpus=CPUS) as srv:
        yield srv


def openrlhf(url: str, program: str, source: str = "127.0.0.1") -> float | None:
    """One sample as OpenRLHF's remote reward client sends it: 5 attempts, 1 s apart, any
    failure retried; ``None`` when all failed."""
    body = json.dumps({"query": [f"```python\n{program}\n```"], "prompts": [""], "labels": [LABEL]})
    for attempt in range(5):
        status, answer = post(url, "/reward/score", body, source)
        if status == 200:
            return answer["rewards"][0]
        if attempt < 4:
            time.sleep(1)
    return None


def post(url: str, path: str, body: str, source: str = "127.0.0.1") -> tuple[int, dict]:
    return post_from(source, url, path, body)


def burst(url: str, programs: list[str]) -> list[float | None]:
    with ThreadPoolExecutor(len(programs)) as pool:
        return list(pool.map(lambda program: openrlhf(url, program), programs))


def test_an_openrlhf_burst_of_correct_samples_is_graded_whole(server: Server) -> None:
    """256 concurrent one-sample requests (10 tests each): today's worst-case planning took
    20-31 of them; every one scores 1.0."""
    rewards = burst(server.url, [APLUSB] * BURST)
    assert rewards.count(1.0) == BURST, sorted(map(str, rewards))[:20]


def test_one_request_of_160_short_samples_is_graded(server: Server) -> None:
    body = {"responses": [f"```python\n{APLUSB}\n```"] * 160, "prompts": ["p"] * 160, "labels": [LABEL] * 160}
    answer = requests.post(server.url + "/score", json=body, timeout=180)
    assert answer.status_code == 200 and answer.json()["scores"] == [1.0] * 160, answer.text[:500]


def test_past_what_the_node_can_grade_by_the_deadline_a_refusal_says_when_to_retry(server: Server) -> None:
    """Four requests of 160 samples at once: those the node cannot reach before their deadline
    are a 503 with ``Retry-After``, at once; the others are graded."""
    body = {"responses": [f"```python\n{APLUSB}\n```"] * 160, "prompts": ["p"] * 160, "labels": [LABEL] * 160}
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: requests.post(server.url + "/score", json=body, timeout=180), range(4)))
    refused = [a for a in answers if a.status_code == 503]
    assert refused and all(int(a.headers["Retry-After"]) >= 1 for a in refused), [a.status_code for a in answers]
    assert all(a.json()["scores"] == [1.0] * 160 for a in answers if a.status_code == 200)


def test_a_java_answer_gets_its_own_verdict_beside_a_python_sample(server: Server) -> None:
    """The response chooses its language with the fence tag; its worst case (a JVM build and
    slower tests) is no reason to refuse the request, and the Python sample gets its reward."""
    responses = [f"```java\n{JAVA_APLUSB}\n```", f"```python\n{APLUSB}\n```"]
    body = {"responses": responses, "prompts": ["p"] * 2, "labels": [LABEL] * 2}
    answer = requests.post(server.url + "/score", json=body, timeout=180)
    assert answer.status_code == 200, answer.text[:500]
    scores = answer.json()["scores"]
    assert scores[1] == 1.0 and (scores[0] == 1.0 or answer.json()["error_types"][0] == "language_unavailable")


def test_verls_check_correctness_at_256_concurrent_gets_every_correct_case(server: Server) -> None:
    """verl's own client (``check_correctness``, 504 retried 3 times; 32 cases at once each call),
    8 calls at once under one ``max_concurrent=256`` semaphore, as verl's reward manager makes
    them: 256 correct runs in flight."""
    verl = verl_client()
    cases = {"inputs": [f"{i} {i}\n" for i in range(32)], "outputs": [f"{2 * i}\n" for i in range(32)]}
    max_concurrent = threading.Semaphore(BURST)  # verl's sandbox_fusion max_concurrent, shared

    def check(_: int) -> list:
        results, metadata = verl.check_correctness(
            server.url + "/run_code", cases, APLUSB, timeout=10, concurrent_semaphore=max_concurrent
        )
        return [result if result is True else metadata[index] for index, result in enumerate(results)]

    with ThreadPoolExecutor(BURST // 32) as pool:
        checked = [result for results in pool.map(check, range(BURST // 32)) for result in results]
    assert checked == [True] * BURST, [result for result in checked if result is not True][:3]


def test_one_clients_loopers_leave_another_clients_runs_graded(server: Server) -> None:
    """Client A keeps 64 spinning ``/run_code`` calls in flight; client B, from another address,
    gets its correct samples graded and its runs made."""
    stop = threading.Event()
    spin = json.dumps({"code": SPIN, "language": "python", "run_timeout": 5})

    def looper() -> None:
        while not stop.is_set():
            post(server.url, "/run_code", spin, "127.0.0.2")

    loopers = [threading.Thread(target=looper) for _ in range(64)]
    for thread in loopers:
        thread.start()
    try:
        time.sleep(3)  # the loopers' calls are in and holding the slots they can
        graded = [openrlhf(server.url, APLUSB, "127.0.0.3") for _ in range(3)]
        run = json.dumps({"code": APLUSB, "language": "python", "stdin": "2 3"})
        ran = [post(server.url, "/run_code", run, "127.0.0.3") for _ in range(3)]
    finally:
        stop.set()
        for thread in loopers:
            thread.join()
    assert graded == [1.0] * 3
    assert all(status == 200 and answer["run_result"]["stdout"] == "5\n" for status, answer in ran), ran
    # Runs stopped at their limits say nothing of what a run costs: the loopers raised no one's floor.
    assert admission(server)["rates"]["test_s"]["python"] < 1.0


def test_a_client_that_hangs_up_has_its_queued_samples_skipped(server: Server) -> None:
    """A request of 60 spinners, admitted, then the connection closed: its samples still waiting
    for a slot are not run (each would hold one for seconds), and /metrics counts why none of
    them got a verdict."""
    body = json.dumps({"query": [f"```python\n{SPIN}\n```"] * 60, "prompts": [""] * 60, "labels": [LABEL] * 60})
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=180)
    conn.request("POST", "/reward/score", body, {"Content-Type": "application/json"})
    wait_until(lambda: admission(server)["samples"] > 0, "the request admitted", pause_s=0.05)
    conn.close()
    wait_until(lambda: admission(server)["samples"] == 0, "the request given up", pause_s=0.2)
    assert admission(server)["cancelled"] >= 30  # 6 slots x at most 3 floors each: most never ran
    metrics = requests.get(server.url + "/metrics", timeout=30).text
    assert 'scorer_unscored_total{reason="cancelled",service="code"}' in metrics


@pytest.mark.timing
def test_a_client_that_hangs_up_has_its_running_samples_stopped(server: Server) -> None:
    """A request of 7 spinners (stdin and call-based), all running, then the connection closed:
    within a second or so they are stopped, their slots free and nothing of them left on the
    host, and the next client's request is graded at once."""
    spinners = [f"```python\n{SPIN}\n```"] * 4 + ["```python\ndef f(x):\n    while True:\n        pass\n```"] * 3
    calls = {"fn_name": "f", "inputs": [[i] for i in range(10)], "outputs": list(range(10))}
    body = json.dumps({"query": spinners, "prompts": [""] * 7, "labels": [LABEL] * 4 + [calls] * 3})
    cancelled = admission(server)["cancelled"]
    stopped_s = seconds_running_after_a_hang_up(server, "/reward/score", body, running=7)
    assert stopped_s < within(2.0), f"the spinners ran {stopped_s:.1f} s after their client hung up"
    wait_until(lambda: admission(server)["samples"] == 0, "the request given up", pause_s=0.05)
    assert admission(server)["cancelled"] - cancelled == 7
    started = time.monotonic()
    body = json.dumps({"query": [f"```python\n{APLUSB}\n```"], "prompts": [""], "labels": [LABEL]})
    status, answer = post(server.url, "/reward/score", body, "127.0.0.2")
    assert status == 200 and answer["rewards"] == [1.0], answer
    assert time.monotonic() - started < within(3.0)


@pytest.mark.timing
def test_a_run_code_client_that_hangs_up_has_its_run_stopped(server: Server) -> None:
    """verl's ``/run_code`` of a looper with a long time limit, the connection closed once it
    runs: the run is stopped within a second or so, nothing of it left on the host."""
    run = json.dumps({"code": SPIN, "language": "python", "stdin": "", "compile_timeout": 5, "run_timeout": 60})
    stopped_s = seconds_running_after_a_hang_up(server, "/run_code", run, running=1)
    assert stopped_s < within(2.0), f"the looper ran {stopped_s:.1f} s after its client hung up"


def seconds_running_after_a_hang_up(server: Server, path: str, body: str, running: int) -> float:
    """POST ``body``, close the connection once ``running`` slots run its work, and return how
    long anything of it stayed on the host after that."""
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=180)
    conn.request("POST", path, body, {"Content-Type": "application/json"})
    wait_until(lambda: busy_slots(server) >= running, f"{running} slots running", pause_s=0.05)
    conn.close()
    hung_up = time.monotonic()
    wait_until(lambda: not sandbox_processes(sandbox_uids(server)), "its work stopped", pause_s=0.05)
    return time.monotonic() - hung_up


def test_1024_concurrent_requests_are_each_answered_graded_or_told_when_to_retry(server: Server) -> None:
    """What waits is bounded by the request threads (1024 for the code service) and the deadline:
    every request is graded or refused at once with Retry-After, none is left hanging."""
    body = json.dumps({"query": [f"```python\n{APLUSB}\n```"], "prompts": [""], "labels": [LABEL]})

    def send(_: int) -> tuple[int, str | None, list]:
        answer = requests.post(server.url + "/reward/score", data=body, timeout=180)
        return answer.status_code, answer.headers.get("Retry-After"), answer.json().get("rewards", [])

    with ThreadPoolExecutor(1024) as pool:
        answers = list(pool.map(send, range(1024)))
    graded = [rewards for status, _, rewards in answers if status == 200]
    refused = [retry for status, retry, _ in answers if status == 503]
    assert len(graded) + len(refused) == 1024, sorted({status for status, _, _ in answers})
    assert graded and graded == [[1.0]] * len(graded)
    assert all(retry is not None and int(retry) >= 1 for retry in refused)


def admission(server: Server) -> dict:
    return requests.get(server.url + "/info", timeout=30).json()["model"]["admission"]


@pytest.fixture
def fresh_server(tmp_path: Path) -> Iterator[Server]:
    """A node that has measured nothing yet: what it learns from spinners would refuse what follows."""
    with gunicorn_server("code", ENV, log_dir=tmp_path, cpus=CPUS) as srv:
        yield srv


def test_a_run_that_cannot_be_made_in_time_is_a_504_before_verls_read_timeout(server: Server) -> None:
    """verl reads a ``/run_code`` answer for compile_timeout + run_timeout + 10 s (12 s here):
    with the 7 slots its client may hold taken by sleepers for 10 s, the run is a 504 (which verl
    retries) before then, not an answer after verl gave up."""
    sleeper = json.dumps({"code": "import time\ntime.sleep(100)", "language": "python", "run_timeout": 10})
    sleepers = [threading.Thread(target=post, args=(server.url, "/run_code", sleeper, "127.0.0.4")) for _ in range(7)]
    for thread in sleepers:
        thread.start()
    try:
        wait_until(lambda: busy_slots(server) >= 7, "the sleepers running", pause_s=0.05)
        run = json.dumps({"code": APLUSB, "language": "python", "stdin": "2 3", "compile_timeout": 1, "run_timeout": 1})
        started = time.monotonic()
        status, _ = post(server.url, "/run_code", run, "127.0.0.4")
        seconds = time.monotonic() - started
    finally:
        for thread in sleepers:
            thread.join()
    assert status == 504 and seconds < 12, (status, seconds)


def test_a_burst_of_spinners_scores_zero_with_no_nan(fresh_server: Server) -> None:
    """Each spinner spends its plan and gets its own verdict, 0: never a NaN it chose."""
    rewards = burst(fresh_server.url, [SPIN] * BURST)
    assert rewards == [0.0] * BURST, sorted(map(str, rewards))[:20]


def test_spinners_mixed_with_correct_samples_never_cost_the_correct_ones_a_zero(fresh_server: Server) -> None:
    rewards = burst(fresh_server.url, [SPIN, APLUSB] * (BURST // 2))
    spinners, correct = rewards[::2], rewards[1::2]
    assert spinners == [0.0] * (BURST // 2)
    no_verdict = [r for r in correct if r is None or math.isnan(r)]
    assert [r for r in correct if r is not None and not math.isnan(r)] == [1.0] * (len(correct) - len(no_verdict))
    assert len(no_verdict) <= BURST // 32, f"{len(no_verdict)} correct samples without a verdict"


def test_a_heavier_correct_burst_is_never_cut_at_a_plan_made_before_its_rate_was_known(fresh_server: Server) -> None:
    """64 one-sample requests of a correct program whose tests cost about 0.15 s of CPU each,
    on a node whose rate was measured on quicker ones: the first wave's plans are made at that
    rate; a sample cut at one is run once more at what the node has learned since. Without the
    re-run, 5 of 64 got a false 0.9 here."""
    heavy = APLUSB.replace("print(", "sum(i * i for i in range(1_500_000))\nprint(")
    rewards = burst(fresh_server.url, [heavy] * 64)
    assert rewards == [1.0] * 64, sorted(map(str, rewards))
