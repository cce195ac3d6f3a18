# Over 400 lines: the code service's HTTP contract against the running server the tests share.
"""The code verifier against a running gunicorn server: every test format, OpenRLHF-shaped
requests, hostile programs, and the grading rules under load."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import requests

from services.code.environments import load
from services.code.sandbox.inside import LOADER
from testing.clock import wait_until
from testing.code import ENV, busy_slots, grade, reward, sandbox_processes, sandbox_uids
from testing.server import ROOT as REPOSITORY
from testing.server import Server, gunicorn_server
from testing.timing import within

REFERENCE = load("coin_change").reference


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    with gunicorn_server("code", ENV, threads=64, log_dir=tmp_path_factory.mktemp("logs")) as srv:
        yield srv


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
    assert out["extra_logs"]["prompt_not_found"] == [0.0, 0.0, 1.0]
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
        {"outputs": ["print(3)"], "prompts": ["p"], "labels": [{"inputs": ["1 \ud800"], "outputs": ["3"]}]},
        {"outputs": ["print(3)"], "prompts": ["p"], "labels": [{"tests": [{"input": "1", "output": "\udfff"}]}]},
    ],
    ids=[
        "1025 samples",
        "long text",
        "no prompts",
        "lengths differ",
        "unknown label",
        "no responses",
        "an input no bytes encode",
        "an output no bytes encode",
    ],
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
        "        wrote = wrote or not path.startswith(('/tmp/', '/dev/shm/'))\n    except OSError:\n        pass\n"
        "print('wrote' if wrote else 'refused')"
    ),
    "kill parent": (
        "import os, signal\nfor pid in (os.getppid(), 1, -1):\n    try:\n        os.kill(pid, signal.SIGKILL)\n"
        "    except OSError:\n        pass\nprint('done')"
    ),
    "print gigabytes": "import sys\nwhile True:\n    sys.stdout.write('x' * (1 << 20))",
}
EXPECTED = {"socket": "connected", "read secret": "found", "write outside": "wrote"}


@pytest.mark.timing
@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_programs_score_zero_and_leave_nothing(server: Server, name: str) -> None:
    listener = listen()
    marker = f"pwned-{uuid.uuid4().hex}"
    targets = [f"/tmp/{marker}", f"/var/tmp/{marker}", f"/dev/shm/{marker}", str(Path.cwd() / marker), f"/{marker}"]
    targets += [f"/usr/{marker}", f"/etc/{marker}", str(REPOSITORY / marker)]
    code = HOSTILE[name].replace("PORT", str(listener.getsockname()[1])).replace("TARGETS", repr(targets))
    started = time.monotonic()
    out = grade(server.url, [code], {"inputs": [""], "outputs": [EXPECTED.get(name, "ok")]})
    assert out["rewards"] == [0.0], out
    assert time.monotonic() - started < within(30.0)
    with pytest.raises(TimeoutError):
        listener.accept()
    listener.close()
    assert not any(os.path.exists(path) for path in targets)
    assert requests.get(server.url + "/health", timeout=5).status_code == 200
    assert grade(server.url, [REFERENCE], {})["rewards"] == [1.0]
    wait_until(lambda: sandbox_processes(sandbox_uids(server)) == [], "the sandboxes' processes gone", pause_s=0.1)


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


@pytest.mark.timing
def test_deadline_waits_without_a_slot_and_masks_what_never_ran(tmp_path) -> None:
    env = {**ENV, "SCORER_CODE_MAX_PARALLEL": "1", "SCORER_CODE_REQUEST_TIMEOUT_S": "3"}
    env["SCORER_CODE_TEST_WALL_S"] = "10"
    label = {"inputs": [""], "outputs": ["x"]}
    sleepers = {"outputs": ["import time\ntime.sleep(60)"] * 2, "prompts": ["p"] * 2, "labels": [label] * 2}
    with gunicorn_server("code", env, log_dir=tmp_path) as srv:
        started = time.monotonic()
        out = reward(srv.url, sleepers)
        assert time.monotonic() - started < within(10.0)  # the 3 s deadline, not the 60 s sleep
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


# -- what a program sees ----------------------------------------------------------------


def test_programs_cannot_read_the_checkout_home_or_data(server: Server) -> None:
    """A program that copies the environment's reference solution from the checkout scored
    1.0; now it sees only system dirs and the interpreter."""
    source = REPOSITORY / "services/code/environments/coin_change.py"
    cheat = f"namespace = {{}}\nexec(open({str(source)!r}).read(), namespace)\nexec(namespace['REFERENCE'])"
    assert grade(server.url, [cheat], {})["rewards"] == [0.0]
    places = [str(REPOSITORY), str(source), str(REPOSITORY.parent), "/root", "/home", "/var", "/opt", "/mnt", "/srv"]
    # Every file a program finds there, but for the interpreter's own prefix (under /root here).
    looker = (
        f"import os\nprefix = {os.path.realpath(sys.base_prefix)!r}\nseen = []\nfor place in {places!r}:\n"
        "    seen += [place] if os.path.isfile(place) else []\n    for root, dirs, files in os.walk(place):\n"
        "        if root == prefix or root.startswith(prefix + '/'):\n            dirs.clear()\n            continue\n"
        "        seen += [os.path.join(root, name) for name in files]\nprint(seen[:5] or 'nothing')"
    )
    out = grade(server.url, [looker], {"inputs": [""], "outputs": ["nothing"]})
    assert out["rewards"] == [1.0], out


HUMAN_EVAL_LIKE = {
    "hashlib": "import hashlib\ndef f(text):\n    return hashlib.md5(text.encode()).hexdigest()[:4]",
    "fractions": "from fractions import Fraction\ndef f(text):\n    return str(Fraction(2, 2)) + 'e63'",
    "decimal": "from decimal import Decimal\ndef f(text):\n    return str(Decimal('0.5') * 2)[:1] + 'e63'",
    "statistics": "import statistics\ndef f(text):\n    return str(int(statistics.mean([1, 1]))) + 'e63'",
    "datetime": "import datetime\ndef f(text):\n    return str(datetime.date(2001, 1, 1).day) + 'e63'",
    "copy": "import copy\ndef f(text):\n    return copy.deepcopy(['1e63'])[0]",
    "non-ASCII identifier": "def f(text):\n    résultat = '1e63'\n    return résultat",
}


def test_the_standard_library_imports_for_the_sandbox_uid(server: Server) -> None:
    """HumanEval/32, /50 and /162 failed: the sandbox uid could not read a Python under /root."""
    label = {"test": "def check(candidate):\n    assert candidate('hello') in ('5d41', '1e63')\n", "entry_point": "f"}
    out = grade(server.url, list(HUMAN_EVAL_LIKE.values()), label)
    assert out["error_types"] == [None] * len(HUMAN_EVAL_LIKE), dict(zip(HUMAN_EVAL_LIKE, out["error_types"]))


@pytest.mark.skipif(
    all(os.stat(parent).st_mode & 0o001 for parent in Path(os.path.realpath(sys.base_prefix)).parents),
    reason="this host's interpreter is readable by every uid anyway",
)
def test_refuses_to_start_when_a_sandbox_uid_cannot_import_the_standard_library(tmp_path) -> None:
    """Without bubblewrap's own view of the filesystem, a Python under a 0700 home directory
    cannot be read by the sandbox uid: the service says so and never becomes ready."""
    env = {**ENV, "SCORER_CODE_SANDBOX": "none", "SCORER_CODE_ALLOW_WEAK_SANDBOX": "none"}
    srv = Server("code", env, 1, None, tmp_path / "code.log")
    try:
        srv.wait_ready(timeout=60, require_ready=False)
        wait_until(lambda: "failed to start" in srv.logs(), "the sandbox's start refused", pause_s=0.1)
        assert "cannot import: " in srv.logs() and "hashlib" in srv.logs(), srv.logs()
        assert requests.get(srv.url + "/ready", timeout=5).status_code != 200
    finally:
        srv.stop()


# -- one sample cannot hurt the others or the node -----------------------------------------


def test_deep_nesting_on_the_result_fd_is_the_programs_own_verdict(server: Server) -> None:
    """Lines of 600 '[' made judging raise RecursionError (a 500 for the whole request); a line
    of 100,000 crashed the supervisor (sandbox_error: the infra score instead of 0)."""
    nests = ["import os\nos.write(3, (b'[' * 600 + b'\\n') * 10)\n", "import os\nos.write(3, b'[' * 100000 + b'\\n')\n"]
    stdin = [nest + "print(int(input()) * 2)" for nest in nests] + ["print(int(input()) * 2)"]
    out = grade(server.url, stdin, {"inputs": ["3\n"], "outputs": ["6"]})
    assert out["rewards"] == [0.0, 0.0, 1.0], out
    for label in ({"fn_name": "f", "inputs": [[1]], "outputs": [1]}, {"test": "assert f(1) == 1", "entry_point": "f"}):
        out = grade(
            server.url, [nest + "def f(x):\n    return x" for nest in nests] + ["def f(x):\n    return x"], label
        )
        assert all(r in (0.0, 1.0) for r in out["rewards"]) and out["rewards"][2] == 1.0, out  # never NaN


SHM = (
    "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.shmat.restype = ctypes.c_void_p\n"
    "libc.shmget.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_int]\n"
)


def test_sysv_shared_memory_is_bounded_and_dies_with_its_sample(server: Server) -> None:
    """A segment left by one sample held 2 GB until the zygote restarted."""
    leave = SHM + (
        "shmid = libc.shmget(0, 16 << 20, 0o1600)\naddr = libc.shmat(shmid, None, 0)\n"
        "ctypes.memset(addr, 1, 16 << 20)\nlibc.shmdt(ctypes.c_void_p(addr))\nprint('left' if shmid >= 0 else 'failed')"
    )
    assert grade(server.url, [leave], {"inputs": [""], "outputs": ["left"]})["rewards"] == [1.0]
    count = "print(len(open('/proc/sysvipc/shm').read().splitlines()) - 1)"
    assert grade(server.url, [count], {"inputs": [""], "outputs": ["0"]})["rewards"] == [1.0]
    huge = SHM + "print('refused' if libc.shmget(0, 1 << 30, 0o1600) < 0 else 'made')"
    assert grade(server.url, [huge], {"inputs": [""], "outputs": ["refused"]})["rewards"] == [1.0]


def test_tmp_is_private_and_size_limited(server: Server) -> None:
    """The sandbox's /tmp had no size limit: a sample held 1.5 GB of RAM there."""
    fill = (
        "import os\nwritten = 0\ntry:\n    for i in range(20):\n"
        "        with open(os.path.join(os.environ['TMPDIR'], f'f{i}'), 'wb') as out:\n"
        "            out.write(b'x' * (10 << 20))\n        written += 10\nexcept OSError:\n    pass\n"
        "print('limited' if written < 200 else 'unlimited')"
    )
    fresh = "import os\nopen('/tmp/mine', 'w').write('x')\nprint(os.listdir('/tmp'), len(os.listdir('/dev/shm')))"
    out = grade(server.url, [fill, fresh], {"inputs": [""], "outputs": ["limited"]})
    assert out["rewards"][0] == 1.0, out
    out = grade(server.url, [fill, fresh], {"inputs": [""], "outputs": ["['mine'] 1"]})
    assert out["rewards"][1] == 1.0, out


def test_stdout_past_what_comparison_needs_is_a_wrong_answer(server: Server) -> None:
    label = {"inputs": [""], "outputs": ["ok"]}
    codes = ["print('ok  ')\nprint()", "print('ok' + ' ' * 200000)\nprint('extra')", "print('ok' + ' ' * 200000)"]
    out = grade(server.url, codes, label)
    assert out["error_types"][:2] == [None, "wrong_answer"] and out["rewards"][:2] == [1.0, 0.0], out


def _tree(root: int) -> dict[int, tuple[int, int, str]]:
    """Processes under ``root``: pid -> (parent, uid, command line)."""
    processes = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
            status = (entry / "status").read_text()
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        uid = int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])
        processes[int(entry.name)] = (int(stat.rsplit(")", 1)[1].split()[1]), uid, cmdline)
    under, frontier = {}, {root}
    while frontier:
        frontier = {pid for pid, (parent, _, _) in processes.items() if parent in frontier and pid not in under}
        under.update({pid: processes[pid] for pid in frontier})
    return under


def _kb(pid: int, path: str, field: str) -> int:
    try:
        text = Path(f"/proc/{pid}/{path}").read_text()
    except OSError:
        return 0
    return int(next((line.split()[1] for line in text.splitlines() if line.startswith(field + ":")), 0))


def test_output_is_not_buffered_past_what_comparison_needs(tmp_path) -> None:
    """32 samples printing 16 MiB each grew the host by 7 GB: each supervisor kept all of it,
    and the worker received it all. What is kept is ``compared_output_bytes``; a call's answer
    is bounded the same way."""
    env = {**ENV, "SCORER_CODE_MAX_OUTPUT_BYTES": str(16 << 20), "SCORER_CODE_TEST_WALL_S": "4"}
    env["SCORER_CODE_COMPARED_OUTPUT_BYTES"] = str(1 << 20)
    printer = "import sys, time\nfor _ in range(15):\n    sys.stdout.write('x' * (1 << 20))\n"
    printer += "sys.stdout.flush()\ntime.sleep(2)"
    returner = "def f(x):\n    return 'x' * (15 << 20)"
    with gunicorn_server("code", env, threads=16, log_dir=tmp_path) as srv:
        (worker,) = srv.worker_pids()
        before = _kb(worker, "status", "VmHWM")
        peak = {"supervisor": 0}
        done = False

        def watch() -> None:
            while not done:
                for pid, (_, uid, cmdline) in _tree(worker).items():
                    if uid == 0 and LOADER in cmdline:
                        held = _kb(pid, "smaps_rollup", "Private_Dirty")
                        # A call-based sample's init becomes its candidate (the slot's uid): what it
                        # holds once it has is the program's, not a supervisor's.
                        if _kb(pid, "status", "Uid") == 0 and _kb(pid, "status", "Pid") == pid:  # still there
                            peak["supervisor"] = max(peak["supervisor"], held)
                time.sleep(0.1)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            out = grade(srv.url, [printer] * 8, {"inputs": [""], "outputs": ["x"]})
            calls = grade(srv.url, [returner] * 8, {"fn_name": "f", "inputs": [[1]], "outputs": ["x"]})
        finally:
            done = True
            watcher.join()
        assert out["error_types"] == ["wrong_answer"] * 8, out
        # Cut at what comparison needs, not read for seconds up to max_output_bytes.
        assert calls["error_types"] == ["output_limit"] * 8, calls
        grown = _kb(worker, "status", "VmHWM") - before
        # KiB: less than the 15 MiB each program printed, however the supervisor ran.
        assert peak["supervisor"] < 12 << 10 and grown < 64 << 10, (peak, grown)


def _zygote(root: int) -> int:
    """The zygote under gunicorn master ``root``: the root-owned process running the sandboxed zygote
    whose parent does not."""
    tree = _tree(root)
    return next(
        pid
        for pid, (parent, uid, cmdline) in tree.items()
        if uid == 0 and LOADER in cmdline and LOADER not in tree.get(parent, (0, 0, ""))[2]
    )


def test_killing_the_zygote_twice_loses_at_most_the_runs_in_flight(tmp_path) -> None:
    """Killed twice 1.3 s apart, 78 of 320 samples were lost: the threads that found it dead
    each restarted it, killing each other's new zygote (48 restarts in a second)."""
    with gunicorn_server("code", ENV, threads=8, log_dir=tmp_path) as srv:
        # 320 runs of 0.3 s on at most 31 slots take over 3 s: both kills land while runs go on.
        code = "import time\ntime.sleep(0.3)\nprint(int(input()) + 1)"
        body = {"outputs": [code] * 320, "prompts": ["p"] * 320, "labels": [{"inputs": ["1"], "outputs": ["2"]}] * 320}
        answer: dict = {}
        request = threading.Thread(target=lambda: answer.update(reward(srv.url, body)))
        request.start()
        wait_until(lambda: busy_slots(srv) > 0, "runs in flight")
        os.kill(_zygote(srv.process.pid), 9)
        time.sleep(1.3)
        assert request.is_alive(), "the request ended before the second kill: the test proves nothing"
        os.kill(_zygote(srv.process.pid), 9)
        request.join()
        lost = [r for r in answer["rewards"] if r != r]
        assert len(lost) <= 32 and all(r == 1.0 for r in answer["rewards"] if r == r), answer["error_types"]
        assert srv.log_path.read_text().count("zygote is gone; restarting") == 2  # once per death


@pytest.mark.timing
def test_a_big_slow_request_does_not_starve_small_ones(server: Server) -> None:
    """96 sleeping samples starved a request of 8 correct ones (NaN at 150 s) and a
    one-sample request waited 145 s. Slots go to the waiting clients in turn and one is kept
    from the big request's client, so another client's small ones finish before its first
    samples do."""
    sleeper = "import time\ntime.sleep(30)"
    slow = {"inputs": ["", "", ""], "outputs": ["x", "x", "x"]}  # 3 tests of 2 s: 6 s a sample
    add = {"inputs": ["1"], "outputs": ["2"]}
    correct = "print(int(input()) + 1)"
    answers: dict[str, tuple[float, dict]] = {}
    started = time.monotonic()

    def send(name: str, codes: list[str], label: dict, source: str = "") -> None:
        out = grade(server.url, codes, label, source)
        answers[name] = (time.monotonic() - started, out)

    big = threading.Thread(target=send, args=("big", [sleeper] * 96, slow))
    big.start()
    slots = len(sandbox_uids(server)) // 2
    wait_until(lambda: busy_slots(server) >= slots - 1, "the big request's samples in every slot but one")
    small = [
        threading.Thread(target=send, args=(name, [correct] * n, add, source))
        for name, n, source in (("eight", 8, "127.0.0.2"), ("one", 1, "127.0.0.3"))
    ]
    sent = time.monotonic() - started
    for thread in small:
        thread.start()
    for thread in (*small, big):
        thread.join()
    for name in ("eight", "one"):
        took, out = answers[name]
        assert out["rewards"] == [1.0] * len(out["rewards"]), (name, out)
        # The big request's first samples hold their slots 6 s, until 6 s after these were sent:
        # waiting for them is the failure, however slow the machine.
        assert took - sent < min(within(4.0), 5.0), (name, took - sent)


def test_programs_cannot_make_namespaces(server: Server) -> None:
    """Unprivileged, a user namespace gave a program mounts of its own: a tmpfs past its /tmp
    limit and its rlimits. Threads, fork and subprocess still work."""
    code = (
        "import ctypes, os, subprocess, threading\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "made = [flag for flag in (0x10000000, 0x00020000, 0x40000000) if libc.unshare(flag) == 0]\n"
        "done = []\nthread = threading.Thread(target=done.append, args=[1])\nthread.start()\nthread.join()\n"
        "echo = subprocess.run(['/usr/bin/echo', 'spawned'], capture_output=True, text=True).stdout.strip()\n"
        "print('made ' + str(made) if made else 'refused', done, echo)"
    )
    out = grade(server.url, [code], {"inputs": [""], "outputs": ["refused [1] spawned"]})
    assert out["rewards"] == [1.0], out


CANDIDATE_PROBE = (
    "import ctypes, os, threading\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "def probe():\n"
    "    made = [flag for flag in (0x10000000, 0x00020000, 0x40000000) if libc.unshare(flag) == 0]\n"
    "    done = []\n    thread = threading.Thread(target=done.append, args=[1])\n"
    "    thread.start()\n    thread.join()\n"
    "    try:\n        pid = os.fork()\n    except OSError:\n"
    "        return ['made ' + str(made) if made else 'refused', done, 'no fork']\n"
    "    if pid == 0:\n        os._exit(0)\n    return 'forked'\n"
)
EXPECTED_PROBE = ["refused", [1], "no fork"]


@pytest.mark.parametrize(
    "label",
    [
        {"fn_name": "probe", "inputs": [[]], "outputs": [EXPECTED_PROBE]},
        {"test": [f"assert probe() == {EXPECTED_PROBE!r}"]},
    ],
    ids=["call-based (the init become candidate)", "assert (a forked candidate)"],
)
def test_a_candidate_starts_threads_but_no_process_and_no_namespace(server: Server, label: dict) -> None:
    """A candidate's one seccomp filter (``confine.forbid_shared_kernel_state`` without new
    processes) refuses what its two did: namespaces, and any process but a thread."""
    out = grade(server.url, [CANDIDATE_PROBE], label)
    assert out["rewards"] == [1.0], out
