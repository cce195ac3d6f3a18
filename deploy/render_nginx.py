"""Render the nginx configuration that fronts several scorer nodes (deploy/nginx.conf.template).

    python -m deploy.render_nginx --listen 0.0.0.0:18000 --prefix /srv/scorer-lb gpu1:18082 gpu2:18082
    nginx -p /srv/scorer-lb -c nginx.conf -e logs/error.log

Trainers then take ``http://<balancer>:18000`` as their one scorer URL.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

TEMPLATE = Path(__file__).resolve().parent / "nginx.conf.template"
ADDRESS = re.compile(r"^(?:https?://)?(\[[0-9a-fA-F:]+\]|[A-Za-z0-9.-]+):(\d{1,5})/?$")


def node_address(text: str) -> str:
    """``host:port`` (a trailing slash or an http:// prefix is dropped); anything else is refused."""
    match = ADDRESS.match(text.strip())
    if not match or not 0 < int(match.group(2)) < 65536:
        raise ValueError(f"node address {text!r} is not host:port")
    return f"{match.group(1)}:{match.group(2)}"


def render(
    nodes: list[str],
    listen: str = "0.0.0.0:18000",
    max_fails: int = 3,
    fail_timeout: str = "10s",
    tries: int | None = None,
    read_timeout: str = "120s",
    max_body: str = "256m",
) -> str:
    """The configuration text for ``nodes``; ``tries`` defaults to one attempt per node, at most 3."""
    if not nodes:
        raise ValueError("need at least one node address")
    servers = "\n".join(
        f"        server {node_address(node)} max_fails={max_fails} fail_timeout={fail_timeout};" for node in nodes
    )
    values = {
        "SERVERS": servers,
        "LISTEN": listen,
        "MAX_FAILS": str(max_fails),
        "FAIL_TIMEOUT": fail_timeout,
        "TRIES": str(tries or min(len(nodes), 3)),
        "READ_TIMEOUT": read_timeout,
        "MAX_BODY": max_body,
    }
    text = TEMPLATE.read_text()
    for key, value in values.items():
        text = text.replace(f"@{key}@", value)
    return text


def write_prefix(prefix: Path, text: str) -> Path:
    """Write ``prefix``/nginx.conf and the logs/ and tmp/ folders it refers to."""
    for sub in ("logs", "tmp"):
        (prefix / sub).mkdir(parents=True, exist_ok=True)
    conf = prefix / "nginx.conf"
    conf.write_text(text)
    return conf


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m deploy.render_nginx", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("nodes", nargs="+", help="scorer nodes as host:port")
    parser.add_argument("--listen", default="0.0.0.0:18000", help="address nginx listens on")
    parser.add_argument("--prefix", type=Path, help="write <prefix>/nginx.conf (else print the config)")
    parser.add_argument("--max-fails", type=int, default=3)
    parser.add_argument("--fail-timeout", default="10s")
    parser.add_argument("--tries", type=int, help="attempts per request (default: nodes, at most 3)")
    parser.add_argument("--read-timeout", default="120s")
    parser.add_argument("--max-body", default="256m")
    args = parser.parse_args(argv)
    try:
        text = render(
            args.nodes, args.listen, args.max_fails, args.fail_timeout, args.tries, args.read_timeout, args.max_body
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.prefix is None:
        sys.stdout.write(text)
        return 0
    prefix = args.prefix.resolve()
    conf = write_prefix(prefix, text)
    print(f"wrote {conf}; run: nginx -p {prefix} -c nginx.conf -e logs/error.log -g 'daemon off;'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
