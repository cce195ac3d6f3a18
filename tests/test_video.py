# Over 400 lines: every image scorer's video requests against the running services they share (module fixtures).
"""Video samples through every image scorer, against running services (real gunicorn): a request
of ``videos`` (lists of encoded frames) scores every ``frame_interval``-th frame as an image, a
video's score is its chosen frames' mean (OCR: also flow_grpo's ``video_ocr`` rule), frames not
chosen are never decoded, and the limits count frames (docs/ARCHITECTURE.md §5.1)."""

from __future__ import annotations

import asyncio
import base64
import io
import math
import pickle
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import requests
from PIL import Image
from rapidfuzz.distance import Levenshtein

from common.sdk import verl_omni
from testing.clip_models import save_model
from testing.images import blank, encode, render_text, sample_images
from testing.random_clip import save_random_clip
from testing.reference import REFERENCE_PYTHON
from testing.server import gunicorn_server

# A frame that starts as a JPEG and is nothing else: decoding it fails (422), so a request that
# holds it where a frame is not chosen and still scores shows that frame was never decoded.
NOT_DECODED = b"\xff\xd8\xff\xe0 never decoded"
TOLERANCE = 1e-5


def post(url: str, payload: dict) -> tuple[int, dict]:
    response = requests.post(url + "/", data=pickle.dumps(payload), timeout=120)
    return response.status_code, pickle.loads(response.content)


def scored(url: str, payload: dict) -> dict:
    status, answer = post(url, payload)
    assert status == 200, answer
    return answer


# ----------------------------------------------------------------------------- every image service


@pytest.fixture(scope="module")
def aesthetic_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    clip = save_random_clip(tmp_path_factory.mktemp("clip"), size="tiny")
    env = {"SCORER_AESTHETIC_CLIP": str(clip), "SCORER_DEVICE": "cpu", "SCORER_MAX_WAIT_MS": "20"}
    with gunicorn_server("aesthetic", env, threads=32, log_dir=tmp_path_factory.mktemp("logs")) as server:
        yield server.url


@pytest.fixture(scope="module", params=["ocr", "aesthetic", "pickscore", "clipscore", "hpsv2"])
def service(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(name, URL) of each image service, on its tiny model (OCR: RapidOCR's real one)."""
    name = request.param
    if name == "ocr":
        yield name, request.getfixturevalue("ocr_server").url
    elif name == "aesthetic":
        yield name, request.getfixturevalue("aesthetic_server")
    else:
        if name == "hpsv2" and not REFERENCE_PYTHON:
            pytest.skip("the tiny HPSv2 checkpoint is made by the reference environment (run via 'bash run.sh test')")
        model = save_model(name, tmp_path_factory.mktemp(name))
        env = {f"SCORER_{name.upper()}_MODEL": str(model), "SCORER_DEVICE": "cpu", "SCORER_MAX_WAIT_MS": "20"}
        with gunicorn_server(name, env, threads=32, log_dir=tmp_path_factory.mktemp("logs")) as server:
            yield name, server.url


def frames_for(name: str) -> tuple[list[list[bytes]], list[str]]:
    """Three videos' frames (2, 1 and 3), each frame its own image, and the videos' prompts:
    words and near-misses for OCR, varied images for the others."""
    if name == "ocr":
        words = [["Velvet", "Velvot"], ["Harbor 9"], ["Quartz", "Quarts", "Qu"]]
        return [[render_text(word) for word in video] for video in words], [f'a sign that says "{v[0]}"' for v in words]
    images = sample_images(6)
    return [images[0:2], images[2:3], images[3:6]], ["a photo of a cat", "a red bicycle", ""]


def test_videos_score_as_their_frames_beside_an_image_request(service: tuple[str, str]) -> None:
    """An image request of every frame and a video request at once (batched together): each
    video, of different lengths and of frames that score apart, scores as the mean of its
    chosen frames; a frame not chosen is never decoded."""
    name, url = service
    chosen, prompts = frames_for(name)
    # frame_interval 2: the chosen frames at 0, 2, 4..., a frame that must not be decoded between
    videos = [[image for frame in frames for image in (frame, NOT_DECODED)][:-1] for frames in chosen]
    video_request = {"videos": videos, "prompts": prompts, "metadata": {"frame_interval": 2}}
    image_request = {
        "images": [frame for frames in chosen for frame in frames],
        "prompts": [prompt for frames, prompt in zip(chosen, prompts) for _ in frames],
    }
    with ThreadPoolExecutor(2) as pool:
        image_answer, video_answer = pool.map(lambda payload: scored(url, payload), [image_request, video_request])
    assert "frame_scores" not in image_answer  # an image request answers as it always has
    scores = iter(image_answer["scores"])
    per_video = [[next(scores) for _ in frames] for frames in chosen]
    for frames in per_video:  # else a video of one frame repeated would pass
        assert len(set(frames)) == len(frames), per_video
    assert [len(frames) for frames in video_answer["frame_scores"]] == [2, 1, 3]
    for got, frames in zip(video_answer["frame_scores"], per_video):
        assert got == pytest.approx(frames, abs=TOLERANCE)
    expected = [math.fsum(frames) / len(frames) for frames in per_video]
    assert video_answer["scores"] == pytest.approx(expected, abs=TOLERANCE)
    assert video_answer["outputs"] == video_answer["scores"]
    if name == "ocr":
        assert min(frames[0] for frames in per_video) > 0.8, per_video  # the words are read, not a trivial 0 = 0


def distinct_frames(count: int) -> list[bytes]:
    """Noise frames of one size, each its own (PNG: what the service decodes is what was made)."""
    rng = np.random.default_rng(11)
    return [encode(Image.fromarray(rng.integers(0, 256, (96, 128, 3), dtype=np.uint8)), "PNG") for _ in range(count)]


def test_frame_interval_picks_frames_and_the_mean_is_the_score(aesthetic_server: str) -> None:
    frames = distinct_frames(10)
    alone = scored(aesthetic_server, {"images": frames, "prompts": [""] * 10})["scores"]
    assert len(set(alone)) == 10, "the frames must score apart for the test to see which were chosen"
    for interval, chosen in [(1, range(10)), (3, [0, 3, 6, 9]), (4, [0, 4, 8]), (10, [0]), (99, [0])]:
        answer = scored(
            aesthetic_server, {"videos": [frames], "prompts": ["p"], "metadata": {"frame_interval": interval}}
        )
        assert answer["frame_scores"][0] == pytest.approx([alone[i] for i in chosen], abs=TOLERANCE), interval
        assert answer["scores"][0] == pytest.approx(math.fsum(alone[i] for i in chosen) / len(chosen), abs=TOLERANCE)
    default = scored(aesthetic_server, {"videos": [frames], "prompts": ["p"]})
    assert len(default["frame_scores"][0]) == 10  # every frame unless the request says


def test_json_twin_carries_frames_as_base64(aesthetic_server: str) -> None:
    frames = sample_images(4)
    body = {
        "videos": [[base64.b64encode(f).decode() for f in frames]],
        "prompts": ["p"],
        "metadata": {"frame_interval": 2},
    }
    answer = requests.post(aesthetic_server + "/score", json=body, timeout=120).json()
    expected = scored(aesthetic_server, {"videos": [frames], "prompts": ["p"], "metadata": {"frame_interval": 2}})
    assert answer["scores"] == pytest.approx(expected["scores"], abs=TOLERANCE)
    assert answer["frame_scores"][0] == pytest.approx(expected["frame_scores"][0], abs=TOLERANCE)


# ----------------------------------------------------------------------------- OCR's video rule


def flow_grpo_video_ocr(texts: list[str], prompt: str, interval: int = 4) -> float:
    """flow_grpo's ``OcrScorer_video_or_image`` restated from the texts its frames show: every
    ``interval``-th frame, target the first quoted segment, spaces removed and lower case, the
    plain Levenshtein distance capped at the target's length, ``1 - d / len``; the mean of the
    frames scoring above 0, else 0."""
    target = prompt.split('"')[1].replace(" ", "").lower()
    kept = []
    for text in texts[::interval]:
        distance = min(Levenshtein.distance(text.replace(" ", "").lower(), target), len(target))
        if (reward := 1 - distance / len(target)) > 0:
            kept.append(reward)
    return sum(kept) / len(kept) if kept else 0.0


def test_video_ocr_rule_equals_flow_grpos_formula(ocr_server) -> None:
    prompt = 'a neon sign that says "Hello World"'
    # Frames 0, 4, 8 chosen by the rule's own interval: the target, nothing (0: left out of the
    # mean), the target inside more text (1 by the image rule's substring match, 0.6 here).
    texts = ["Hello World", "", "", "", "", "", "", "", "Hello World Now"]
    frames = [render_text(text) if text else blank() for text in texts]
    frames[1:4] = frames[5:8] = [NOT_DECODED] * 3
    answer = scored(ocr_server.url, {"videos": [frames], "prompts": [prompt], "metadata": {"video_rule": "video_ocr"}})
    assert answer["frame_scores"][0] == pytest.approx([1.0, 0.0, 1 - 3 / 10])
    assert answer["scores"][0] == pytest.approx(flow_grpo_video_ocr(texts, prompt)) == pytest.approx(0.85)
    mean = scored(ocr_server.url, {"videos": [frames], "prompts": [prompt], "metadata": {"frame_interval": 4}})
    assert mean["frame_scores"][0] == pytest.approx([1.0, 0.0, 1.0])  # the image rule, frame by frame
    assert mean["scores"][0] == pytest.approx(2 / 3)


def test_a_video_of_identical_frames_scores_as_its_frame_on_ocr(ocr_server) -> None:
    prompt = 'a banner that says "Grand Opening"'
    image = render_text("Grand Opening")
    (alone,) = scored(ocr_server.url, {"images": [image], "prompts": [prompt]})["scores"]
    answer = scored(ocr_server.url, {"videos": [[image] * 5], "prompts": [prompt]})
    assert alone > 0.9 and answer["scores"] == [pytest.approx(alone)]
    assert answer["frame_scores"] == [[pytest.approx(alone)] * 5]


# ----------------------------------------------------------------------------- limits and bad input


FRAME = sample_images(1)[0]  # 150x180: 27,000 pixels, 297,000 bytes decoded
# Frames of FRAME's size, each its own: a frame given again shares its first one's model input.
DISTINCT_FRAMES = [encode(Image.new("RGB", (150, 180), (20 * i, 90, 90)), "PNG") for i in range(12)]


@pytest.fixture(scope="module")
def limited_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    clip = save_random_clip(tmp_path_factory.mktemp("clip"), size="tiny")
    env = {
        "SCORER_AESTHETIC_CLIP": str(clip),
        "SCORER_DEVICE": "cpu",
        "SCORER_MAX_ITEMS": "8",
        "SCORER_MAX_FRAMES": "12",
        "SCORER_MAX_REQUEST_PIXELS": str(7 * 27_000),
        # 3.5 frames' decode and model input (224x224x3 float32, twice)
        "SCORER_MAX_WORK_BYTES": str(3 * (297_000 + 1_204_224) + 150_000),
    }
    with gunicorn_server("aesthetic", env, threads=8, log_dir=tmp_path_factory.mktemp("logs")) as server:
        yield server.url


@pytest.mark.parametrize(
    ("payload", "status", "message"),
    [
        ({"images": [FRAME], "videos": [[FRAME]], "prompts": ["p"]}, 422, "'images' or 'videos', not both"),
        (
            {"videos": [[FRAME] * 13], "prompts": ["p"]},
            413,
            "videos[0] has 13 frames; the limit is 12 (SCORER_MAX_FRAMES)",
        ),
        ({"videos": [[NOT_DECODED] * 3] * 9, "prompts": ["p"] * 9}, 413, "9 videos in one request; the limit is 8"),
        (
            {"videos": [[FRAME] * 3] * 3, "prompts": ["p"] * 3},
            413,
            "9 chosen frames (every 1th frame of 3 videos) in one request; the limit is 8 (SCORER_MAX_ITEMS)",
        ),
        (
            {"videos": [DISTINCT_FRAMES], "prompts": ["p"], "metadata": {"frame_interval": 3}},
            413,
            "(aesthetic inputs); the limit is 4 MiB (SCORER_MAX_WORK_BYTES)",  # under the pixels
        ),
        ({"videos": [[FRAME] * 8], "prompts": ["p"]}, 413, "SCORER_MAX_REQUEST_PIXELS"),
        ({"videos": [[FRAME, NOT_DECODED]], "prompts": ["p"]}, 422, "videos[0][1] could not be decoded"),
        (
            {"videos": [[FRAME, b"GIF89a"]], "prompts": ["p"], "metadata": {"frame_interval": 2}},
            422,
            "videos[0][1] is not a JPEG, PNG or WebP",
        ),
        (
            {"videos": [[FRAME, 7]], "prompts": ["p"], "metadata": {"frame_interval": 2}},
            422,
            "videos[0][1] must be bytes",
        ),
        ({"videos": [[]], "prompts": ["p"]}, 422, "videos[0] has no frames"),
        ({"videos": [FRAME], "prompts": ["p"]}, 422, "videos[0] must be a list of encoded frames"),
        ({"videos": [[FRAME]], "prompts": ["p", "q"]}, 422, "need one prompt per video"),
        ({"videos": [[FRAME]], "prompts": ["p"], "metadata": {"frame_interval": 0}}, 422, "frame_interval"),
        ({"videos": [[FRAME]], "prompts": ["p"], "metadata": {"frame_interval": True}}, 422, "frame_interval"),
        ({"videos": [[FRAME]], "prompts": ["p"], "metadata": {"video_rule": "video_ocr"}}, 422, "known: mean"),
    ],
)
def test_limits_and_bad_videos_get_clear_errors(limited_server: str, payload: dict, status: int, message: str) -> None:
    answer_status, answer = post(limited_server, payload)
    assert (answer_status, message in answer.get("error", "")) == (status, True), answer
    fine = scored(
        limited_server, {"videos": [[FRAME, NOT_DECODED] * 3], "prompts": ["p"], "metadata": {"frame_interval": 2}}
    )
    assert len(fine["frame_scores"][0]) == 3  # the node carries on; frames not chosen cost no items or pixels


# ----------------------------------------------------------------------------- the VeRL-Omni drop-in


def test_verl_omni_module_imports_with_the_clients_dependencies_only(tmp_path: Path) -> None:
    import subprocess
    import sys

    blocked = ["torch", "flask", "gunicorn", "werkzeug", "prometheus_client", "transformers"]
    code = (
        "import sys\n"
        f"class Block:\n def find_spec(self, name, path=None, target=None):\n"
        f"  if name.split('.')[0] in {blocked!r}: raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import common.sdk.verl_omni as m, numpy as np\n"
        "assert m.frames_of(np.zeros((3, 5, 8, 8), np.uint8)).shape == (5, 8, 8, 3)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def compute(url: str, sample: object, prompt: str = "p", **kwargs: object) -> float:
    """VeRL-Omni's call of the drop-in reward function, in an event loop of its own."""

    async def call() -> dict:
        try:
            return await verl_omni.compute_score(solution_image=sample, ground_truth=prompt, server_url=url, **kwargs)
        finally:
            await verl_omni.compute_score._session.close()

    result = asyncio.run(call())
    assert set(result) == {"score"}
    return result["score"]


def test_verl_omni_module_sends_whole_videos_and_images(aesthetic_server: str) -> None:
    import torch

    rng = np.random.default_rng(5)
    video = rng.integers(0, 256, (9, 64, 80, 3), dtype=np.uint8)  # THWC
    sent = [verl_omni.encode_frame(frame) for frame in video]  # JPEG, as the stock client sends
    alone = scored(aesthetic_server, {"images": sent, "prompts": ["p"] * 9})["scores"]

    def mean(chosen: range) -> float:
        return math.fsum(alone[i] for i in chosen) / len(chosen)

    tchw = torch.from_numpy(video).permute(0, 3, 1, 2)
    assert compute(aesthetic_server, video) == pytest.approx(mean(range(0, 9, 4)), abs=TOLERANCE)  # default 4
    assert compute(aesthetic_server, tchw, extra_info={"frame_interval": 3}, layout="TCHW") == pytest.approx(
        mean(range(0, 9, 3)), abs=TOLERANCE
    )
    cthw_float = tchw.permute(1, 0, 2, 3).float() / 255  # floats in [0, 1], channels first
    assert compute(aesthetic_server, cthw_float, frame_interval=2, extra_info={"frame_interval": 3}) == pytest.approx(
        mean(range(0, 9, 2)), abs=TOLERANCE
    )
    assert compute(aesthetic_server, tchw[None], frame_interval=1, layout="TCHW") == pytest.approx(
        mean(range(9)), abs=TOLERANCE
    )
    # An image (CHW, or a batch of one), as the stock client sends it: the JPEG of the image.
    assert compute(aesthetic_server, tchw[4]) == pytest.approx(alone[4], abs=TOLERANCE)
    assert compute(aesthetic_server, tchw[4:5]) == pytest.approx(alone[4], abs=TOLERANCE)
    with pytest.raises(RuntimeError, match=r"HTTP 413: prompts\[0\] has 9000 characters"):
        compute(aesthetic_server, video, prompt="x" * 9000)
    with pytest.raises(RuntimeError, match=r"HTTP 422: metadata\['video_rule'\] = 'video_ocr' is not a video rule"):
        compute(aesthetic_server, video, metadata={"video_rule": "video_ocr"})  # the request's metadata goes along


def test_verl_omni_module_retries_as_the_stock_client() -> None:
    """408, 429, 5xx and dropped connections are retried ``max_retries`` times with doubling
    backoff (common/sdk/retry.py); other statuses raise at once."""
    from aiohttp import web

    async def serve(statuses: list[int], **kwargs: object) -> tuple[float | str, int]:
        seen: list[int] = []

        async def handler(request: web.Request) -> web.Response:
            await request.read()
            status = statuses[min(len(seen), len(statuses) - 1)]
            seen.append(status)
            body = {"scores": [0.25], "outputs": [0.25]} if status == 200 else {"error": f"status {status}"}
            return web.Response(status=status, body=pickle.dumps(body))

        app = web.Application()
        app.router.add_post("/", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            result = await verl_omni.compute_score(
                np.zeros((3, 16, 16), np.uint8), "p", f"http://127.0.0.1:{port}/", retry_backoff=0.01, **kwargs
            )
            outcome: float | str = result["score"]
        except RuntimeError as exc:
            outcome = str(exc)
        finally:
            await verl_omni.compute_score._session.close()
            await runner.cleanup()
        return outcome, len(seen)

    assert asyncio.run(serve([503, 429, 200])) == (0.25, 3)
    outcome, attempts = asyncio.run(serve([500, 408, 200], max_retries=1))
    assert attempts == 2 and outcome == "HTTP 408: status 408 (after 2 attempts)"
    outcome, attempts = asyncio.run(serve([422, 200]))
    assert attempts == 1 and outcome == "HTTP 422: status 422"


def test_verl_omni_module_reads_a_video_as_verl_omnis_rewards_do(aesthetic_server: str) -> None:
    """A 3-frame video in VeRL-Omni's ``[C, F, H, W]`` is its three frames, not three grey ones;
    a shape two layouts fit is refused unless ``layout`` names one."""
    rng = np.random.default_rng(8)
    video = rng.integers(0, 256, (3, 48, 64, 3), dtype=np.uint8)  # THWC, three distinct frames
    alone = scored(aesthetic_server, {"images": [verl_omni.encode_frame(f) for f in video], "prompts": ["p"] * 3})
    mean = math.fsum(alone["scores"]) / 3
    cfhw = np.ascontiguousarray(video.transpose(3, 0, 1, 2))  # (3, 3, 48, 64)
    assert compute(aesthetic_server, cfhw, frame_interval=1) == pytest.approx(mean, abs=TOLERANCE)
    assert compute(aesthetic_server, cfhw[None], frame_interval=1) == pytest.approx(mean, abs=TOLERANCE)
    narrow = video[:, :, :3]  # (3, 48, 3, 3): THWC, or CTHW three pixels wide
    with pytest.raises(ValueError, match=r"fits both THWC and CTHW: name its layout"):
        compute(aesthetic_server, narrow)
    expected = scored(aesthetic_server, {"videos": [[verl_omni.encode_frame(f) for f in narrow]], "prompts": ["p"]})
    assert compute(aesthetic_server, narrow, frame_interval=1, layout="THWC") == pytest.approx(
        expected["scores"][0], abs=TOLERANCE
    )
    with pytest.raises(ValueError, match=r"layout='CHW' does not fit a sample of shape \(3, 3, 48, 64\)"):
        compute(aesthetic_server, cfhw, layout="CHW")
    with pytest.raises(ValueError, match="no RGB channel dimension"):
        compute(aesthetic_server, np.zeros((5, 4, 8, 8), np.uint8))


def test_verl_omni_module_sends_omegaconf_fields_as_plain_data(ocr_server) -> None:
    """VeRL-Omni hands reward-config fields over as OmegaConf containers."""
    from omegaconf import OmegaConf

    image = np.asarray(Image.open(io.BytesIO(render_text("Open", size=256))).convert("RGB"))
    prompt = 'a sign that says "Open" and "Closed"'
    plain = compute(ocr_server.url, image, prompt, metadata={"ocr": {"target": "all"}})
    assert compute(ocr_server.url, image, prompt) == 1.0 > plain  # "Closed" counts only with target all
    config = OmegaConf.create({"metadata": {"ocr": {"target": "all"}}, "extra_info": {"frame_interval": 2}})
    assert compute(ocr_server.url, image, prompt, metadata=config.metadata, extra_info=config.extra_info) == plain
    nested = OmegaConf.create({"ocr": {"target": "all", "no_quotes": "zero"}, "tags": ["a", {"b": 1}]})
    body = verl_omni.request_body(image, prompt, 1, metadata=nested)
    sent = pickle.loads(body)["metadata"]
    assert sent == {"ocr": {"target": "all", "no_quotes": "zero"}, "tags": ["a", {"b": 1}]}
    assert type(sent) is dict and type(sent["ocr"]) is dict and type(sent["tags"]) is list
