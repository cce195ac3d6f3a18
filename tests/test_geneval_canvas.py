"""A large canvas against the GenEval service under gunicorn (tiny random Mask2Former and CLIP):
a 59 KB single-colour 4096 x 4096 PNG, inside ``SCORER_MAX_PIXELS``, once held the detector's
batch thread while each of its 100 detections' mask logits was upsampled to 16.7 Mpx (twice
with a colour clause), and another client's small request sent a second later missed its
deadline behind it. The post-processing of an image over ``SCORER_GENEVAL_OWN_SIZE_PIXELS`` now
runs on the detector's input."""

from __future__ import annotations

import pickle
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests
from PIL import Image

from testing.clip_models import save_random_clip_model
from testing.geneval_models import save_random_mask2former
from testing.images import blank, encode
from testing.ocr import memory_kb, peak_memory_reset
from testing.server import Server, gunicorn_server
from testing.timing import within

pytestmark = [pytest.mark.integration, pytest.mark.timing]

# The small request's deadline: far longer than it takes alone, far shorter than the canvas took.
DEADLINE_S = 10
RED_DOG = {"tag": "colors", "include": [{"class": "dog", "count": 1, "color": "red"}]}
DOG = {"tag": "single_object", "include": [{"class": "dog", "count": 1}]}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    directory = tmp_path_factory.mktemp("geneval-canvas")
    env = {
        "SCORER_GENEVAL_DETECTOR": str(save_random_mask2former(directory / "detector")),
        "SCORER_GENEVAL_CLIP": str(save_random_clip_model(directory / "clip")),
        # The tiny model's test scale: the detector itself costs little on any canvas.
        "SCORER_GENEVAL_MIN_SIZE": "96",
        "SCORER_GENEVAL_MAX_SIZE": "128",
        "SCORER_REQUEST_TIMEOUT_S": str(DEADLINE_S),
    }
    with gunicorn_server("geneval", env=env, threads=8, require_ready=False, log_dir=directory) as server:
        server.wait_ready(timeout=400)
        yield server


def post(server: Server, image: bytes, metadata: dict[str, Any]) -> tuple[int, float, dict[str, Any]]:
    """flow_grpo's request for one image: the status, the seconds it took, the answer."""
    body = pickle.dumps({"images": [image], "meta_datas": [metadata], "only_strict": False})
    started = time.monotonic()
    response = requests.post(server.url, data=body, timeout=300)
    return response.status_code, time.monotonic() - started, pickle.loads(response.content)


def test_a_large_canvas_holds_no_other_client_past_its_deadline(server: Server) -> None:
    """Small requests sent one after the other while the canvas is in flight each come back
    quickly: before, those that arrived during its post-processing got 503 at their deadline."""
    small = encode(Image.new("RGB", (80, 64), (20, 20, 20)))
    canvas = blank(4096, "PNG")
    assert len(canvas) < 60_000
    status, alone, _ = post(server, small, DOG)
    assert status == 200
    smalls = []
    with ThreadPoolExecutor(1) as pool:
        large = pool.submit(post, server, canvas, RED_DOG)
        while not large.done():
            smalls.append(post(server, small, DOG)[:2])
        large_status, large_seconds, answer = large.result()
    assert smalls
    for status, seconds in smalls:
        assert status == 200 and seconds < within(3), (
            f"a small request: {status} after {seconds:.1f} s ({alone:.1f} s alone)"
        )
    assert large_status == 200 and large_seconds < within(4), (large_status, large_seconds)
    # The canvas's boxes are in its own pixels, not the detector's.
    boxes = [d["box"] for d in answer["details"][0]["detections"]]
    assert boxes and max(max(box) for box in boxes) > 1000


def test_a_large_canvas_holds_little_memory(server: Server) -> None:
    """Its masks live on the detector's input: the worker's peak memory grows by little more than
    the image's pixels and their float copy (250 MB), never by full-size masks (6.7 GB for 100)."""
    pid = requests.get(server.url + "/health", timeout=10).json()["pid"]
    before = peak_memory_reset(pid)
    status, _, _ = post(server, blank(4096, "PNG"), RED_DOG)
    assert status == 200
    grown_mb = (memory_kb(pid, "VmHWM") - before) / 1024
    assert grown_mb < 600, f"the worker's peak memory grew by {grown_mb:.0f} MB"
