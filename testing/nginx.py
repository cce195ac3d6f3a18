"""The shipped nginx configuration (deploy/) in front of the tests' nodes, and what its access
log says about each request's attempts."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import requests

from deploy.render_nginx import render, write_prefix
from testing.server import free_port

# Debian puts nginx in /usr/sbin, outside a normal user's PATH. Missing, it is a failure, not a
# skip: `bash run.sh test` installs it.
NGINX = shutil.which("nginx", path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")


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
