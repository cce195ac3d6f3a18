"""The two ways the bench serves one service: as shipped (gunicorn.conf.py's ScorerWorker) and
gunicorn's stock gthread worker on a private unix socket behind a node-local nginx whose
configuration is rendered from the same core settings (``front_config``)."""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from common.configuration.config import from_env
from common.configuration.settings import CoreSettings
from testing.nginx import NGINX
from testing.server import Server, child_pids, free_port, gunicorn_server

# What gunicorn writes per request (its access log, a documented interface): the peer the app
# sees as REMOTE_ADDR, the headers a proxy set, and nginx's arrival stamp.
ACCESS_FORMAT = "%(h)s|%({x-forwarded-for}i)s|%({x-real-ip}i)s|%({x-scorer-arrival}i)s|%(r)s"
# nginx's own memory for a request body: past this it goes to a file under client_body_temp_path.
BODY_BUFFER = "1m"


@dataclass
class Node:
    """A running node: the TCP address clients use, its processes, what it logs and buffers."""

    name: str
    host: str
    port: int
    server: Server
    access_log: Path
    temp_path: Path | None = None
    nginx: subprocess.Popen | None = None
    nginx_command: list[str] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def processes(self) -> dict[str, list[int]]:
        """gunicorn's master and workers; nginx's master and workers when it is in front."""
        roots = {"gunicorn": self.server.process.pid, **({"nginx": self.nginx.pid} if self.nginx else {})}
        return {side: [root, *child_pids(root)] for side, root in roots.items()}

    def begin_stop(self) -> None:
        """The stop signal: SIGTERM to gunicorn (A); ``nginx -s quit`` (B), gunicorn after it."""
        if self.nginx_command is None:
            self.server.process.send_signal(signal.SIGTERM)
        else:
            subprocess.run([*self.nginx_command, "-s", "quit"], check=True, capture_output=True)

    def finish_stop(self) -> None:
        """Wait for nginx to have drained and exited, then stop gunicorn the same way."""
        if self.nginx is not None:
            self.nginx.wait(timeout=60)
        self.server.stop()


def large_body_limit(large_bodies: int) -> tuple[str, str]:
    """The http and server lines that let at most ``large_bodies`` requests with a large body
    (a declared length of 8 digits or more, about 10 MB; or a chunked one) be read or served at
    once, the others answered 503 before their body is read: nginx's temp files and the
    worker's copies then stay under ``large_bodies`` x the body limit. None when 0."""
    if not large_bodies:
        return "", ""
    http = """map "$http_transfer_encoding:$http_content_length" $scorer_large_body {
        default large;
        ":" "";
        "~^:[0-9]{1,7}$" "";
    }
    limit_conn_zone $scorer_large_body zone=scorer_large:1m;"""
    return http, f"limit_conn scorer_large {large_bodies};\n        limit_conn_status 503;"


def front_config(settings: CoreSettings, listen: str, socket_path: Path, user: str, large_bodies: int = 0) -> str:
    """nginx in front of one node, its limits and token check from ``settings``."""
    large_http, large_server = large_body_limit(large_bodies)
    authorized = "default 1;"
    if settings.auth_token:
        # The scheme name case-insensitive, the token not (common/server/auth.py's rule).
        authorized = f'default 0;\n        "~^(?i:bearer) +{re.escape(settings.auth_token)} *$" 1;'
    return f"""# nginx in front of one scorer node (bench/http/nodes.py renders it from the core settings).
user {user};
worker_processes 1;
worker_rlimit_nofile 20000;
pid logs/nginx.pid;
error_log logs/error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log logs/access.log;
    client_body_temp_path tmp/client_body;
    proxy_temp_path tmp/proxy;
    fastcgi_temp_path tmp/fastcgi;
    uwsgi_temp_path tmp/uwsgi;
    scgi_temp_path tmp/scgi;
    # The token, then whether the request may go without it: a GET or HEAD with no body (probes).
    map $http_authorization $scorer_token_ok {{
        {authorized}
    }}
    map "$scorer_token_ok:$request_method:$http_content_length$http_transfer_encoding" $scorer_refuse {{
        default 1;
        "~^1:" 0;
        "~^0:(GET|HEAD):$" 0;
    }}
    {large_http}
    upstream scorer {{
        server unix:{socket_path};
        keepalive 32;
    }}
    server {{
        listen {listen} backlog=4096;
        client_header_timeout {settings.head_timeout_s:g}s;
        client_body_timeout {settings.body_timeout_s:g}s;
        client_max_body_size {settings.max_body_bytes};
        client_body_buffer_size {BODY_BUFFER};
        {large_server}
        # The server's rewrite phase runs when the head is whole, before the body is read.
        if ($scorer_refuse) {{
            return 401 '{{"error": "missing or wrong bearer token"}}';
        }}
        default_type application/json;
        location / {{
            proxy_pass http://scorer;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
            proxy_set_header X-Real-IP $remote_addr;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            # When the request is whole and sent upstream, and how long since its first byte.
            proxy_set_header X-Scorer-Arrival "$msec $request_time";
            proxy_request_buffering on;
            proxy_buffering on;
            proxy_send_timeout {settings.request_timeout_s + 10:g}s;
            proxy_read_timeout {settings.request_timeout_s + 10:g}s;
        }}
    }}
}}
"""


@contextlib.contextmanager
def shipped_node(service: str, env: dict[str, str], log_dir: Path) -> Iterator[Node]:
    """(A): gunicorn with gunicorn.conf.py, as run.sh starts it."""
    access_log = log_dir / "shipped-access.log"
    gunicorn_args = f"--access-logfile {access_log} --access-logformat '{ACCESS_FORMAT}'"
    with gunicorn_server(service, {**env, "GUNICORN_CMD_ARGS": gunicorn_args}, log_dir=log_dir) as server:
        yield Node("shipped", "127.0.0.1", server.port, server, access_log)


@contextlib.contextmanager
def fronted_node(service: str, env: dict[str, str], log_dir: Path, large_bodies: int = 0) -> Iterator[Node]:
    """(B): gunicorn's stock gthread worker (gunicorn.conf.py otherwise: threads, hooks) on a unix
    socket in a private 0700 folder, behind nginx listening on TCP; stopped nginx first."""
    assert NGINX, "nginx is not installed (/usr/sbin/nginx)"
    private = Path(tempfile.mkdtemp(prefix="scorer-front-"))
    os.chmod(private, 0o700)
    prefix = log_dir / "nginx"
    for sub in ("logs", "tmp"):
        (prefix / sub).mkdir(parents=True, exist_ok=True)
    port = free_port()
    settings = from_env(CoreSettings, environ={**os.environ, **env})
    user = pwd.getpwuid(os.geteuid()).pw_name
    config = front_config(settings, f"127.0.0.1:{port}", private / "gunicorn.sock", user, large_bodies)
    (prefix / "nginx.conf").write_text(config)
    command = [NGINX, "-p", str(prefix), "-c", "nginx.conf", "-e", "logs/error.log"]
    nginx = subprocess.Popen([*command, "-g", "daemon off;"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    access_log = log_dir / "fronted-access.log"
    gunicorn_args = (
        f"-k gthread --bind unix:{private}/gunicorn.sock "
        f"--access-logfile {access_log} --access-logformat '{ACCESS_FORMAT}'"
    )
    try:
        # gunicorn_server waits on its URL: nginx's port, so the node is ready through nginx.
        with gunicorn_server(
            service, {**env, "GUNICORN_CMD_ARGS": gunicorn_args}, log_dir=log_dir, port=port
        ) as server:
            yield Node("fronted", "127.0.0.1", port, server, access_log, prefix / "tmp" / "client_body", nginx, command)
    finally:
        if nginx.poll() is None:
            nginx.send_signal(signal.SIGQUIT)
            nginx.wait(timeout=60)
        shutil.rmtree(private, ignore_errors=True)


def last_access(node: Node, after: float = 5.0) -> list[str]:
    """The fields of the last line of the node's gunicorn access log (written within ``after`` s)."""
    deadline = time.monotonic() + after
    while time.monotonic() < deadline:
        lines = node.access_log.read_text().splitlines() if node.access_log.exists() else []
        if lines:
            return lines[-1].split("|")
        time.sleep(0.1)
    return []
