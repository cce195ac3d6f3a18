"""Two OCR nodes behind the shipped nginx configuration: one node dies under load and comes back;
every request still gets its right score."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest

from deploy.render_nginx import node_address, render
from testing.nginx import nginx
from testing.server import gunicorn_server
from testing.stream import RequestStream

# Not-ready nodes answer 503 at once (instead of holding the request while the model loads), so
# nginx moves on; that is the setting docs/deployment.md gives for nodes behind a balancer.
NODE_ENV = {"SCORER_READY_WAIT_S": "0"}


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
        with RequestStream(balancer.url, threads=6) as stream:
            stream.wait_answered_since(0, 12)
            os.killpg(second.process.pid, signal.SIGKILL)  # the whole node: master and workers
            second.process.wait()
            killed = time.monotonic()
            stream.wait_answered_since(killed, 12)
            stack.enter_context(gunicorn_server("ocr", NODE_ENV, log_dir=logs, port=second.port))
            back = time.monotonic()
            stream.wait_answered_since(back, 24)
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
