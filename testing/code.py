"""What the code verifier's tests share: the settings of a server sized for them on a 2-core
node (Python, and the compiled languages'), the requests they send, and the isolation tests'
GRPO group (8 samples of one prompt, over 3 rounds) with a program that looks for the others;
which of a server's sandbox slots have processes in them."""

from __future__ import annotations

import http.client
import importlib.util
import json
import os
import re
import uuid
from pathlib import Path
from types import ModuleType

import pytest
import requests

from testing.server import Server

# A copy of verl's sandbox_fusion/utils.py (``run.sh test`` fetches it), for its own client.
VERL_CLIENT = "SCORER_TEST_VERL_SANDBOX_FUSION"
SECRET = f"s3cr3t-{uuid.uuid4().hex}"
ENV = {
    "SCORER_CODE_INFRA_FAILURE_SCORE": "nan",
    # Their requests are sized for the suites, not for a 2-core node at full limits (test_code_admission.py).
    "SCORER_CODE_ADMISSION": "off",
    "SCORER_CODE_ENV": "coin_change",
    "SCORER_CODE_TEST_CPU_S": "1",
    "SCORER_CODE_TEST_WALL_S": "2",
    "SCORER_CODE_SAMPLE_WALL_S": "8",
    "SCORER_CODE_MEMORY_MB": "256",
    "SCORER_CODE_MAX_OUTPUT_BYTES": str(1 << 20),
    "SCORER_TEST_SECRET": SECRET,
}
# Compiled languages: a compile takes seconds of a loaded CPU, a JVM's start a second.
LANGUAGES_ENV = {
    "SCORER_CODE_INFRA_FAILURE_SCORE": "nan",
    "SCORER_CODE_ADMISSION": "off",
    "SCORER_CODE_TEST_CPU_S": "2",
    "SCORER_CODE_TEST_WALL_S": "4",
    "SCORER_CODE_SAMPLE_WALL_S": "40",
    "SCORER_CODE_MEMORY_MB": "256",
    "SCORER_CODE_MAX_OUTPUT_BYTES": str(1 << 20),
    "SCORER_CODE_COMPILE_CPU_S": "15",
    "SCORER_CODE_COMPILE_WALL_S": "30",
    "SCORER_TEST_SECRET": SECRET,
}
# The isolation tests' server: a label may hold 4.8 MB of expected answers (test_code_call_relay),
# and a dict label counts as its JSON.
ISOLATION_ENV = {
    **ENV,
    "SCORER_CODE_TEST_WALL_S": "5",
    "SCORER_CODE_SAMPLE_WALL_S": "20",
    "SCORER_CODE_MAX_TEXT_CHARS": "8000000",
}
APLUSB = {"inputs": ["1 2\n", "100 -5\n"], "outputs": ["3\n", "95\n"]}
GROUP = 8
ROUNDS = 3

# Each copy holds one name in each namespace for a while: one that finds a name taken shares
# that namespace with another sample graded at once.
NETWORK_MEETING = """
import socket, time
held = []
taken = []
for family, address in ((socket.AF_UNIX, "\\0grpo-meeting-point"), (socket.AF_INET, ("127.0.0.1", 47113))):
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind(address)
        sock.listen(8)
        held.append(sock)
    except OSError as exc:
        taken.append(str(exc))
time.sleep(0.4)
print("alone" if not taken else "met another sample: " + "; ".join(taken))
"""


def reward(url: str, body: dict, path: str = "/reward/score", status: int = 200) -> dict:
    response = requests.post(url + path, json=body, timeout=200)
    assert response.status_code == status, response.text[:500]
    return json.loads(response.text)


def post_from(source: str, url: str, path: str, body: str) -> tuple[int, dict]:
    """POST a JSON ``body`` from the loopback address ``source``: another client of the node
    (``common.limits.clients``), whose requests take turns of their own."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=180, source_address=(source, 0))
    try:
        conn.request("POST", path, body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def grade(url: str, codes: list[str], label: dict | str, source: str = "") -> dict:
    """Python ``codes`` in an OpenRLHF-shaped request, each graded on ``label`` (sent from the
    loopback address ``source``, when given)."""
    fenced = [f"Here you go:\n```python\n{code}\n```<|im_end|>" for code in codes]
    body = {"outputs": fenced, "prompts": ["p"] * len(codes), "labels": [label] * len(codes)}
    if not source:
        return reward(url, body)
    status, answer = post_from(source, url, "/reward/score", json.dumps(body))
    assert status == 200, answer
    return answer


def grade_programs(url: str, programs: list[tuple[str, str]], label: dict | None = None, **body: object) -> dict:
    """One request: each (fence tag, source) a sample graded on ``label`` (A+B by default)."""
    fenced = [f"Here is my solution.\n```{tag}\n{code}\n```\n" for tag, code in programs]
    payload = {"outputs": fenced, "prompts": ["p"] * len(fenced), "labels": [label or APLUSB] * len(fenced), **body}
    response = requests.post(url + "/reward/score", json=payload, timeout=300)
    assert response.status_code == 200, response.text[:500]
    return response.json()


def sandbox_uids(srv: Server) -> range:
    """The uids of ``srv``'s slots (a candidate's and a tests' uid each), from its startup line:
    other servers on the host have others."""
    found = re.search(r"uids (\d+)-(\d+)", srv.log_path.read_text())
    assert found, srv.logs()
    first, last = int(found[1]), int(found[2])
    return range(first, last + 1 + (last + 1 - first))


def busy_slots(srv: Server) -> int:
    """Slots of ``srv`` with a process running in them (as its candidate's or its tests' uid)."""
    uids = sandbox_uids(srv)
    slots = len(uids) // 2
    return len({(int(entry.split("uid=")[1]) - uids.start) % slots for entry in sandbox_processes(uids)})


def sandbox_processes(uids: range) -> list[str]:
    """Processes of these sandbox uids still on the host."""
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue
        uid = int(next(line for line in text.splitlines() if line.startswith("Uid:")).split()[1])
        if uid in uids:
            found.append(f"{status.parent.name} uid={uid}")
    return found


def verl_client() -> ModuleType:
    """verl's ``sandbox_fusion/utils.py``, from the copy ``SCORER_TEST_VERL_SANDBOX_FUSION`` names."""
    path = os.environ.get(VERL_CLIENT)
    if not path:
        pytest.skip(f"{VERL_CLIENT} names no fetched copy of verl's sandbox_fusion/utils.py")
    spec = importlib.util.spec_from_file_location("verl_sandbox_fusion_utils", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
