"""The HTTP front bench (bench/http/front.py) runs end to end at small sizes, the OCR service served
both ways (the shipped worker; nginx in front of gunicorn's stock gthread worker), and prints its
table with a row for every defence, so the command in bench/http/README.md stays true. Its
figures are not asserted: only what either way must get right (both score alike, the probes and
the requests in flight of the stop answered 200, the same token rule)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SMALL = {
    "--rounds": "1",
    "--requests": "4",
    "--slow-heads": "20",
    "--slow-bodies": "4",
    "--unauth-mib": "8",
    "--unauth-clients": "3",
    "--buffer-clients": "3",
    "--buffer-mib": "4",
    "--head-timeout": "2",
    "--body-timeout": "4",
    "--linger-s": "5",
}
ROWS = (
    "throughput",
    "slow clients: /health latency",
    "slow clients: a scoring request's latency",
    "slow clients: partial heads' answers",
    "slow clients: bodies at 1 byte/s",
    "token rule",
    "401 before the body: one unauthenticated upload",
    "401 before the body: many at once",
    "buffered bytes across connections",
    "body timeout: whole body or per read",
    "graceful stop: a new connection",
    "graceful stop: requests in flight",
    "client identity: REMOTE_ADDR the app sees",
    "client identity: clients.py's client",
    "arrival stamp",
)


def test_front_bench_prints_a_row_per_defence(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    out = tmp_path / "front.json"
    command = [sys.executable, "-m", "bench.http.front", *(x for pair in SMALL.items() for x in pair)]
    run = subprocess.run([*command, "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    table = [line for line in run.stdout.splitlines() if line.startswith("| ")]
    assert [line.split(" | ")[0].removeprefix("| ") for line in table[1:]] == list(ROWS)
    report = json.loads(out.read_text())
    for way in ("shipped", "fronted"):
        assert report[way]["slow"]["health"]["status"] == 200
        assert report[way]["slow"]["scoring"]["status"] == 200
        assert report[way]["stop"]["in_flight"] == {"200": 4}
        assert report[way]["token_rule"]["none"] == 401
    # nginx's rendered token check refuses what the worker refuses, and lets through what it lets through.
    assert report["fronted"]["token_rule"] == report["shipped"]["token_rule"]
