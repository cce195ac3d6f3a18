"""The HTTP layer under gunicorn: several services on one host, slow and idle clients."""

from __future__ import annotations

import contextlib
from pathlib import Path

import requests

from tests.server import gunicorn_server

# The three services as ``bash run.sh`` starts them on one node (aesthetic without weights and
# code without a sandbox still serve /health).
NODE_SERVICES = {
    "ocr": {},
    "aesthetic": {"SCORER_AESTHETIC_CLIP": "/nonexistent", "SCORER_DEVICE": "cpu"},
    "code": {"SCORER_CODE_INFRA_FAILURE_SCORE": "nan"},
}


def control_sockets(home: Path) -> list[Path]:
    return sorted(path for path in home.rglob("*") if path.is_socket())


def test_the_services_of_one_node_do_not_share_a_control_socket(tmp_path, monkeypatch) -> None:
    """gunicorn 27 gives every master on a host the same control socket under ~/.gunicorn: the
    last one started takes it over and the first one stopped removes it for everyone."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    with contextlib.ExitStack() as stack:
        servers = {
            name: stack.enter_context(gunicorn_server(name, env, require_ready=False, log_dir=tmp_path))
            for name, env in NODE_SERVICES.items()
        }
        for server in servers.values():
            assert requests.get(server.url + "/health", timeout=10).status_code == 200
        shared = control_sockets(home)
        # Either none, or one of its own per master (then it must survive the others stopping).
        assert len(shared) in (0, len(servers)), f"control sockets {shared} for {len(servers)} masters"
        servers["ocr"].stop()
        assert len(control_sockets(home)) in (0, len(servers) - 1)
        for name in ("aesthetic", "code"):
            assert requests.get(servers[name].url + "/health", timeout=10).status_code == 200
            assert "Control server error" not in servers[name].logs()
