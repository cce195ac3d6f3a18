"""Isolation per sample, tried as a GRPO group would: 8 samples of one prompt per request, over
several rounds, each program trying to reach the others (at once or later) or the node.

Each program prints what it managed; the label expects the output of an isolated one, so a
sample scores 1.0 only when the channel is closed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import requests

from tests.code.test_code_server import ENV
from tests.server import Server, gunicorn_server

GROUP = 8
ROUNDS = 3


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    env = {**ENV, "SCORER_CODE_TEST_WALL_S": "5", "SCORER_CODE_SAMPLE_WALL_S": "20"}
    with gunicorn_server("code", env, threads=64, log_dir=tmp_path_factory.mktemp("logs")) as srv:
        yield srv


def group(url: str, codes: list[str], expected: str, stdin: str = "") -> dict:
    """One request of ``codes`` (a GRPO group), each graded on one stdin test."""
    label = {"inputs": [stdin], "outputs": [expected]}
    fenced = [f"```python\n{code}\n```" for code in codes]
    body = {"outputs": fenced, "prompts": ["p"] * len(codes), "labels": [label] * len(codes)}
    response = requests.post(url + "/reward/score", json=body, timeout=200)
    assert response.status_code == 200, response.text[:500]
    return json.loads(response.text)


def rounds(url: str, code: str, expected: str) -> None:
    """``ROUNDS`` requests of ``GROUP`` copies of ``code``: every sample must print ``expected``."""
    for round_ in range(ROUNDS):
        out = group(url, [code] * GROUP, expected)
        assert out["rewards"] == [1.0] * GROUP, (round_, out["error_types"])


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


def test_samples_graded_at_once_share_no_network(server: Server) -> None:
    rounds(server.url, NETWORK_MEETING, "alone")


LOOPBACK = """
import socket
server = socket.create_server(("127.0.0.1", 0))
client = socket.create_connection(server.getsockname())
peer, _ = server.accept()
client.sendall(b"ping")
print(peer.recv(4).decode())
"""


def test_each_sample_still_has_its_own_loopback(server: Server) -> None:
    assert group(server.url, [LOOPBACK], "ping")["rewards"] == [1.0]


# The kernel's per-uid key store: a key one sample adds, a later one finds (the slot's uid is
# the same), and setperm could open it to every uid.
KEYS = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
ADD_KEY, REQUEST_KEY, KEYCTL = {"x86_64": (248, 249, 250), "aarch64": (217, 218, 219)}[os.uname().machine]
USER_KEYRING = -4
found = libc.syscall(REQUEST_KEY, b"user", b"grpo-answers", None, 0)
if found >= 0:
    print("found the answers another sample left")
else:
    added = libc.syscall(ADD_KEY, b"user", b"grpo-answers", b"42", 2, USER_KEYRING)
    keyring = libc.syscall(KEYCTL, 0, USER_KEYRING, 0)  # KEYCTL_GET_KEYRING_ID
    print("refused" if added < 0 and keyring < 0 else f"stored key {added} in keyring {keyring}")
"""


def test_the_kernel_key_store_is_refused(server: Server) -> None:
    rounds(server.url, KEYS, "refused")


# Other samples' processes (and their CPU times) in /proc.
PROC = """
import os, time
me = os.getuid()
others = set()
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/status") as status:
            uid = int(next(line for line in status if line.startswith("Uid:")).split()[1])
    except (OSError, StopIteration):
        continue
    if uid != me:
        others.add(pid)
time.sleep(0.3)
print("own" if len(others) <= 1 else f"sees {len(others)} other processes")
"""


def test_proc_shows_only_the_samples_own_processes(server: Server) -> None:
    rounds(server.url, PROC, "own")


# Something left for a later sample of the same slot: a process in the background (killed at
# the end today), a file under /tmp or /dev/shm, a POSIX message queue, a SysV segment.
LEFTOVERS = """
import ctypes, os, sys
found = []
for path in ("/tmp/grpo-left", "/dev/shm/grpo-left-shm"):
    if os.path.exists(path):
        found.append(path)
    else:
        with open(path, "w") as f:
            f.write("answers")
libc = ctypes.CDLL(None, use_errno=True)
libc.mq_open.restype = ctypes.c_int
queue = libc.mq_open(b"/grpo-left", os.O_RDONLY)
if queue >= 0:
    found.append("mqueue")
else:
    libc.mq_open(b"/grpo-left", os.O_CREAT | os.O_RDONLY, 0o600, None)
segment = libc.shmget(0x6770, 4096, 0)
if segment >= 0:
    found.append("sysv")
else:
    libc.shmget(0x6770, 4096, 0o1600)
print("nothing left" if not found else "found " + ", ".join(found))
"""


def test_nothing_a_sample_leaves_reaches_a_later_one(server: Server) -> None:
    rounds(server.url, LEFTOVERS, "nothing left")
