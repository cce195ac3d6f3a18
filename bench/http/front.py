"""The HTTP layer two ways, side by side in one run: is a node-local nginx in front of gunicorn's
stock gthread worker as good a front as the shipped worker (common/server/worker.py)?

  (A) shipped  gunicorn with gunicorn.conf.py (ScorerWorker), as run.sh starts it
  (B) fronted  gunicorn's stock gthread worker (same threads) on a unix socket in a private 0700
               folder, behind nginx on TCP, its configuration rendered from the same settings

    .venv/bin/python -m bench.http.front --rounds 3

One table, a row per defence: throughput, slow clients, an unauthenticated body, buffered bytes
across connections, the body timeout's meaning, a graceful stop, the client's identity and the
arrival stamp (bench/http/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pickle
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import burst, results_dir, stop_on_sigterm  # noqa: E402
from bench.http.nodes import Node, fronted_node, last_access, shipped_node  # noqa: E402
from bench.http.probes import MIB, graceful_stop, head, many_uploads, outcome, slow_clients  # noqa: E402
from common.limits.clients import client_of, trusted_networks  # noqa: E402
from testing.images import ocr_prompts, quoted, render_text  # noqa: E402

TOKEN = "bench-token"
AUTHORIZED = {"Authorization": f"Bearer {TOKEN}"}
FORGED = "203.0.113.7"


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--service", default="ocr", help="the service both ways serve (its offline defaults)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=64, help="concurrent one-image scoring requests")
    parser.add_argument("--head-timeout", type=float, default=5.0, help="SCORER_HEAD_TIMEOUT_S of both")
    parser.add_argument("--body-timeout", type=float, default=10.0, help="SCORER_BODY_TIMEOUT_S of both")
    parser.add_argument("--slow-heads", type=int, default=1000, help="connections sending a partial head")
    parser.add_argument("--slow-bodies", type=int, default=100, help="connections sending a body at 1 byte/s")
    parser.add_argument("--unauth-mib", type=int, default=200, help="the body sent without the token")
    parser.add_argument("--unauth-clients", type=int, default=50)
    parser.add_argument("--buffer-clients", type=int, default=20)
    parser.add_argument("--buffer-mib", type=int, default=64)
    parser.add_argument(
        "--large-bodies", type=int, default=0, help="(B): at most this many bodies over ~10 MB at once (0: no limit)"
    )
    parser.add_argument("--linger-s", type=float, default=35.0, help="how long a refused upload keeps sending")
    parser.add_argument("--out", type=Path, default=results_dir() / "http_front.json")
    return parser.parse_args()


def scoring_bodies(count: int) -> list[bytes]:
    """flow_grpo's traffic: one pickled 512 x 512 image of an OCR prompt's quoted text a request."""
    prompts = ocr_prompts(count)
    return [pickle.dumps({"images": [render_text(quoted(p))], "prompts": [p], "metadata": {}}) for p in prompts]


def throughput(nodes: list[Node], bodies: list[bytes], rounds: int) -> dict[str, Any]:
    """images/s of each, one after the other in each round; the scores of both must be equal."""
    for node in nodes:
        burst(node.url + "/", bodies[:4], AUTHORIZED)
    per_round: list[dict[str, float]] = []
    for round_no in range(rounds):
        rates, scores = {}, {}
        for node in nodes if round_no % 2 == 0 else nodes[::-1]:  # neither always goes first
            measured = burst(node.url + "/", bodies, AUTHORIZED)
            assert measured["statuses"] == {200: len(bodies)}, (node.name, measured["statuses"])
            rates[node.name] = measured["per_s"]
            scores[node.name] = [pickle.loads(answer)["scores"] for answer in measured["answers"]]
        assert scores["shipped"] == scores["fronted"], "the two ways scored the same images differently"
        per_round.append(rates)
        print(f"round {round_no + 1}: " + ", ".join(f"{k} {v:.2f} images/s" for k, v in rates.items()), flush=True)
    return {
        "rounds": per_round,
        "median": {node.name: statistics.median(r[node.name] for r in per_round) for node in nodes},
        "ratio": statistics.median(r["fronted"] / r["shipped"] for r in per_round),
    }


async def identity(node: Node, body: bytes, pause_s: float) -> dict[str, Any]:
    """A request whose head is sent in two parts ``pause_s`` apart, carrying forged forwarding
    headers: the peer the app sees, the client clients.py would count it to, and the arrival
    stamp nginx forwarded against when the first byte was sent."""
    before = len(node.access_log.read_text().splitlines()) if node.access_log.exists() else 0
    forged = {"X-Forwarded-For": FORGED, "X-Real-IP": FORGED, "Connection": "close", **AUTHORIZED}
    request = head(len(body), forged) + body
    first_byte = time.time()
    started = time.monotonic()
    reader, writer = await asyncio.open_connection(node.host, node.port)
    writer.write(request[:20])
    await writer.drain()
    await asyncio.sleep(pause_s)
    writer.write(request[20:])
    status, _ = await outcome(reader.readline(), started, started + 120)
    writer.close()
    deadline = time.monotonic() + 10
    while len(node.access_log.read_text().splitlines()) <= before and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    peer, forwarded, real_ip, arrival = last_access(node)[:4]
    environ = {"REMOTE_ADDR": peer, "HTTP_X_FORWARDED_FOR": "" if forwarded == "-" else forwarded}
    stamp = arrival.split() if arrival != "-" else []
    return {
        "status": status,
        "remote_addr": peer,
        "x_forwarded_for": forwarded,
        "x_real_ip": real_ip,
        "client_trusting_none": client_of(environ, ()),
        "client_trusting_loopback": client_of(environ, trusted_networks("127.0.0.1")),
        # nginx's $msec - $request_time: when its first byte came, against when it was sent.
        "arrival_error_ms": (float(stamp[0]) - float(stamp[1]) - first_byte) * 1000 if stamp else None,
    }


# The token rule's cases (common/server/auth.py): the scheme's case is free, the token's is not.
TOKEN_CASES = {
    "Bearer": {"Authorization": f"Bearer {TOKEN}"},
    "bearer": {"Authorization": f"bearer {TOKEN}"},
    "token's case": {"Authorization": f"Bearer {TOKEN.upper()}"},
    "longer": {"Authorization": f"Bearer {TOKEN}x"},
    "none": {},
}


def token_rule(node: Node) -> dict[str, int]:
    """The status of a (not pickled) body with each case, and of a GET with a body and no token:
    a 401 is the check refusing it, a 400 the app reading it."""
    statuses = {
        case: requests.post(node.url + "/", data=b"x", headers=h, timeout=60).status_code
        for case, h in TOKEN_CASES.items()
    }
    statuses["GET with a body"] = requests.get(node.url + "/health", data=b"x", timeout=60).status_code
    return statuses


def measure(node: Node, args: argparse.Namespace, bodies: list[bytes]) -> dict[str, Any]:
    """Every defence of one node, the graceful stop last (it stops the node)."""
    found: dict[str, Any] = {"identity": asyncio.run(identity(node, bodies[0], 1.0)), "token_rule": token_rule(node)}
    observe_s = max(args.head_timeout, args.body_timeout) + 5
    found["slow"] = asyncio.run(
        slow_clients(node, args.slow_heads, args.slow_bodies, observe_s, bodies[0], AUTHORIZED, args.body_timeout - 1)
    )
    fast = {"chunk": MIB, "interval_s": 0.0, "observe_s": args.linger_s}
    unauthenticated = {"Content-Type": "application/octet-stream"}
    found["unauth_one"] = asyncio.run(many_uploads(node, 1, args.unauth_mib * MIB, unauthenticated, **fast))
    found["unauth_many"] = asyncio.run(
        many_uploads(node, args.unauth_clients, args.unauth_mib * MIB, unauthenticated, **fast)
    )
    # Each body over half the body timeout: within it either way.
    paced = {"chunk": MIB, "interval_s": args.body_timeout / 2 / args.buffer_mib, "observe_s": 120.0}
    found["buffered"] = asyncio.run(
        many_uploads(node, args.buffer_clients, args.buffer_mib * MIB, {**AUTHORIZED, **unauthenticated}, **paced)
    )
    found["stop"] = asyncio.run(graceful_stop(node, bodies[:16], AUTHORIZED, 0.5))
    return found


def answers(tallied: dict[str, Any]) -> str:
    got = ", ".join(f"{count} {status}" for status, count in tallied["answers"].items())
    return f"{got}; median {tallied['median_s']:.1f} s, last {tallied['max_s']:.1f} s"


def uploads(found: dict[str, Any]) -> str:
    got = ", ".join(f"{count} {status}" for status, count in found["answers"].items())
    growth = ", ".join(f"{side} +{mib:.0f}" for side, mib in found["rss_growth_mib"].items())
    cpu = ", ".join(f"{side} {seconds:.2f}" for side, seconds in found["cpu_s"].items())
    return (
        f"{got} (last at {found['answered_s_max']:.1f} s); sent {found['sent_at_answer_mib']:.0f} MiB by the answers, "
        f"{found['sent_mib']:.0f} MiB in all; RSS MiB {growth}; disk {found['disk_peak_mib']:.0f} MiB; CPU s {cpu}"
    )


def held(found: dict[str, Any]) -> str:
    return f"{found['status']} at {found['answered_s']:.1f} s ({found['sent_mib'] * MIB:.0f} B sent)"


def refused(found: dict[str, Any]) -> str:
    if found["refused_after_s"] is None:
        return f"never refused in 10 s: {found['before']}"
    return f"refused after {found['refused_after_s'] * 1000:.0f} ms ({found['before'] or 'none'} before)"


def stopped(found: dict[str, Any]) -> str:
    return f"{found['in_flight']} by {found['in_flight_done_s']:.1f} s; stopped in {found['stopped_s']:.1f} s"


ROWS: list[tuple[str, Callable[[dict[str, Any]], str], str]] = [
    ("slow clients: /health latency", lambda f: f"{f['slow']['health']['latency_s']:.2f} s", "while all are held"),
    (
        "slow clients: a scoring request's latency",
        lambda f: f"{f['slow']['scoring']['latency_s']:.2f} s ({f['slow']['scoring']['status']})",
        "while all are held",
    ),
    ("slow clients: partial heads' answers", lambda f: answers(f["slow"]["partial_heads"]), "from the connection"),
    ("slow clients: bodies at 1 byte/s", lambda f: answers(f["slow"]["trickled_bodies"]), "from the connection"),
    (
        "token rule",
        lambda f: ", ".join(f"{case} {status}" for case, status in f["token_rule"].items()),
        "a body that is not a pickle (400 when the app reads it) with each Authorization",
    ),
    ("401 before the body: one unauthenticated upload", lambda f: uploads(f["unauth_one"]), "no token, token set"),
    ("401 before the body: many at once", lambda f: uploads(f["unauth_many"]), "no token, token set"),
    ("buffered bytes across connections", lambda f: uploads(f["buffered"]), "paced over half the body timeout"),
    (
        "body timeout: whole body or per read",
        lambda f: held(f["slow"]["one_byte_per_trickle"]),
        "1 byte per (body timeout - 1) s",
    ),
    (
        "graceful stop: a new connection",
        lambda f: refused(f["stop"]),
        "a new connection every 10 ms from the stop signal",
    ),
    (
        "graceful stop: requests in flight",
        lambda f: stopped(f["stop"]),
        "up to 16 scoring requests sent 0.5 s before",
    ),
    (
        "client identity: REMOTE_ADDR the app sees",
        lambda f: repr(f["identity"]["remote_addr"]),
        f"X-Forwarded-For: {FORGED} sent",
    ),
    (
        "client identity: clients.py's client",
        lambda f: f"{f['identity']['client_trusting_none']!r} / {f['identity']['client_trusting_loopback']!r}",
        "SCORER_TRUSTED_PROXIES empty / 127.0.0.1",
    ),
    (
        "arrival stamp",
        lambda f: (
            "in-process (ARRIVED_KEY: when whole)"
            if f["identity"]["arrival_error_ms"] is None
            else f"{f['identity']['arrival_error_ms']:+.0f} ms from the first byte"
        ),
        "nginx $msec - $request_time vs the first byte sent (head sent over 1 s)",
    ),
]


def table(report: dict[str, Any]) -> str:
    """One row per defence: (A), (B), what was measured."""
    rates = report["throughput"]["median"]
    lines = ["| defence | (A) shipped | (B) nginx + stock gthread | measurement |", "|---|---|---|---|"]
    config = report["config"]
    ratios = ", ".join(f"{r['fronted'] / r['shipped']:.2f}" for r in report["throughput"]["rounds"])
    lines.append(
        f"| throughput | {rates['shipped']:.2f} images/s | {rates['fronted']:.2f} images/s | B/A "
        f"{report['throughput']['ratio']:.3f} (per round {ratios}), {config['requests']} concurrent, medians of "
        f"{config['rounds']} |"
    )
    for name, cell, how in ROWS:
        lines.append(f"| {name} | {cell(report['shipped'])} | {cell(report['fronted'])} | {how} |")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> dict[str, Any]:
    env = {
        "SCORER_HEAD_TIMEOUT_S": str(args.head_timeout),
        "SCORER_BODY_TIMEOUT_S": str(args.body_timeout),
        "SCORER_AUTH_TOKEN": TOKEN,
    }
    bodies = scoring_bodies(args.requests)
    log_dir = results_dir() / "http_front"
    log_dir.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"config": {key: str(value) for key, value in vars(args).items()}}
    with (
        shipped_node(args.service, env, log_dir) as shipped,
        fronted_node(args.service, env, log_dir, args.large_bodies) as fronted,
    ):
        report["throughput"] = throughput([shipped, fronted], bodies, args.rounds)
        for node in (shipped, fronted):
            report[node.name] = measure(node, args, bodies)
            print(f"{node.name}: {json.dumps(report[node.name])}", flush=True)
    return report


def main() -> None:
    args = arguments()
    stop_on_sigterm()
    report = run(args)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print()
    print(table(report))


if __name__ == "__main__":
    main()
