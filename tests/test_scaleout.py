"""Two OCR nodes behind the shipped nginx configuration: one node dies under load and comes back;
every request still gets its right score."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from deploy.render_nginx import node_address, render, write_prefix
from testing.server import free_port, gunicorn_server
from tests.stream import RequestStream

# Debian puts nginx in /usr/sbin, outside a normal user's PATH. Missing, it is a failure, not a
# skip: `bash run.sh test` installs it.
NGINX = shutil.which("nginx", path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")

# Not-ready nodes answer 503 at once (instead of holding the request while the model loads), so
# nginx moves on; that is the setting docs/deployment.md gives for nodes behind a balancer.
NODE_ENV = {"SCORER_READY_WAIT_S": "0"}


@dataclass
class Balancer:
    url: str
    access_log: Path

    def attempts(self) -> list[tuple[int, list[str], list[str]]]:
        """(final status, upstream addresses tried, their statuses) per logged request."""
        rows = []
        for line in self.access_log.read_text().splitlines():
            match = re.search(r'" (\d{3}) .* upstream=(.*) upstream_status=(.*) urt=', line)
            if match:
                rows.append((int(match.group(1)), match.group(2).split(", "), match.group(3).split(", ")))
        return rows


@contextlib.contextmanager
def nginx(nodes: list[str], prefix: Path) -> Iterator[Balancer]:
    """nginx from the shipped template in the foreground, its logs and pid under ``prefix``."""
    assert NGINX, "nginx is not installed: `bash run.sh system-packages test` installs it"
    port = free_port()
    write_prefix(prefix, render(nodes, listen=f"127.0.0.1:{port}", fail_timeout="3s"))
    process = subprocess.Popen(
        [NGINX, "-p", str(prefix), "-c", "nginx.conf", "-e", "logs/error.log", "-g", "daemon off;"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                if requests.get(url + "/nginx-health", timeout=1).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"nginx did not start:\n{(prefix / 'logs' / 'error.log').read_text()}")
            time.sleep(0.1)
        yield Balancer(url, prefix / "logs" / "access.log")
    finally:
        process.terminate()
        process.wait(10)


def test_render_refuses_bad_addresses_and_fills_every_placeholder() -> None:
    text = render(["http://10.0.0.1:18082/", "gpu2:18082"])
    assert "server 10.0.0.1:18082 max_fails=3" in text and "server gpu2:18082 " in text
    assert "proxy_next_upstream_tries 2;" in text
    assert "@" not in text.replace("$remote_addr", "")
    with pytest.raises(ValueError):
        node_address("gpu2")
    with pytest.raises(ValueError):
        render([])


def test_node_killed_and_restarted_under_load_loses_no_sample(tmp_path, capsys) -> None:
    logs = tmp_path / "logs"
    with contextlib.ExitStack() as stack:
        first = stack.enter_context(gunicorn_server("ocr", NODE_ENV, log_dir=logs))
        second = stack.enter_context(gunicorn_server("ocr", NODE_ENV, log_dir=logs))
        balancer = stack.enter_context(nginx([f"127.0.0.1:{first.port}", f"127.0.0.1:{second.port}"], tmp_path / "lb"))
        with RequestStream(balancer.url, threads=6, max_requests=400, max_seconds=150) as stream:
            stream.wait_answered_since(0, 12, timeout=60)
            os.killpg(second.process.pid, signal.SIGKILL)  # the whole node: master and workers
            second.process.wait()
            killed = time.monotonic()
            stream.wait_answered_since(killed, 12, timeout=60)
            stack.enter_context(gunicorn_server("ocr", NODE_ENV, log_dir=logs, port=second.port))
            back = time.monotonic()
            stream.wait_answered_since(back, 24, timeout=60)
        failures = stream.failures()
        attempts = balancer.attempts()

    by_second = [
        status
        for _, addresses, statuses in attempts
        for address, status in zip(addresses, statuses)
        if address.endswith(f":{second.port}") and status == "200"
    ]
    retried = sum(len(statuses) > 1 for _, _, statuses in attempts)
    with capsys.disabled():
        print(
            f"\n[scale-out] {len(stream.outcomes)} requests, {len(failures)} failed, {retried} retried by nginx "
            f"on the other node, {len(by_second)} answered by the killed-and-restarted node"
        )
    assert not failures, failures[:10]
    assert len(stream.outcomes) >= 48
    assert retried >= 1, "the killed node's requests should have been retried elsewhere"
    assert by_second, "the restarted node should be back in rotation"
