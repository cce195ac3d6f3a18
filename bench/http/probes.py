"""Raw-socket clients that measure a node's defences (slow heads, slow or unwanted bodies, a stop),
and a sampler of the node's memory and of the bytes nginx buffers on disk."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import percentile
from bench.http.nodes import Node
from testing.ocr import memory_kb
from testing.server import cpu_seconds as process_cpu_seconds

MIB = 1 << 20


def rss_bytes(pid: int) -> int:
    """Resident memory of one process (0 once it has gone, or is a zombie without any)."""
    with contextlib.suppress(OSError, StopIteration):
        return memory_kb(pid, "VmRSS") * 1024
    return 0


def disk_bytes(pids: list[int], path: Path | None) -> int:
    """Bytes allocated to the files under ``path`` that ``pids`` hold open: nginx unlinks a
    client body's temp file as soon as it has made it, so only its descriptor finds it."""
    total = 0
    for pid in pids if path else ():
        with contextlib.suppress(OSError):  # gone meanwhile
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):  # closed meanwhile
                    if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(str(path)):
                        total += os.stat(f"/proc/{pid}/fd/{fd}").st_blocks * 512
    return total


def cpu_seconds(pids: list[int]) -> float:
    return sum(process_cpu_seconds(pid) for pid in pids if os.path.exists(f"/proc/{pid}"))


@dataclass
class Sampler:
    """While running: the peaks of the resident memory of the node's gunicorn and nginx processes,
    of nginx's temp files, and the CPU seconds each side spent."""

    node: Node
    every_s: float = 0.05
    baseline: dict[str, int] = field(default_factory=dict)
    peak: dict[str, int] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)
    peak_disk: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def sample(self) -> None:
        for side, pids in self.node.processes().items():
            self.peak[side] = max(self.peak.get(side, 0), sum(rss_bytes(pid) for pid in pids))
            if side == "nginx":
                self.peak_disk = max(self.peak_disk, disk_bytes(pids, self.node.temp_path))

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()

    def __enter__(self) -> Sampler:
        processes = self.node.processes()
        self.baseline = {side: sum(rss_bytes(pid) for pid in pids) for side, pids in processes.items()}
        self.cpu = {side: -cpu_seconds(pids) for side, pids in processes.items()}
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()
        for side, pids in self.node.processes().items():
            self.cpu[side] += cpu_seconds(pids)

    def figures(self) -> dict[str, Any]:
        return {
            "rss_growth_mib": {side: (self.peak[side] - self.baseline[side]) / MIB for side in self.peak},
            "rss_peak_mib": sum(self.peak.values()) / MIB,
            "cpu_s": self.cpu,
            "disk_peak_mib": self.peak_disk / MIB,
        }


async def outcome(read: Awaitable[bytes], started: float, until: float) -> tuple[str, float]:
    """What a connection got and when (seconds from ``started``), from ``read`` (its first bytes):
    the answer's status, ``closed`` (no answer), ``reset``, or ``open`` still at ``until``."""
    try:
        data = await asyncio.wait_for(read, max(0.0, until - time.monotonic()))
    except TimeoutError:
        return "open", time.monotonic() - started
    except ConnectionError:
        return "reset", time.monotonic() - started
    if not data:
        return "closed", time.monotonic() - started
    return data.split()[1].decode(), time.monotonic() - started


def head(length: int, headers: dict[str, str]) -> bytes:
    lines = [f"POST / HTTP/1.1\r\nHost: bench\r\nContent-Length: {length}\r\n"]
    lines += [f"{name}: {value}\r\n" for name, value in headers.items()]
    return ("".join(lines) + "\r\n").encode()


async def partial_head(node: Node, observe_s: float, opened: list[int]) -> tuple[str, float]:
    """A connection that sends part of a request's head, then nothing."""
    started = time.monotonic()
    reader, writer = await asyncio.open_connection(node.host, node.port)
    writer.write(b"POST / HTTP/1.1\r\nHost: bench\r\n")
    await writer.drain()
    opened.append(1)
    try:
        return await outcome(reader.readline(), started, started + observe_s)
    finally:
        writer.close()


async def upload(
    node: Node, length: int, headers: dict[str, str], chunk: int, interval_s: float, observe_s: float
) -> dict[str, Any]:
    """A whole head, then a ``length``-byte body ``chunk`` bytes every ``interval_s`` (0: as fast
    as the node takes it), sent on after the answer until the node closes or ``observe_s`` ends.
    Sent bytes are those the kernel took: its socket buffers (a few MiB on loopback) count."""
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    until = started + observe_s
    sock = socket.socket()
    sock.setblocking(False)
    await loop.sock_connect(sock, (node.host, node.port))
    await loop.sock_sendall(sock, head(length, headers))
    sent = 0
    piece = b"x" * chunk

    async def send() -> str:
        nonlocal sent
        try:
            while sent < length:
                if interval_s:
                    await asyncio.sleep(interval_s)
                await loop.sock_sendall(sock, piece[: length - sent])
                sent += min(chunk, length - sent)
        except ConnectionError:
            return "reset"
        return "all sent"

    sender = asyncio.create_task(send())
    # Read apart from the sending: a failed send (the node closed with the client's bytes
    # unread) does not hide an answer that had arrived.
    status, answered_s = await outcome(loop.sock_recv(sock, 4096), started, until)
    sent_at_answer = sent
    done, _ = await asyncio.wait({sender}, timeout=max(0.0, until - time.monotonic()))
    ended = sender.result() if done else "still sending"
    sender.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await sender
    sock.close()
    return {
        "status": status,
        "answered_s": answered_s,
        "sent_at_answer_mib": sent_at_answer / MIB,
        "sent_mib": sent / MIB,
        "send_ended": ended,
        "held_s": time.monotonic() - started,
    }


def tally(outcomes: list[tuple[str, float]]) -> dict[str, Any]:
    """How many got each answer, and when (median and largest seconds from their connection)."""
    whens = [when for _, when in outcomes]
    return {
        "answers": dict(Counter(status for status, _ in outcomes)),
        "median_s": percentile(whens, 50) if whens else 0.0,
        "max_s": max(whens, default=0.0),
    }


async def timed_request(
    session: aiohttp.ClientSession, method: str, url: str, body: bytes | None, headers: dict[str, str]
) -> tuple[int, float]:
    started = time.monotonic()
    async with session.request(method, url, data=body, headers=headers) as response:
        await response.read()
        return response.status, time.monotonic() - started


async def slow_clients(
    node: Node, heads: int, bodies: int, observe_s: float, probe_body: bytes, headers: dict[str, str], trickle_s: float
) -> dict[str, Any]:
    """``heads`` partial heads and ``bodies`` bodies at 1 byte/s held open while ``/health`` and
    one scoring request are timed; and one body at 1 byte per ``trickle_s``: what each got, when."""
    opened: list[int] = []
    held = asyncio.gather(
        asyncio.gather(*(partial_head(node, observe_s, opened) for _ in range(heads))),
        asyncio.gather(*(upload(node, 10_000, headers, 1, 1.0, observe_s) for _ in range(bodies))),
        upload(node, 10_000, headers, 1, trickle_s, max(observe_s, 3 * trickle_s)),
    )
    deadline = time.monotonic() + 30
    while len(opened) < heads and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(force_close=True)) as session:
        health = await timed_request(session, "GET", node.url + "/health", None, {})
        scored = await timed_request(session, "POST", node.url + "/", probe_body, headers)
    partial, trickled, slowest = await held
    body_outcomes = [(one["status"], one["answered_s"]) for one in trickled]
    return {
        "opened_before_probes": len(opened),
        "health": {"status": health[0], "latency_s": health[1]},
        "scoring": {"status": scored[0], "latency_s": scored[1]},
        "partial_heads": tally(partial),
        "trickled_bodies": tally(body_outcomes),
        "one_byte_per_trickle": slowest,
    }


async def many_uploads(node: Node, count: int, length: int, headers: dict[str, str], **pace: Any) -> dict[str, Any]:
    """``count`` uploads at once, with the node's memory and disk peaks meanwhile."""
    with Sampler(node) as sampler:
        results = await asyncio.gather(*(upload(node, length, headers, **pace) for _ in range(count)))
    return {
        "answers": dict(Counter(one["status"] for one in results)),
        "answered_s_max": max(one["answered_s"] for one in results),
        "sent_at_answer_mib": sum(one["sent_at_answer_mib"] for one in results),
        "sent_mib": sum(one["sent_mib"] for one in results),
        "send_ended": dict(Counter(one["send_ended"] for one in results)),
        **sampler.figures(),
    }


async def new_connection(node: Node, timeout_s: float) -> str:
    """A fresh ``GET /health``: ``refused``, or what the connection got."""
    started = time.monotonic()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(node.host, node.port), timeout_s)
    except ConnectionRefusedError:
        return "refused"
    except TimeoutError:
        return "connect timed out"
    writer.write(b"GET /health HTTP/1.1\r\nHost: bench\r\n\r\n")
    try:
        return (await outcome(reader.readline(), started, started + timeout_s))[0]
    finally:
        writer.close()


async def until_refused(node: Node, every_s: float, for_s: float) -> dict[str, Any]:
    """New connections every ``every_s`` from now: how long until the first is refused, and what
    the ones before it got."""
    started = time.monotonic()
    before: list[str] = []
    while time.monotonic() - started < for_s:
        got = await new_connection(node, 10.0)
        if got == "refused":
            return {"refused_after_s": time.monotonic() - started, "before": dict(Counter(before))}
        before.append(got)
        await asyncio.sleep(every_s)
    return {"refused_after_s": None, "before": dict(Counter(before))}


async def graceful_stop(node: Node, bodies: list[bytes], headers: dict[str, str], settle_s: float) -> dict[str, Any]:
    """Requests in flight, then the stop signal: how soon new connections are refused, whether
    the requests in flight finish, and how long the whole stop takes."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:

        async def one(body: bytes) -> str:
            try:
                return str((await timed_request(session, "POST", node.url + "/", body, headers))[0])
            except aiohttp.ClientError as exc:
                return type(exc).__name__

        in_flight = [asyncio.create_task(one(body)) for body in bodies]
        await asyncio.sleep(settle_s)
        started = time.monotonic()
        await asyncio.to_thread(node.begin_stop)
        refusal = await until_refused(node, 0.01, 10.0)
        finished = await asyncio.gather(*in_flight)
        finished_s = time.monotonic() - started
    await asyncio.to_thread(node.finish_stop)
    return {
        **refusal,
        "in_flight": dict(Counter(finished)),
        "in_flight_done_s": finished_s,
        "stopped_s": time.monotonic() - started,
    }
