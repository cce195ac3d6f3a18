"""Aesthetic service on its real loading path: a small random CLIP saved with
``save_pretrained`` and loaded by the service as real weights are, and the real LAION head."""

from __future__ import annotations

import base64
import io
import os
import pickle
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import requests
import torch
from PIL import Image
from torch import nn
from transformers import CLIPModel, CLIPProcessor

from common.configuration.config import ConfigError
from common.configuration.settings import CoreSettings
from common.setup.preflight import reason
from services.aesthetic.scorer import AestheticScorer
from services.aesthetic.settings import DEFAULT_HEAD
from testing.images import encode, sample_images
from testing.random_clip import save_random_clip
from testing.server import ROOT, gunicorn_server, post, running_server, scores_of


def reference_head() -> nn.Sequential:
    """The LAION MLP written out from its description (docs/ARCHITECTURE.md §7), to check the service's head."""
    return nn.Sequential(
        nn.Linear(768, 1024),
        nn.Dropout(0.2),
        nn.Linear(1024, 128),
        nn.Dropout(0.2),
        nn.Linear(128, 64),
        nn.Dropout(0.1),
        nn.Linear(64, 16),
        nn.Linear(16, 1),
    ).eval()


def reference_scores(clip_dir: Path, images: list[bytes]) -> list[float]:
    """An independent computation with transformers' own CLIPModel and CLIPProcessor."""
    model = CLIPModel.from_pretrained(clip_dir).eval()
    processor = CLIPProcessor.from_pretrained(clip_dir)
    head = reference_head()
    state = torch.load(DEFAULT_HEAD, map_location="cpu", weights_only=True)
    head.load_state_dict({key.removeprefix("layers."): value for key, value in state.items()})
    pil = [Image.open(io.BytesIO(data)).convert("RGB") for data in images]
    with torch.no_grad():
        pixels = processor(images=pil, return_tensors="pt")["pixel_values"]
        features = model.get_image_features(pixel_values=pixels)
        if not isinstance(features, torch.Tensor):
            features = features.pooler_output
        features = features / torch.linalg.vector_norm(features, dim=-1, keepdim=True)
        return head(features).squeeze(1).tolist()


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_clip(tmp_path_factory.mktemp("clip"), size="tiny")


@pytest.fixture(scope="module")
def images() -> list[bytes]:
    return sample_images(16)


@pytest.fixture(scope="module")
def expected(clip_dir: Path, images: list[bytes]) -> list[float]:
    return reference_scores(clip_dir, images)


@pytest.fixture(scope="module")
def server(clip_dir: Path) -> str:
    env = {"SCORER_AESTHETIC_CLIP": str(clip_dir), "SCORER_DEVICE": "cpu", "SCORER_MAX_WAIT_MS": "20"}
    with running_server("aesthetic", env=env, threads=96) as url:
        yield url


def batch_stats(url: str) -> tuple[float, float]:
    """(count, sum) of the batch-size histogram in /metrics."""
    text = requests.get(url + "/metrics", timeout=10).text

    def total(suffix: str) -> float:
        pattern = rf'^scorer_batch_size_{suffix}\{{[^}}]*service="aesthetic"[^}}]*\}} (\S+)$'
        return sum(float(value) for value in re.findall(pattern, text, re.M))

    return total("count"), total("sum")


def test_reference_is_not_constant(expected: list[float]) -> None:
    """Different images must score differently, or the comparisons below would prove nothing."""
    assert np.std(expected) > 1e-4
    assert all(0 < score < 15 for score in expected)


def test_one_request_matches_reference(server: str, images: list[bytes], expected: list[float]) -> None:
    scores = scores_of(post(server, {"images": images, "prompts": ["a photo"] * len(images), "metadata": {}}))
    np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-4)


def test_json_twin_and_score_route(server: str, images: list[bytes], expected: list[float]) -> None:
    body = {"images": [base64.b64encode(data).decode() for data in images[:4]], "prompts": [""] * 4}
    response = requests.post(server + "/score", json=body, timeout=60)
    assert response.status_code == 200, response.text
    np.testing.assert_allclose(response.json()["scores"], expected[:4], rtol=1e-5, atol=1e-4)


def test_concurrent_one_image_requests_batch_and_match(server: str, images: list[bytes], expected: list[float]) -> None:
    order = [i % len(images) for i in range(64)]
    sequential = [scores_of(post(server, {"images": [images[i]], "prompts": ["p"]}))[0] for i in order[:16]]
    count_before, sum_before = batch_stats(server)
    with ThreadPoolExecutor(64) as pool:
        responses = list(pool.map(lambda i: post(server, {"images": [images[i]], "prompts": ["p"]}), order))
    concurrent = [scores_of(response)[0] for response in responses]
    count_after, sum_after = batch_stats(server)
    np.testing.assert_allclose(concurrent[:16], sequential, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(concurrent, [expected[i] for i in order], rtol=1e-5, atol=1e-4)
    assert sum_after - sum_before == 64
    assert count_after - count_before < 64, "concurrent requests were never batched together"


@pytest.mark.parametrize(
    ("payload", "status", "message"),
    [
        ({"images": [b"not an image"], "prompts": ["p"]}, 422, "images[0] could not be decoded"),
        ({"images": [b"\xff\xd8\xff\xe0" + b"\x00" * 64], "prompts": ["p"]}, 422, "images[0] could not be decoded"),
        ({"images": [None], "prompts": ["p"]}, 422, "images[0] must be bytes"),
        ({"images": [b"x", b"y"], "prompts": ["p"]}, 422, "one prompt per image"),
        ({"prompts": ["p"]}, 422, "'images' must be a list"),
        ({"images": [encode(Image.new("RGB", (1, 300_000)), "PNG")], "prompts": ["p"]}, 422, "aspect ratio"),
        ({"images": [encode(Image.new("RGB", (5000, 5000)), "PNG")], "prompts": ["p"]}, 413, "pixels"),
    ],
)
def test_bad_images_get_clear_errors(server: str, payload: dict, status: int, message: str) -> None:
    response = post(server, payload)
    assert response.status_code == status
    assert message in pickle.loads(response.content)["error"]


def test_bad_image_among_good_ones_names_its_index(server: str, images: list[bytes]) -> None:
    response = post(server, {"images": [images[0], images[1][:50]], "prompts": ["p", "p"]})
    assert response.status_code == 422
    assert "images[1]" in pickle.loads(response.content)["error"]


def test_info_describes_the_model(server: str, clip_dir: Path) -> None:
    model = requests.get(server + "/info", timeout=10).json()["model"]
    assert model["clip"] == str(clip_dir)
    assert model["precision"] == "float32"
    assert model["micro_batch"] == 8  # the CPU default


def make_scorer(monkeypatch: pytest.MonkeyPatch, **settings: str) -> AestheticScorer:
    for name, value in settings.items():
        monkeypatch.setenv(f"SCORER_AESTHETIC_{name.upper()}", value)
    return AestheticScorer(CoreSettings(service="aesthetic"))


def test_micro_batches_and_scale_in_process(
    monkeypatch: pytest.MonkeyPatch, clip_dir: Path, images: list[bytes], expected: list[float]
) -> None:
    scorer = make_scorer(monkeypatch, clip=str(clip_dir), micro_batch="3", scale="0.1", offset="-0.1")
    scorer.setup("cpu")
    items = scorer.prepare({"images": images[:7], "prompts": ["p"] * 7})
    assert all(item.shape == (3, 224, 224) and item.dtype == torch.float32 for item in items)
    scores = scorer.score(items)
    np.testing.assert_allclose(scores, [s * 0.1 - 0.1 for s in expected[:7]], rtol=1e-5, atol=1e-5)


def test_an_image_given_several_times_is_preprocessed_once(
    monkeypatch: pytest.MonkeyPatch, clip_dir: Path, images: list[bytes]
) -> None:
    """Bytes the pickle memo references several times are decoded once, and preprocessed once:
    every reference's item is the same tensor."""
    scorer = make_scorer(monkeypatch, clip=str(clip_dir))
    scorer.setup("cpu")
    first, second = images[:2]
    items = scorer.prepare({"images": [first, second, first], "prompts": ["p"] * 3})
    assert items[0] is items[2] and items[1] is not items[0]


def test_missing_clip_is_a_clear_config_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    missing = make_scorer(monkeypatch, clip=str(tmp_path / "nowhere"))
    assert "SCORER_AESTHETIC_CLIP" in (reason(missing.name) or "")
    with pytest.raises(ConfigError, match="SCORER_AESTHETIC_CLIP"):
        missing.setup("cpu")
    empty = make_scorer(monkeypatch, clip=str(tmp_path))  # a directory without weights
    with pytest.raises(ConfigError, match=r"SCORER_AESTHETIC_CLIP.*no config\.json"):
        empty.setup("cpu")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    hub = make_scorer(monkeypatch, clip="openai/clip-vit-large-patch14")
    assert "not in the local hub cache" in (reason(hub.name) or "")


def test_missing_or_wrong_head(monkeypatch: pytest.MonkeyPatch, clip_dir: Path, tmp_path: Path) -> None:
    missing = make_scorer(monkeypatch, clip=str(clip_dir), head=str(tmp_path / "head.pth"))
    assert "SCORER_AESTHETIC_HEAD" in (reason(missing.name) or "")
    with pytest.raises(ConfigError, match="SCORER_AESTHETIC_HEAD"):
        missing.setup("cpu")
    torch.save({"layers.0.weight": torch.zeros(2, 2)}, tmp_path / "wrong.pth")
    wrong = make_scorer(monkeypatch, clip=str(clip_dir), head=str(tmp_path / "wrong.pth"))
    with pytest.raises(ConfigError, match="not a LAION aesthetic head"):
        wrong.setup("cpu")


def test_server_without_weights_says_why_and_is_not_ready(tmp_path: Path) -> None:
    env = {"SCORER_AESTHETIC_CLIP": str(tmp_path / "no-clip"), "SCORER_DEVICE": "cpu", "SCORER_READY_WAIT_S": "5"}
    with gunicorn_server("aesthetic", env=env, require_ready=False) as server:
        ready = requests.get(server.url + "/ready", timeout=10)
        for _ in range(100):
            if ready.json().get("reason", "").startswith("ConfigError"):
                break
            ready = requests.get(server.url + "/ready", timeout=10)
        assert ready.status_code == 503
        assert "SCORER_AESTHETIC_CLIP" in ready.json()["reason"]
        response = post(server.url, {"images": sample_images(1), "prompts": ["p"]})
        assert response.status_code == 503
        assert "SCORER_AESTHETIC_CLIP" in pickle.loads(response.content)["error"]
        assert "SCORER_AESTHETIC_CLIP" in server.logs()


def test_run_sh_preflight_skips_with_the_reason(tmp_path: Path) -> None:
    """What ``bash run.sh`` with no argument runs before starting the service."""
    env = {**os.environ, "SCORER_SERVICE": "aesthetic", "SCORER_AESTHETIC_CLIP": str(tmp_path / "no-clip")}
    done = subprocess.run(
        [sys.executable, "-S", "-m", "common.setup.preflight"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "SCORER_AESTHETIC_CLIP" in done.stderr and "is not a directory" in done.stderr
