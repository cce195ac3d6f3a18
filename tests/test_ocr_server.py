# Over 400 lines: the OCR service end to end against the running service the tests share.
"""The OCR service end to end: real gunicorn, real PP-OCR models, real HTTP clients."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import math
import os
import pickle
import re
import signal
import struct
import subprocess
import sys
import threading
import time
from typing import Any

import numpy as np
import pytest
import requests
from PIL import Image, ImageDraw, ImageFont

from common.configuration.settings import CoreSettings
from common.models.ocr_rule import RuleOptions, targets
from common.sdk.client import AsyncScorerClient, ScorerClient
from services.ocr.scorer import OcrSettings
from testing.clock import wait_until
from testing.images import blank, empty_chunks_png, ocr_prompts, quoted, render_text, scan_bomb
from testing.ocr import bounded, memory_kb, peak_memory_reset, timed_post
from testing.server import ROOT, gunicorn_server, metric_total
from testing.timing import within

PROMPTS = ocr_prompts(12)


def post_pickle(url: str, payload, **kwargs) -> tuple[int, dict]:
    body = payload if isinstance(payload, bytes) else pickle.dumps(payload)
    response = requests.post(url + "/", data=body, timeout=120, **kwargs)
    return response.status_code, pickle.loads(response.content)


def metric(text: str, name: str, stage: str) -> float:
    match = re.search(rf'^{name}{{service="ocr",stage="{stage}"}} (\S+)$', text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def test_rendered_target_text_scores_high_on_real_prompts(ocr_server) -> None:
    images = [render_text(quoted(prompt)) for prompt in PROMPTS]
    status, answer = post_pickle(ocr_server.url, {"images": images, "prompts": PROMPTS, "metadata": {}})
    assert status == 200, answer
    assert len(answer["scores"]) == len(PROMPTS)
    assert answer["outputs"] == answer["scores"]
    assert all(score >= 0.9 for score in answer["scores"]), list(zip(PROMPTS, answer["scores"]))


def test_other_text_scores_low(ocr_server) -> None:
    images = [render_text(quoted(PROMPTS[(i + 1) % 6])) for i in range(6)] + [blank()]
    status, answer = post_pickle(ocr_server.url, {"images": images, "prompts": [*PROMPTS[:6], PROMPTS[0]]})
    assert status == 200, answer
    assert all(score < 0.5 for score in answer["scores"]), answer["scores"]
    assert answer["scores"][-1] == 0.0  # nothing to read


def test_json_twin_and_png_give_the_same_scores(ocr_server) -> None:
    prompt = PROMPTS[0]
    pickled = ScorerClient(ocr_server.url).scores([render_text(quoted(prompt))], [prompt])
    jsoned = ScorerClient(ocr_server.url, fmt="json").scores([render_text(quoted(prompt))], [prompt])
    png = ScorerClient(ocr_server.url).scores([render_text(quoted(prompt), fmt="PNG")], [prompt])
    assert pickled == jsoned
    assert png[0] >= 0.9


def test_per_request_options_from_metadata(ocr_server) -> None:
    prompt = 'A sign that says "Open Now"'
    image = render_text("open now")
    client = ScorerClient(ocr_server.url)
    assert client.scores([image], [prompt])[0] == 1.0
    strict = client.scores([image], [prompt], {"ocr": {"case_sensitive": True}, "meta_datas": [1]})[0]
    assert strict < 1.0


def test_64_concurrent_one_image_requests_answered_in_order_and_batched(ocr_server) -> None:
    texts = [quoted(p) for p in PROMPTS[:8]]
    # request i shows text i % 8 and asks for text (i // 8) % 8: only the diagonal matches
    cases = [(render_text(texts[i % 8]), PROMPTS[(i // 8) % 8]) for i in range(64)]
    before = requests.get(ocr_server.url + "/metrics", timeout=10).text

    async def send() -> list[float]:
        async with AsyncScorerClient(ocr_server.url, retries=0) as client:
            return await client.score_each([c[0] for c in cases], [c[1] for c in cases])

    scores = asyncio.run(send())
    after = requests.get(ocr_server.url + "/metrics", timeout=10).text
    assert len(scores) == 64
    for i, score in enumerate(scores):
        if i % 8 == (i // 8) % 8:
            assert score >= 0.9, (i, score)
        else:
            assert score < 0.9, (i, score)

    # Both model calls gather items of concurrent requests: 64 images in fewer detector calls,
    # their text lines in fewer recognizer calls.
    def delta(name: str, stage: str) -> float:
        return metric(after, name, stage) - metric(before, name, stage)

    assert delta("scorer_batch_size_sum", "detect") == 64
    assert delta("scorer_batch_size_count", "detect") < 64, "images were not batched together"
    lines, calls = delta("scorer_batch_size_sum", "recognize"), delta("scorer_batch_size_count", "recognize")
    assert lines >= 64  # at least one text line per image
    assert calls < 64, "text lines were not batched together"


BOMB = io.BytesIO()
Image.new("L", (3000, 3000)).save(BOMB, "PNG")  # 9 Mpx, over the 4 Mpx limit, a few KB on the wire
GIF = io.BytesIO()
Image.new("RGB", (8, 8)).save(GIF, "GIF")
GOOD = render_text("Hello")


class CreatesFile:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


BAD_INPUTS = {
    "garbage body": (b"this is not a pickle", 400),
    "empty body": (b"", 400),
    "pickled list": (pickle.dumps([GOOD]), 400),
    "no images key": ({"prompts": ["a"]}, 422),
    "images not a list": ({"images": GOOD, "prompts": ["a"]}, 422),
    "prompts not a list": ({"images": [GOOD], "prompts": "a"}, 422),
    "fewer prompts": ({"images": [GOOD, GOOD], "prompts": ["a"]}, 422),
    "prompt not a string": ({"images": [GOOD], "prompts": [7]}, 422),
    "image not bytes": ({"images": [12], "prompts": ["a"]}, 422),
    "metadata not a dict": ({"images": [GOOD], "prompts": ["a"], "metadata": [1]}, 422),
    # one rule for every non-dict metadata: these were silently taken as {}
    "metadata 0": ({"images": [GOOD], "prompts": ["a"], "metadata": 0}, 422),
    "metadata empty string": ({"images": [GOOD], "prompts": ["a"], "metadata": ""}, 422),
    "metadata empty list": ({"images": [GOOD], "prompts": ["a"], "metadata": []}, 422),
    # numbers no float holds: these were 500s (OverflowError, ValueError)
    "min_confidence 10**400": (
        {"images": [GOOD], "prompts": ["a"], "metadata": {"ocr": {"min_confidence": 10**400}}},
        422,
    ),
    "target 10**5000": ({"images": [GOOD], "prompts": ["a"], "metadata": {"ocr": {"target": 10**5000}}}, 422),
    "undecodable image": ({"images": [b"\xff\xd8\xff garbage"], "prompts": ["a"]}, 422),
    "truncated jpeg": ({"images": [GOOD[: len(GOOD) // 2]], "prompts": ['"Hello"']}, 422),
    "gif": ({"images": [GIF.getvalue()], "prompts": ["a"]}, 422),
    "empty target": ({"images": [GOOD], "prompts": ['a sign "" here']}, 422),
    "unknown ocr option": ({"images": [GOOD], "prompts": ["a"], "metadata": {"ocr": {"bogus": 1}}}, 422),
    "too many images": ({"images": [GOOD] * 33, "prompts": ["a"] * 33}, 413),
    "prompt too long": ({"images": [GOOD], "prompts": ["a" * 2001]}, 413),
    "decompression bomb": ({"images": [BOMB.getvalue()], "prompts": ["a"]}, 413),
    "body too large": (b"\x80" * (8 * 1024 * 1024 + 1), 413),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_input_gets_clear_error_and_server_keeps_serving(ocr_server, name: str) -> None:
    payload, expected = BAD_INPUTS[name]
    workers = ocr_server.worker_pids()
    status, answer = post_pickle(ocr_server.url, payload)
    assert status == expected, answer
    assert isinstance(answer["error"], str) and len(answer["error"]) > 10
    assert ocr_server.worker_pids() == workers
    assert ScorerClient(ocr_server.url).scores([GOOD], ['"Hello"']) == [1.0]


def test_bad_json_gets_400_in_json(ocr_server) -> None:
    response = requests.post(ocr_server.url + "/score", data=b"{oops", headers={"Content-Type": "application/json"})
    assert response.status_code == 400
    assert "JSON" in response.json()["error"]
    response = requests.post(
        ocr_server.url + "/score",
        json={"images": ["%%%"], "prompts": ["a"]},
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 422 and "base64" in response.json()["error"]


def test_hostile_pickle_is_refused_and_runs_nothing(ocr_server, tmp_path) -> None:
    target = tmp_path / "created-by-pickle"
    status, answer = post_pickle(ocr_server.url, {"images": [CreatesFile(str(target))], "prompts": ["a"]})
    assert status == 400
    assert "only plain data" in answer["error"]
    assert not target.exists()  # unpickling, had it run, ran before the answer


def test_health_ready_info_and_unknown_routes(ocr_server) -> None:
    assert requests.get(ocr_server.url + "/health").json()["status"] == "ok"
    assert requests.get(ocr_server.url + "/ready").json() == {"ready": True}
    info = requests.get(ocr_server.url + "/info").json()
    assert info["service"] == "ocr" and info["device"] == "cpu"
    assert info["model"]["engine"] == "rapidocr"
    assert info["model"]["det_batch"] == 8 and info["model"]["rec_batch"] == 64
    assert info["settings"]["max_items"] == 32
    assert requests.get(ocr_server.url + "/nope").status_code == 404
    assert requests.get(ocr_server.url + "/score").status_code == 405
    text = requests.get(ocr_server.url + "/metrics").text
    assert "scorer_requests_total" in text and "scorer_ready" in text


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "common.sdk.client", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def test_cli_smoke(ocr_server, tmp_path) -> None:
    image = tmp_path / "sign.jpg"
    image.write_bytes(render_text("Grand Opening"))
    good = run_cli(ocr_server.url, str(image), 'a banner reading "Grand Opening"')
    assert good.returncode == 0, good.stderr
    assert float(good.stdout) >= 0.9
    bad = run_cli(ocr_server.url, str(image), 'empty ""')
    assert bad.returncode == 1 and "HTTP 422" in bad.stderr


def test_bearer_token_is_checked_before_the_body(tmp_path) -> None:
    with gunicorn_server("ocr", {"SCORER_AUTH_TOKEN": "s3cret"}, log_dir=tmp_path) as server:
        status, answer = post_pickle(server.url, {"images": [GOOD], "prompts": ['"Hello"']})
        assert status == 401 and "token" in answer["error"]
        # a refused client is not made to upload: the answer comes before a huge body is read
        status, _ = post_pickle(server.url, b"x" * 1000, headers={"Authorization": "Bearer wrong"})
        assert status == 401
        assert ScorerClient(server.url, token="s3cret").scores([GOOD], ['"Hello"']) == [1.0]
        # the scheme is case-insensitive (RFC 9110 11.1); the token is not
        for header in ("bearer s3cret", "BEARER s3cret"):
            status, answer = post_pickle(
                server.url, {"images": [GOOD], "prompts": ['"Hello"']}, headers={"Authorization": header}
            )
            assert (status, answer["scores"]) == (200, [1.0]), header
        status, _ = post_pickle(
            server.url, {"images": [GOOD], "prompts": ['"Hello"']}, headers={"Authorization": "bearer S3CRET"}
        )
        assert status == 401
        assert requests.get(server.url + "/ready").status_code == 200  # probes need no token


def test_killed_worker_is_replaced_and_next_requests_succeed(tmp_path) -> None:
    with gunicorn_server("ocr", log_dir=tmp_path) as server:
        (victim,) = server.worker_pids()
        images = [render_text(quoted(p)) for p in ocr_prompts(16)]
        outcome: dict[str, object] = {}

        def slow_request() -> None:
            try:
                outcome["status"] = requests.post(
                    server.url + "/", data=pickle.dumps({"images": images, "prompts": ocr_prompts(16)}), timeout=60
                ).status_code
            except requests.RequestException as exc:
                outcome["error"] = exc

        decoded = metric_total(server.url, "scorer_images_decoded_total")
        thread = threading.Thread(target=slow_request)
        thread.start()
        wait_until(  # the 16-image request is in the worker, being scored
            lambda: metric_total(server.url, "scorer_images_decoded_total") > decoded, "the request's images decoded"
        )
        os.kill(victim, signal.SIGKILL)
        thread.join(60)
        assert "error" in outcome or outcome.get("status") != 200  # that request was lost...
        # ...but gunicorn starts a new worker, which loads the model and serves again.
        wait_until(lambda: server.worker_pids() not in ([], [victim]), "a replacement worker")
        (replacement,) = server.worker_pids()
        assert replacement != victim
        client = ScorerClient(server.url, retries=5)
        assert client.scores([images[0]], [ocr_prompts(1)[0]])[0] >= 0.9
        assert json.loads(requests.get(server.url + "/ready").text)["ready"] is True


def test_a_request_that_can_never_fit_the_queue_is_413(tmp_path) -> None:
    with gunicorn_server("ocr", {"SCORER_MAX_QUEUE": "8"}, log_dir=tmp_path) as server:
        images = [render_text(f"Hello {index}", size=256) for index in range(9)]  # distinct: each is read
        status, answer = post_pickle(server.url, {"images": images, "prompts": ['"Hello"'] * 9})
        assert status == 413 and "9 items in one request; the batch queue holds 8" in answer["error"], answer
        assert ScorerClient(server.url).scores(images[:8], ['"Hello"'] * 8) == [1.0] * 8


@pytest.mark.timing
def test_an_overloaded_node_answers_by_the_deadline_in_arrival_order(tmp_path) -> None:
    """More one-image requests at once than a 6 s deadline lets the node score: each is answered
    by its deadline (once, across both OCR stages), those it cannot serve with the overload of a
    pickle body, flow_grpo's 500, once their deadline has passed, never earlier (an early refusal
    is a lost sample for VeRL-Omni's client, which retries twice within 1.5 s), and the ones served are
    served in arrival order: three waves sent seconds apart (the order within
    a wave is the client's and the kernel's, not the test's to know). The waves are sized from
    the node's measured rate, three times what it can serve in the test's window, so a fast
    machine is overloaded as surely as a slow one."""
    waves, timeout_s = 3, 6.0
    gap = within(1.0)
    with gunicorn_server("ocr", {"SCORER_REQUEST_TIMEOUT_S": str(timeout_s)}, log_dir=tmp_path) as server:
        body = pickle.dumps({"images": [render_text("Hello", size=256)], "prompts": ['"Hello"']})

        async def post(session, wave: int) -> tuple[int, int, float, float]:
            await asyncio.sleep(wave * gap)
            sent = time.monotonic()
            async with session.post(server.url + "/", data=body) as response:
                await response.read()
                return wave, response.status, sent, time.monotonic() - sent

        async def rate_per_s(burst: int = 16) -> float:
            import aiohttp

            async with aiohttp.ClientSession() as session:
                await post(session, 0)  # warm: the first request loads what the later ones reuse
                started = time.monotonic()
                outcomes = await asyncio.gather(*(post(session, 0) for _ in range(burst)))
            # On a loaded node the burst alone may overrun the deadline: its 500s are no work done.
            served = sum(status == 200 for _, status, _, _ in outcomes)
            assert served and set(status for _, status, _, _ in outcomes) <= {200, 500}, outcomes
            return served / (time.monotonic() - started)

        window_s = timeout_s + (waves - 1) * gap
        size = min(400, max(32, math.ceil(3 * asyncio.run(rate_per_s()) * window_s / waves)))

        async def fire() -> list[tuple[int, int, float, float]]:
            import aiohttp

            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=waves * size)) as session:
                return await asyncio.gather(*(post(session, wave) for wave in range(waves) for _ in range(size)))

        outcomes = asyncio.run(fire())
    statuses = [status for _, status, _, _ in outcomes]
    assert set(statuses) == {200, 500}, statuses  # some served, some refused
    slowest = max(took for _, _, _, took in outcomes)
    late = within(1.5)  # an answer's way back, after the deadline the node keeps
    assert slowest < timeout_s + late, f"an answer took {slowest:.1f}s, past the {timeout_s}s deadline"
    refusals = [took for _, status, _, took in outcomes if status == 500]
    # Held to the deadline, which runs from the request's arrival, after the client sent it.
    assert min(refusals) >= timeout_s, f"a request was refused {timeout_s - min(refusals):.1f}s before its deadline"
    # A request served is done before those of a later wave (the queue admits later ones again
    # once it has drained; two decode slots and shared batches give some jitter).
    done = [(wave, sent + took) for wave, status, sent, took in outcomes if status == 200]
    jitter = within(0.5)
    overtaken = [(a, b) for a in done for b in done if b[0] > a[0] and b[1] < a[1] - jitter]
    assert not overtaken, f"served out of arrival order (wave, done at): {overtaken[:5]}"


def png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("L", (width, height), 255).save(out, "PNG")
    return out.getvalue()


@pytest.mark.timing
def test_thin_png_is_refused_at_once_without_memory(ocr_server) -> None:
    """A 70-byte 200x1 PNG took 11.8 s and 2.2 GB in RapidOCR's resize and letterbox."""
    (pid,) = ocr_server.worker_pids()
    before = peak_memory_reset(pid)
    body = pickle.dumps({"images": [png(200, 1)], "prompts": ['"a"']})
    status, answer, seconds, _ = timed_post(ocr_server.url, body)
    grown_mb = (memory_kb(pid, "VmHWM") - before) / 1024
    assert status == 422 and "SCORER_MAX_ASPECT_RATIO" in answer["error"], answer
    assert seconds < within(1.0) and grown_mb < 50, (seconds, grown_mb)


@pytest.mark.parametrize("size", [(1000, 1), (2001, 10), (10, 2001), (1, 60)])
def test_extreme_aspect_ratios_get_422_naming_the_limit(ocr_server, size: tuple[int, int]) -> None:
    """1000x1 took 11.5 GB; 2001x10 and 10x2001 were 500s (RapidOCR's ResizeImgError)."""
    status, answer = post_pickle(ocr_server.url, {"images": [png(*size)], "prompts": ['"a"']})
    assert status == 422, answer
    assert f"{size[0]}x{size[1]}" in answer["error"] and "limit of 50 (SCORER_MAX_ASPECT_RATIO)" in answer["error"]


def test_engine_input_over_the_limit_gets_413_before_any_pixel_work(ocr_server) -> None:
    """2000x300 is within every image limit but RapidOCR reads it at 4896x736 = 3.6 Mpx, over the
    1.5 Mpx this server allows; the size is known from the header, before the resize."""
    status, answer = post_pickle(ocr_server.url, {"images": [png(2000, 300)], "prompts": ['"a"']})
    assert status == 413, answer
    assert "4896x736" in answer["error"] and "SCORER_OCR_MAX_INPUT_PIXELS" in answer["error"], answer
    status, answer = post_pickle(ocr_server.url, {"images": [png(600, 300)], "prompts": ['"a"']})
    assert status == 200, answer  # 1472x736 = 1.1 Mpx: read


def test_one_image_referenced_many_times_counts_each_time(ocr_server) -> None:
    """One 2048x2048 JPEG sent once and referenced 5 times through the pickle memo is five images
    to decode: 21 Mpx, over this server's 16.8 Mpx per request."""
    out = io.BytesIO()
    Image.new("RGB", (2048, 2048), "white").save(out, "JPEG")
    image = out.getvalue()
    body = pickle.dumps({"images": [image] * 5, "prompts": ['"a"'] * 5})
    assert len(body) < len(image) + 200  # sent once
    status, answer = post_pickle(ocr_server.url, body)
    assert status == 413 and "SCORER_MAX_REQUEST_PIXELS" in answer["error"], answer


DEEP_TUPLE = b"N" + b"\x85" * 200_000


@pytest.mark.parametrize("prefix", [b"\x80\x04NNb0", b"\x80\x05N\x980"])
def test_pickle_that_stopped_the_pre_check_no_longer_crashes_the_worker(ocr_server, prefix: bytes) -> None:
    """BUILD on None (or READONLY_BUFFER) stopped the old pre-check; the 200,000-deep tuple after it,
    used as a dict key, crashed the worker (SIGSEGV)."""
    workers = ocr_server.worker_pids()
    status, answer = post_pickle(ocr_server.url, prefix + b"}" + DEEP_TUPLE + b"Ns.")
    assert status == 400 and "opcode" in answer["error"], answer
    assert ocr_server.worker_pids() == workers
    assert requests.get(ocr_server.url + "/health", timeout=5).status_code == 200


def memo_dag(depth: int) -> bytes:
    """Tuples that each hold the previous one twice, through the pickle memo: 2**depth nodes."""
    assert depth < 256
    body = b"N\x94"
    for level in range(depth):
        get = b"h" + bytes([level])  # BINGET
        body += get + get + b"\x86\x94"  # TUPLE2, MEMOIZE
    return body


@pytest.mark.timing
def test_memo_dag_as_a_dict_key_is_refused_at_once_and_health_answers(ocr_server) -> None:
    """430 bytes: hashing the key visited 2**40 nodes with the GIL held; /health did not answer
    for 120 s, until gunicorn killed the worker."""
    workers = ocr_server.worker_pids()
    body = b"\x80\x04}" + memo_dag(40) + b"Ns."
    assert len(body) <= 430
    status, answer, seconds, _ = timed_post(ocr_server.url, body)
    assert status == 413 and "values counted as a tree" in answer["error"], answer
    assert seconds < within(1.0)
    assert requests.get(ocr_server.url + "/health", timeout=within(2.0)).status_code == 200
    assert ocr_server.worker_pids() == workers


@pytest.mark.timing
def test_error_bodies_quote_input_bounded_and_without_addresses(ocr_server) -> None:
    """A 1.2 KB DAG as an unknown metadata.ocr key gave a 32 MB error body after 4 s; PIL's
    message quoted ``<_io.BytesIO object at 0x...>``."""
    good = {"images": [GOOD], "prompts": ['"Hello"']}
    dag_key = b"\x80\x04}(\x8c\x06images]C\x05\xff\xd8\xff\xe0\x00a\x8c\x07prompts]\x8c\x01aa"
    dag_key += b"\x8c\x08metadata}\x8c\x03ocr}" + memo_dag(22) + b"\x88ssu."  # {dag: True}: 2**22 nodes
    long_key = pickle.dumps({**good, "metadata": {"ocr": {"x" * 2_000_000: 1}}})
    not_an_image = pickle.dumps({"images": [b"not an image at all"], "prompts": ["a"]})
    for body in (dag_key, long_key, not_an_image):
        status, answer, seconds, size = timed_post(ocr_server.url, body)
        assert status in (400, 413, 422), answer
        assert size < 1000 and seconds < within(1.0), (size, seconds)
        assert not re.search(r"0x[0-9a-f]{6,}", answer["error"]), answer


def post_json(url: str, body: bytes) -> tuple[int, dict, float]:
    started = time.perf_counter()
    response = requests.post(url + "/score", data=body, headers={"Content-Type": "application/json"}, timeout=120)
    return response.status_code, response.json(), time.perf_counter() - started


def test_a_memo_index_past_the_stream_costs_no_memory(ocr_server) -> None:
    """9 bytes: ``N``, LONG_BINPUT 2**28, STOP: CPython's unpickler zero-filled a 4 GiB memo
    (here 2**25: 512 MB) before the refusal."""
    body = b"\x80\x04N" + b"r" + struct.pack("<I", 2**25) + b"."
    status, answer, _, _ = bounded(ocr_server, lambda: timed_post(ocr_server.url, body))
    assert status == 400 and "memo index 33554432" in answer["error"], answer


def test_json_of_millions_of_values_is_refused_before_it_is_built(ocr_server) -> None:
    """7 MB of ``[],`` (2.4 M empty lists) went to json.loads: 180 MB and a second with the GIL
    held (32 MB: 800 MB and 5.7 s) before the 422 for 'images'."""
    body = b'{"images": [' + b"[]," * (7 * 2**20 // 3) + b'[]], "prompts": []}'
    status, answer, _ = bounded(ocr_server, lambda: post_json(ocr_server.url, body))
    assert status == 413 and "the limit is 1000000 (SCORER_MAX_JSON_VALUES)" in answer["error"], answer
    good = json.dumps({"images": [base64.b64encode(GOOD).decode()], "prompts": ['"Hello"']}).encode()
    assert post_json(ocr_server.url, good)[:2] == (200, {"scores": [1.0], "outputs": [1.0]})


@pytest.mark.timing
def test_a_jpeg_of_thousands_of_scans_is_refused_before_it_is_decoded(ocr_server) -> None:
    """85 KB, 1200x1200 (within this server's limits), its last refinement scan repeated 3,000
    times: seconds of decoding, the request's deadline not looked at, before a score of 0
    (4096x4096 and 73 KB: 11.6 s)."""
    bomb = scan_bomb(1200, 3000)
    assert len(bomb) < 100_000
    status, answer, seconds, _ = bounded(
        ocr_server, lambda: timed_post(ocr_server.url, pickle.dumps({"images": [bomb], "prompts": ['"a"']}))
    )
    assert status == 413 and "the limit is 100 (SCORER_MAX_JPEG_SCANS)" in answer["error"], answer
    assert seconds < within(5), seconds


@pytest.mark.timing
def test_a_png_of_half_a_million_empty_chunks_is_refused_before_pillow_reads_it(ocr_server) -> None:
    """Pillow spends ~3 microseconds on each chunk, even an empty one: 1 M cost 3.2 s to open."""
    png = empty_chunks_png(500_000)
    status, answer, seconds, _ = bounded(
        ocr_server, lambda: timed_post(ocr_server.url, pickle.dumps({"images": [png], "prompts": ['"a"']}))
    )
    assert status == 413 and "(SCORER_MAX_PNG_CHUNKS)" in answer["error"], answer
    assert seconds < within(5), seconds


def dense_text_png(size: int = 1200, lines: int = 46) -> bytes:
    """Many lines of small text: a few KB of PNG, minutes of recognizer work on a CPU."""
    image = Image.new("L", (size, size), 255)
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=14)
    for line in range(lines):
        draw.text((10, 10 + line * (size - 20) // lines), "the quick brown fox jumps over the lazy dog " * 4, font=font)
    out = io.BytesIO()
    image.save(out, "PNG", optimize=True)
    return out.getvalue()


def test_dense_text_is_refused_before_the_recognizer_reads_it(ocr_server) -> None:
    """A 9 KB PNG of 46 lines of small text: 128,000 pixels of lines for the recognizer (a
    64 KB one took 30 s of its work); refused whole after detection, never read in part."""
    body = pickle.dumps({"images": [dense_text_png()], "prompts": ['"fox"']})
    before = requests.get(ocr_server.url + "/metrics", timeout=10).text
    # the detector's own working memory at this server's 1.5 Mpx input: ~350 MB (the recognizer's
    # work on the 46 lines took 1 GB more)
    status, answer, _, _ = bounded(ocr_server, lambda: timed_post(ocr_server.url, body), max_growth_mb=600)
    after = requests.get(ocr_server.url + "/metrics", timeout=10).text
    assert status == 413 and "the limit is 65536 (SCORER_OCR_MAX_TEXT_WIDTH)" in answer["error"], answer
    assert metric(after, "scorer_batch_size_sum", "recognize") == metric(before, "scorer_batch_size_sum", "recognize")


def test_thousands_of_targets_are_refused_before_any_model_call(ocr_server) -> None:
    """``target=all`` with ``ngram_candidates``: each quoted target is matched against every run
    of recognized words; 2,730 targets cost 2.9 s of CPU per sample after the model calls."""
    prompt = '"a"' * 666  # as many as this server's 2,000-character prompts hold
    options = {"ocr": {"target": "all", "ngram_candidates": True}}
    before = requests.get(ocr_server.url + "/metrics", timeout=10).text
    status, answer = post_pickle(ocr_server.url, {"images": [GOOD], "prompts": [prompt], "metadata": options})
    after = requests.get(ocr_server.url + "/metrics", timeout=10).text
    assert status == 413 and "666 quoted targets; the limit is 16 (SCORER_OCR_MAX_TARGETS)" in answer["error"]
    assert metric(after, "scorer_batch_size_sum", "detect") == metric(before, "scorer_batch_size_sum", "detect")
    status, answer = post_pickle(ocr_server.url, {"images": [GOOD], "prompts": ['"Hello" "Hi"'], "metadata": options})
    assert status == 200 and 0.5 <= answer["scores"][0] < 1.0, answer


def test_a_16_bit_greyscale_png_reads_as_it_looks(ocr_server) -> None:
    """Pillow's convert("RGB") clipped 16-bit samples at 255: a clear "Hello" in dark grey ink
    was all white, 0.0."""
    ink = 40 + np.asarray(Image.open(io.BytesIO(GOOD)).convert("L")) * (215 / 255)  # dark grey on white
    grey = np.rint(ink * 257).astype(np.uint16)
    out = io.BytesIO()
    Image.fromarray(grey).save(out, "PNG")
    assert Image.open(io.BytesIO(out.getvalue())).mode == "I;16"
    assert ScorerClient(ocr_server.url).scores([out.getvalue()], ['"Hello"']) == [1.0]


@pytest.mark.parametrize("orientation, turn", [(6, 90), (8, -90), (3, 180)])
def test_a_phone_jpeg_reads_the_way_its_exif_orientation_shows_it(ocr_server, orientation: int, turn: int) -> None:
    """A phone stores its sensor's rows and says how to turn them: read as stored, the text was
    sideways and scored 0.0."""
    upright = Image.open(io.BytesIO(render_text("Hello", size=512)))
    exif = Image.Exif()
    exif[0x0112] = orientation
    out = io.BytesIO()
    upright.rotate(turn, expand=True).save(out, "JPEG", exif=exif, quality=95)
    assert ScorerClient(ocr_server.url).scores([out.getvalue()], ['"Hello"']) == [1.0]


def test_queued_work_is_bounded_in_bytes(tmp_path) -> None:
    """A 16 KB white 2000x2000 PNG is a 56.5 MB detector input: requests of 25 such images
    pushed the worker from 1 to 12.4 GB. Work bytes are held from the headers before anything is
    made: a request that alone needs more than SCORER_MAX_WORK_BYTES is a 413 at once; one that
    would take the worker past it while another holds it waits for that one's bytes (on 1bbc00e
    a 500 at once, a pickle body's overload) and is scored; the worker's memory grows by at most
    that budget and one model call's own working memory."""
    whites = [png(1400 + i, 1400) for i in range(25)]  # 8 KB each, ~60 MB of work each
    white = whites[0]
    budget_mb = 300
    env = {"SCORER_MAX_WORK_BYTES": str(budget_mb * 2**20), "SCORER_REQUEST_TIMEOUT_S": "100"}
    with gunicorn_server("ocr", env, log_dir=tmp_path) as server:
        alone = pickle.dumps({"images": whites, "prompts": ['"a"'] * 25})
        status, answer, _, _ = bounded(server, lambda: timed_post(server.url, alone))
        assert status == 413 and "(SCORER_MAX_WORK_BYTES)" in answer["error"], answer
        (pid,) = server.worker_pids()
        before = peak_memory_reset(pid)
        assert timed_post(server.url, pickle.dumps({"images": [white], "prompts": ['"a"']}))[0] == 200
        one_image_mb = (memory_kb(pid, "VmHWM") - before) / 1024  # its work and the detector's working memory
        four = pickle.dumps({"images": whites[1:5], "prompts": ['"a"'] * 4})  # ~240 MB: fits alone
        first: dict[str, Any] = {}
        thread = threading.Thread(target=lambda: first.update(answer=timed_post(server.url, four)))
        decoded = metric_total(server.url, "scorer_images_decoded_total")
        before = peak_memory_reset(pid)
        thread.start()
        wait_until(  # the first request holds its decoded images (seconds of detection follow)
            lambda: metric_total(server.url, "scorer_images_decoded_total") >= decoded + 4, "4 images decoded"
        )
        second = timed_post(server.url, four)
        thread.join(120)
        grown_mb = (memory_kb(pid, "VmHWM") - before) / 1024
        assert first["answer"][:2] == second[:2] == (200, {"scores": [0.0] * 4, "outputs": [0.0] * 4}), second
        assert grown_mb < budget_mb + one_image_mb, (grown_mb, one_image_mb)
        assert timed_post(server.url, four)[0] == 200  # given back once answered


def test_the_work_budget_s_former_name_still_bounds_work(tmp_path) -> None:
    """SCORER_MAX_QUEUE_BYTES, the budget's name until this release, still sets it: the request
    over it is refused under the new name, and the log and /info say the old one goes."""
    env = {"SCORER_MAX_QUEUE_BYTES": str(30 * 2**20)}
    with gunicorn_server("ocr", env, log_dir=tmp_path) as server:
        body = pickle.dumps({"images": [png(1400, 1400)], "prompts": ['"a"']})  # ~60 MB of work
        status, answer, _, _ = timed_post(server.url, body)
        assert status == 413 and "(SCORER_MAX_WORK_BYTES)" in answer["error"], answer
        info = requests.get(f"{server.url}/info", timeout=30).json()
        assert info["settings"]["max_work_bytes"] == 30 * 2**20
        [message] = info["deprecated_settings"]
        assert message.startswith("SCORER_MAX_QUEUE_BYTES is deprecated") and message in server.logs()


def test_every_flow_grpo_prompt_is_within_the_default_limits() -> None:
    """Every prompt of flow_grpo's OCR set, with every target taken (``target="all"``), is within
    the default target limit; their renders' text widths (at most 768, one line each, measured
    over all 1,017) are far within SCORER_OCR_MAX_TEXT_WIDTH, which the 12 above are read under."""
    settings = OcrSettings()
    every = RuleOptions(target="all")
    prompts = ocr_prompts()
    assert len(prompts) > 1000
    assert max(len(targets(prompt, every) or []) for prompt in prompts) <= settings.max_targets
    assert max(len(prompt) for prompt in prompts) <= CoreSettings().max_prompt_chars
