"""The code verifier against a running gunicorn server: every test format, OpenRLHF-shaped
requests, hostile programs, and the grading rules under load."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import requests

from services.code.environments import load
from tests.server import Server, gunicorn_server

SECRET = f"s3cr3t-{uuid.uuid4().hex}"
UID_RANGE = range(61000, 61000 + 64 * 64)  # per slot: a candidate uid and a tests uid
ENV = {
    "SCORER_CODE_INFRA_FAILURE_SCORE": "nan",
    "SCORER_CODE_ENV": "coin_change",
    "SCORER_CODE_TEST_CPU_S": "1",
    "SCORER_CODE_TEST_WALL_S": "2",
    "SCORER_CODE_SAMPLE_WALL_S": "8",
    "SCORER_CODE_MEMORY_MB": "256",
    "SCORER_CODE_MAX_OUTPUT_BYTES": str(1 << 20),
    "SCORER_TEST_SECRET": SECRET,
}
REFERENCE = load("coin_change").reference


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    with gunicorn_server("code", ENV, threads=64, log_dir=tmp_path_factory.mktemp("logs")) as srv:
        yield srv


def sandbox_processes() -> list[str]:
    """Processes of any sandbox uid still on the host."""
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue
        uid = int(next(line for line in text.splitlines() if line.startswith("Uid:")).split()[1])
        if uid in UID_RANGE:
            found.append(f"{status.parent.name} uid={uid}")
    return found


def reward(url: str, body: dict, path: str = "/reward/score", status: int = 200) -> dict:
    response = requests.post(url + path, json=body, timeout=200)
    assert response.status_code == status, response.text[:500]
    return json.loads(response.text)


def grade(url: str, codes: list[str], label: dict | str) -> dict:
    fenced = [f"Here you go:\n```python\n{code}\n```<|im_end|>" for code in codes]
    return reward(url, {"outputs": fenced, "prompts": ["p"] * len(codes), "labels": [label] * len(codes)})


STDIN_CODES = {
    "passed": "a, b = map(int, input().split())\nprint(a + b)",
    "wrong_answer": "a, b = map(int, input().split())\nprint(a - b)",
    "runtime_error": "raise ValueError('boom')",
    "timeout": "import time\ntime.sleep(30)",
    "compile_error": "def broken(:\n    pass",
}
STDIN_LABELS = {
    "inputs/outputs": {"inputs": ["1 2\n", "5 5\n"], "outputs": ["3\n", "10"]},
    "tests": json.dumps({"tests": [{"input": "1 2\n", "output": "3"}, {"input": "5 5", "output": "10\n"}]}),
}


@pytest.mark.parametrize("label", STDIN_LABELS.values(), ids=STDIN_LABELS.keys())
def test_stdin_formats(server: Server, label) -> None:
    codes = {**STDIN_CODES, "timeout (spins)": "while True:\n    pass"}
    out = grade(server.url, list(codes.values()), label)
    assert out["rewards"] == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert out["error_types"] == [None, "wrong_answer", "runtime_error", "timeout", "compile_error", "timeout"]
    assert out["extra_logs"]["passed"] == [1.0, 0, 0, 0, 0, 0]


def test_call_format(server: Server) -> None:
    label = {"fn_name": "add", "inputs": [[1, 2], [[1], [2]]], "outputs": [3, [1, 2]]}
    codes = [
        "def add(a, b):\n    return a + b",
        "def add(a, b):\n    return b",
        "def add(a, b):\n    return 1 / 0",
        "def add(a, b):\n    import time; time.sleep(30)",
        "def add(a, b):\n    while True: pass",
        "class Solution:\n    def add(self, a, b):\n        return a + b",
    ]
    out = grade(server.url, codes, label)
    assert out["rewards"][:5] == [1.0, 0.0, 0.0, 0.0, 0.0] and out["rewards"][5] == 1.0
    assert out["error_types"][:5] == [None, "wrong_answer", "runtime_error", "timeout", "timeout"]
    assert out["extra_logs"]["pass_fraction"][1] == 0.0


def test_assert_format(server: Server) -> None:
    human_eval = {"test": "def check(candidate):\n    assert candidate(2) == 4\n", "entry_point": "double"}
    codes = [
        "def double(x):\n    return 2 * x",
        "def double(x):\n    return x",
        "def double(x):\n    return x.missing",
        "def double(x):\n    import time; time.sleep(30)",
        "def double(x):\n    while True: pass",
    ]
    out = grade(server.url, codes, human_eval)
    assert out["rewards"] == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert out["error_types"] == [None, "wrong_answer", "runtime_error", "timeout", "timeout"]
    mbpp = {"test": ["assert double(1) == 2", "assert double(3) == 6"]}
    assert grade(server.url, ["def double(x):\n    return 2 * x", "def double(x):\n    return 2"], mbpp)["rewards"] == [
        1.0,
        0.5,
    ]


def test_environment_labels(server: Server) -> None:
    for label in ({}, "", {"environment": "coin_change"}, json.dumps({"environment": "coin_change"})):
        assert grade(server.url, [REFERENCE], label)["rewards"] == [1.0]
    wrong = "def coin_change(coins, amount):\n    return amount // max(coins)"
    out = grade(server.url, [wrong], {})
    assert 0.0 < out["rewards"][0] < 1.0 and out["error_types"] == ["wrong_answer"]
    reward(server.url, {"outputs": [REFERENCE], "prompts": ["p"], "labels": [{"environment": "knapsack"}]}, status=422)


def test_openrlhf_query_with_chat_template_and_truncated_prompt(server: Server) -> None:
    prompt = "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\n" + "Solve it. " * 100
    prompt += "<|im_end|>\n<|im_start|>assistant\n"
    response = f"Sure.\n```python\n{REFERENCE}\n```<|im_end|><|endoftext|>"
    queries = [
        "<|endoftext|><|endoftext|>" + prompt + response,  # left padding, special tokens
        prompt[600:] + response,  # prompt cut from the front
        "unrelated text " + response,  # prompt not found: never scored as text
    ]
    out = reward(server.url, {"query": queries, "prompts": [prompt] * 3, "labels": [{}] * 3})
    assert out["rewards"][:2] == [1.0, 1.0] and out["scores"][:2] == [1.0, 1.0]
    assert out["rewards"][2] != out["rewards"][2]  # NaN, sent as the JSON constant
    assert out["error_types"][2] == "prompt_not_found"
    for values in out["extra_logs"].values():
        assert len(values) == 3


def test_openrlhf_shapes(server: Server) -> None:
    empty = reward(server.url, {"query": [], "prompts": [], "labels": []}, path="/get_reward")
    assert empty["rewards"] == [] and empty["error_types"] == []
    raw = requests.post(
        server.url + "/reward/score", json={"query": ["x"], "prompts": ["not in the query"], "labels": [{}]}
    )
    assert "NaN" in raw.text
    label = {"inputs": ["3\n"], "outputs": ["6"]}
    labels = [label if i % 2 else json.dumps(label) for i in range(1024)]
    out = reward(server.url, {"outputs": ["print(int(input()) * 2)"] * 1024, "prompts": ["p"] * 1024, "labels": labels})
    assert out["rewards"] == [1.0] * 1024
    core = requests.post(
        server.url + "/", json={"responses": ["print(6)"], "prompts": ["p"], "labels": [label], "metadata": {"x": 1}}
    ).json()
    assert core["scores"] == [1.0] and core["error_types"] == [None]


@pytest.mark.parametrize(
    "body",
    [
        {"outputs": ["x"] * 1025, "prompts": ["p"] * 1025, "labels": [{}] * 1025},
        {"outputs": ["x" * 2_000_001], "prompts": ["p"], "labels": [{}]},
        {"outputs": ["x"], "labels": [{}]},
        {"outputs": ["x", "y"], "prompts": ["p"], "labels": [{}]},
        {"outputs": ["x"], "prompts": ["p"], "labels": [{"what": 1}]},
        {"prompts": ["p"], "labels": [{}]},
    ],
    ids=["1025 samples", "long text", "no prompts", "lengths differ", "unknown label", "no responses"],
)
def test_malformed_requests_are_422(server: Server, body) -> None:
    reward(server.url, body, status=422)


@pytest.mark.parametrize("raw", [b"{bad json", b"[1, 2]", b"", b"\x80\x04garbage"])
def test_undecodable_bodies_are_422(server: Server, raw: bytes) -> None:
    response = requests.post(server.url + "/reward/score", data=raw, headers={"Content-Type": "application/json"})
    assert response.status_code == 422
    assert response.json()["error"]


def listen() -> socket.socket:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.5)
    return listener


HOSTILE = {
    "infinite loop": "while True:\n    pass",
    "sleep past the deadline": "import time\ntime.sleep(3600)",
    "fork bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
    "memory bomb": "chunks = []\nwhile True:\n    chunks.append(bytearray(50 << 20))",
    "socket": (
        "import socket\ns = socket.socket()\ns.settimeout(2)\ns.connect(('127.0.0.1', PORT))\n"
        "s.sendall(b'hello')\nprint('connected')"
    ),
    "read secret": (
        "import glob, os\nfound = any('s3cr3t-' in v for v in os.environ.values())\n"
        "for path in glob.glob('/proc/*/environ'):\n    try:\n"
        "        found = found or b's3cr3t-' in open(path, 'rb').read()\n    except OSError:\n        pass\n"
        "print('found' if found else 'not found')"
    ),
    "write outside": (
        "import os\nwrote = False\nfor path in TARGETS:\n    try:\n        open(path, 'w').write('x')\n"
        "        wrote = True\n    except OSError:\n        pass\nprint('wrote' if wrote else 'refused')"
    ),
    "kill parent": (
        "import os, signal\nfor pid in (os.getppid(), 1, -1):\n    try:\n        os.kill(pid, signal.SIGKILL)\n"
        "    except OSError:\n        pass\nprint('done')"
    ),
    "print gigabytes": "import sys\nwhile True:\n    sys.stdout.write('x' * (1 << 20))",
}
EXPECTED = {"socket": "connected", "read secret": "found", "write outside": "wrote"}


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_programs_score_zero_and_leave_nothing(server: Server, name: str) -> None:
    listener = listen()
    marker = f"pwned-{uuid.uuid4().hex}"
    targets = [f"/tmp/{marker}", f"/var/tmp/{marker}", f"/dev/shm/{marker}", str(Path.cwd() / marker), f"/{marker}"]
    code = HOSTILE[name].replace("PORT", str(listener.getsockname()[1])).replace("TARGETS", repr(targets))
    started = time.monotonic()
    out = grade(server.url, [code], {"inputs": [""], "outputs": [EXPECTED.get(name, "ok")]})
    assert out["rewards"] == [0.0], out
    assert time.monotonic() - started < 30
    with pytest.raises(TimeoutError):
        listener.accept()
    listener.close()
    assert not any(os.path.exists(path) for path in targets)
    assert requests.get(server.url + "/health", timeout=5).status_code == 200
    assert grade(server.url, [REFERENCE], {})["rewards"] == [1.0]
    deadline = time.monotonic() + 5
    while sandbox_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sandbox_processes() == []


def test_exit_before_the_asserts_and_forged_eq_fail(server: Server) -> None:
    label = {"test": "def check(candidate):\n    assert candidate(2) == 4\n", "entry_point": "double"}
    exits = ["import sys\nsys.exit(0)\ndef double(x):\n    return x", "import os\nos._exit(0)"]
    exits.append("def double(x):\n    import os; os._exit(0)")
    assert grade(server.url, exits, label)["rewards"] == [0.0, 0.0, 0.0]
    forged = [
        "class Any:\n    def __eq__(self, other):\n        return True\n"
        "def coin_change(coins, amount):\n    return Any()",
        "class Int(int):\n    def __eq__(self, other):\n        return True\n"
        "def coin_change(coins, amount):\n    return Int(987654321)",
    ]
    out = grade(server.url, forged, {})
    assert out["rewards"] == [0.0, 0.0]


def test_thousand_concurrent_one_sample_requests(server: Server) -> None:
    label = {"inputs": ["1"], "outputs": ["2"]}
    body = {"query": ["p```python\nprint(int(input()) + 1)\n```"], "prompts": ["p"], "labels": [label]}

    async def main() -> list[float]:
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=180)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

            async def one() -> float:
                async with session.post(server.url + "/reward/score", json=body) as response:
                    assert response.status == 200
                    return json.loads(await response.text())["rewards"][0]

            return await asyncio.gather(*(one() for _ in range(1000)))

    assert asyncio.run(main()) == [1.0] * 1000


def test_deadline_waits_without_a_slot_and_masks_what_never_ran(tmp_path) -> None:
    env = {**ENV, "SCORER_CODE_MAX_PARALLEL": "1", "SCORER_CODE_REQUEST_TIMEOUT_S": "3"}
    env["SCORER_CODE_TEST_WALL_S"] = "10"
    label = {"inputs": [""], "outputs": ["x"]}
    sleepers = {"outputs": ["import time\ntime.sleep(60)"] * 2, "prompts": ["p"] * 2, "labels": [label] * 2}
    with gunicorn_server("code", env, log_dir=tmp_path) as srv:
        started = time.monotonic()
        out = reward(srv.url, sleepers)
        assert time.monotonic() - started < 10
        # One ran until the deadline (judged: 0); the other never got the one slot (NaN).
        assert sorted(out["error_types"]) == ["sandbox_error", "timeout"]
        masked = out["error_types"].index("sandbox_error")
        assert out["rewards"][masked] != out["rewards"][masked]
        assert out["rewards"][1 - masked] == 0.0
        assert "without a verdict" in srv.logs()


def test_refuses_to_boot_without_infra_failure_score(tmp_path) -> None:
    env = {k: v for k, v in ENV.items() if k != "SCORER_CODE_INFRA_FAILURE_SCORE"}
    os.environ.pop("SCORER_CODE_INFRA_FAILURE_SCORE", None)
    with pytest.raises(RuntimeError, match="INFRA_FAILURE_SCORE"), gunicorn_server("code", env, log_dir=tmp_path):
        pass


def test_call_tests_share_a_process_but_fail_one_by_one(server: Server) -> None:
    label = {"fn_name": "f", "inputs": [[0], [1], [2], [3]], "outputs": [0, 1, 2, 3]}
    codes = [
        "def f(x):\n    if x == 1:\n        raise ValueError(x)\n    return x",
        "def f(x):\n    while x == 2:\n        pass\n    return x",
        "import os\ndef f(x):\n    if x == 0:\n        os._exit(0)\n    return x",
        "import os\nos.write(4, b'garbage\\n[\"result\", 1]\\n')\ndef f(x):\n    return x",
        "def f(x):\n    return bytearray(1 << 40) if x == 3 else x",
    ]
    out = grade(server.url, codes, label)
    # Writing into its own answer pipe spoils the program's own tests: never NaN.
    assert out["rewards"] == [0.75, 0.75, 0.75, 0.0, 0.75], out
    assert out["error_types"] == ["runtime_error", "timeout", "runtime_error", "runtime_error", "memory_limit"]


def test_openrlhf_requests_take_the_core_path(server: Server) -> None:
    """The OpenRLHF route counts its samples and requests in /metrics like the core route, and
    answers a malformed body with 422 in JSON."""

    def items_scored() -> float:
        text = requests.get(server.url + "/metrics", timeout=10).text
        line = next(row for row in text.splitlines() if row.startswith('scorer_items_total{service="code"}'))
        return float(line.split()[-1])

    before = items_scored()
    grade(server.url, [REFERENCE, REFERENCE], {})
    assert items_scored() == before + 2
    response = requests.post(server.url + "/get_reward", data=b"\x80not json", timeout=10)
    assert response.status_code == 422 and "error" in response.json()
    text = requests.get(server.url + "/metrics", timeout=10).text
    assert 'route="/get_reward",service="code",status="422"' in text
