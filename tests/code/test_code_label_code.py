"""A label's code against a running server: its size is capped (dict labels as string labels),
it compiles where it stalls no other request, and what the worker keeps of it is bounded."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from testing.clock import wait_until
from testing.server import Server, gunicorn_server
from testing.timing import within

ENV = {
    "SCORER_CODE_INFRA_FAILURE_SCORE": "nan",
    "SCORER_CODE_TEST_CPU_S": "2",
    "SCORER_CODE_TEST_WALL_S": "4",
    "SCORER_CODE_MEMORY_MB": "256",
    "SCORER_CODE_LABEL_CACHE_MB": "1",
}
PROGRAM = "```python\ndef f(x):\n    return x\n```"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with gunicorn_server("code", ENV, threads=16, log_dir=tmp_path_factory.mktemp("logs")) as srv:
        yield srv


def post(url: str, labels: list, outputs: list[str] | None = None) -> requests.Response:
    outputs = outputs or [PROGRAM] * len(labels)
    body = {"outputs": outputs, "prompts": ["p"] * len(labels), "labels": labels}
    return requests.post(url + "/reward/score", json=body, timeout=300)


def test_a_dict_labels_code_counts_under_the_text_cap(tmp_path: Path) -> None:
    """A dict label is counted as its JSON, as a string label is: over the text cap, 422."""
    env = {**ENV, "SCORER_CODE_MAX_TEXT_CHARS": "20000"}
    label = {"test": "assert f(1) == 1\n" + "# padding\n" * 3000, "entry_point": "f"}
    with gunicorn_server("code", env, threads=8, log_dir=tmp_path) as srv:
        as_dict = post(srv.url, [label])
        as_string = post(srv.url, [json.dumps(label)])
    assert as_string.status_code == 422, as_string.text[:300]
    assert as_dict.status_code == 422 and "limit is 20000" in as_dict.text, as_dict.text[:300]


@pytest.mark.timing
def test_label_code_past_its_cap_is_413(server: Server) -> None:
    """1.5 MB of asserts is under the text cap but over the code cap: 413 before compiling it
    (on the core route; OpenRLHF's, which retries what is not a 422, answers 422)."""
    code = "".join(f"assert f({i}) == {i}\n" for i in range(60_000))
    assert 1_000_000 < len(code) < 2_000_000
    body = {"responses": [PROGRAM], "prompts": ["p"], "labels": [{"test": code, "entry_point": "f"}]}
    started = time.monotonic()
    response = requests.post(server.url + "/score", json=body, timeout=300)
    assert response.status_code == 413 and "MAX_LABEL_CODE_CHARS" in response.text, response.text[:300]
    assert time.monotonic() - started < within(10.0)  # compiling it takes longer
    assert post(server.url, [{"test": code, "entry_point": "f"}]).status_code == 422


def test_a_large_label_compiling_stalls_no_other_request(server: Server) -> None:
    """While a label of just under 1 MB of code compiles (seconds of CPU), another client's
    one-sample A+B request is answered: compiling holds neither the interpreter nor a request's
    thread."""
    code = "f(1)\n" + "a\n" * 490_000  # the most compile time per character we found
    assert len(code) < 1_000_000
    big: dict[str, int] = {}
    thread = threading.Thread(
        target=lambda: big.update(status=post(server.url, [{"test": code, "entry_point": "f"}]).status_code)
    )
    thread.start()
    wait_until(lambda: info(server.url)["label_cache"]["compiling"] > 0 or not thread.is_alive(), "a compile")
    assert thread.is_alive(), "the large label never began to compile"
    small = post(
        server.url,
        [{"inputs": ["1 2\n"], "outputs": ["3\n"]}],
        ["```python\nprint(sum(map(int, input().split())))\n```"],
    )
    still_compiling = info(server.url)["label_cache"]["compiling"] > 0
    thread.join()
    assert small.status_code == 200 and small.json()["rewards"] == [1.0], small.text[:300]
    assert big["status"] == 200, big
    assert still_compiling, "the A+B request was answered only once the large label had compiled"


def info(url: str) -> dict:
    return requests.get(url + "/info", timeout=60).json()["model"]


def test_what_the_worker_keeps_of_distinct_labels_is_bounded(server: Server) -> None:
    """96 distinct labels of 0.9 MB each (86 MB in all): the worker keeps a digest and a verdict
    of each, within LABEL_CACHE_MB (1 MiB here), never the code."""
    for batch in range(12):
        labels = [
            {"test": f"assert f({batch * 8 + n}) == {batch * 8 + n}\n" + "#" * 900_000, "entry_point": "f"}
            for n in range(8)
        ]
        response = post(server.url, labels)
        assert response.status_code == 200 and response.json()["rewards"] == [1.0] * 8, response.text[:300]
    cache = requests.get(server.url + "/info", timeout=30).json()["model"]["label_cache"]
    assert cache["entries"] >= 96 and cache["bytes"] <= cache["max_bytes"] == 1 << 20, cache
