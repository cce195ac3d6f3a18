"""Two nodes behind the shipped nginx configuration: one OCR node dies under load and comes back,
or one JPEG node is overloaded; every request still gets its right score."""

from __future__ import annotations

import base64
import contextlib
import os
import pickle
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import requests

from deploy.render_nginx import node_address, render
from testing.images import render_text
from testing.nginx import nginx
from testing.server import gunicorn_server, post, scores_of
from testing.stream import RequestStream

# Not-ready nodes refuse at once (instead of holding the request while the model loads), so
# nginx moves on; that is the setting docs/deployment.md gives for nodes behind a balancer.
NODE_ENV = {"SCORER_READY_WAIT_S": "0"}


def test_render_refuses_bad_addresses_and_fills_every_placeholder() -> None:
    text = render(["http://10.0.0.1:18082/", "gpu2:18082"])
    assert "server 10.0.0.1:18082 max_fails=3" in text and "server gpu2:18082 " in text
    assert "proxy_next_upstream_tries 2;" in text
    assert "proxy_next_upstream error timeout http_500 http_502 http_503 http_504 non_idempotent;" in text
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


def test_an_overloaded_nodes_answer_is_retried_on_the_other_node_in_both_formats(tmp_path: Path) -> None:
    """One node whose every request's deadline passes (overload: a pickle body's 500, flow_grpo's
    retried status, and a JSON body's 503), one that serves: nginx sends each attempt the first
    refuses to the other, so a client that retries nothing itself gets every score. Each format
    gets a fresh balancer, whose first pick is the first node, the overloaded one (later ones may
    leave it out of rotation). On 9c673f5's configuration the pickle 500s were passed on."""
    image = render_text("Hello", size=64)
    payload = {"images": [image], "prompts": ["p"]}
    by_format: dict[str, Callable[[str], requests.Response]] = {
        "500": lambda url: post(url, payload),
        "503": lambda url: requests.post(
            url, json={**payload, "images": [base64.b64encode(image).decode()]}, timeout=120
        ),
    }
    logs = tmp_path / "logs"
    with contextlib.ExitStack() as stack:
        overloaded = stack.enter_context(
            gunicorn_server("jpeg_incompressibility", {"SCORER_REQUEST_TIMEOUT_S": "0.001"}, log_dir=logs)
        )
        serving = stack.enter_context(gunicorn_server("jpeg_incompressibility", log_dir=logs))
        alone = scores_of(post(serving.url, payload))
        nodes = [f"127.0.0.1:{overloaded.port}", f"127.0.0.1:{serving.port}"]
        for status, send in by_format.items():
            assert send(overloaded.url).status_code == int(status)
            with nginx(nodes, tmp_path / f"lb-{status}") as balancer:
                for _ in range(4):
                    response = send(balancer.url)
                    assert response.status_code == 200, response.content[:300]
                    scores = response.json()["scores"] if status == "503" else pickle.loads(response.content)["scores"]
                    assert scores == alone
                moved = [statuses for _, _, statuses in balancer.attempts() if len(statuses) > 1]
            assert moved and all(statuses == [status, "200"] for statuses in moved), moved
