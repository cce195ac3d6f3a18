"""PickScore, CLIPScore and HPSv2 on their real loading paths: tiny random models of each
architecture, saved as the real checkpoints are laid out, with CLIP's real tokenizer.

The reference scores come from ``testing/clip_reference.py`` in the reference environment
(transformers for PickScore and CLIPScore, open_clip for HPSv2, torchvision for the tensor
preprocessing), in the shape flow_grpo calls them; ``run.sh test`` builds that environment.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import requests
import torch
from PIL import Image

from common.configuration.config import ConfigError
from common.configuration.settings import CoreSettings
from common.setup.preflight import reason
from services.clip.scorer import ClipRewardScorer, ClipScoreScorer, HPSv2Scorer, PickScoreScorer
from testing.clip_models import TINY_OPEN_CLIP, save_model, save_processor, save_random_clip_model
from testing.images import encode, sample_images
from testing.reference import needs_reference, run_reference
from testing.server import batch_stats, gunicorn_server, refused_without_weights

SCORERS: dict[str, type[ClipRewardScorer]] = {
    "pickscore": PickScoreScorer,
    "clipscore": ClipScoreScorer,
    "hpsv2": HPSv2Scorer,
}
TOLERANCE = 1e-4
PROMPTS = [
    "a photo of a cat",
    'An astronaut’s glove floating in zero-g with "NASA 2049" on the wrist',  # curly quote
    "salt &amp; pepper, Ｆｕｌｌ－ｗｉｄｔｈ letters",  # an HTML entity, full-width letters
    "",
    "一只猫 🐈 on a   mat\n\twith\u00a0spaces",
    "word " * 120,  # past the 77-token context
]


def reference(job: dict) -> dict:
    return run_reference("clip_reference.py", job)


@pytest.fixture(scope="module")
def images() -> list[bytes]:
    return sample_images(12)


@pytest.fixture(scope="module")
def image_files(images: list[bytes], tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    directory = tmp_path_factory.mktemp("images")
    paths = []
    for index, data in enumerate(images):
        (directory / str(index)).write_bytes(data)
        paths.append(str(directory / str(index)))
    return paths


def pairs(count: int) -> list[str]:
    return [PROMPTS[i % len(PROMPTS)] for i in range(count)]


def post(url: str, payload: dict) -> requests.Response:
    return requests.post(url, data=pickle.dumps(payload), timeout=120)


def scores_of(response: requests.Response) -> list[float]:
    assert response.status_code == 200, response.content[:500]
    return pickle.loads(response.content)["scores"]


@needs_reference
@pytest.mark.parametrize("service", list(SCORERS))
def test_gunicorn_scores_equal_the_reference(
    service: str, images: list[bytes], image_files: list[str], tmp_path: Path
) -> None:
    """One request with every image, then one-image requests at once (batched across requests),
    against the reference library's scores for the same pairs."""
    model = save_model(service, tmp_path / service)
    prompts = pairs(len(images))
    expected = reference({"job": service, "model": str(model), "images": image_files, "prompts": prompts})["scores"]
    assert np.std(expected) > 1e-3, "scores that do not vary would prove nothing"
    env = {f"SCORER_{service.upper()}_MODEL": str(model), "SCORER_DEVICE": "cpu", "SCORER_MAX_WAIT_MS": "50"}
    with gunicorn_server(service, env=env, threads=64, log_dir=tmp_path) as server:
        whole = scores_of(post(server.url, {"images": images, "prompts": prompts}))
        count_before, sum_before = batch_stats(server.url, service)
        order = [i % len(images) for i in range(36)]
        with ThreadPoolExecutor(36) as pool:
            one_by_one = list(
                pool.map(
                    lambda i: scores_of(post(server.url, {"images": [images[i]], "prompts": [prompts[i]]}))[0], order
                )
            )
        count_after, sum_after = batch_stats(server.url, service)
    difference = max(
        np.abs(np.subtract(whole, expected)).max(), np.abs(np.subtract(one_by_one, [expected[i] for i in order])).max()
    )
    print(f"{service}: max |service - reference| = {difference:.2e} over {len(images) + len(order)} scores")
    assert difference <= TOLERANCE
    assert sum_after - sum_before == len(order)
    assert count_after - count_before < len(order), "concurrent requests were never batched together"


@pytest.fixture(scope="module")
def pickscore_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_clip_model(tmp_path_factory.mktemp("pickscore"))


def make_scorer(monkeypatch: pytest.MonkeyPatch, service: str, **settings: str) -> ClipRewardScorer:
    for name, value in settings.items():
        monkeypatch.setenv(f"SCORER_{service.upper()}_{name.upper()}", value)
    return SCORERS[service](CoreSettings(service=service))


def test_a_shared_prompt_is_encoded_once_and_batches_do_not_change_scores(
    monkeypatch: pytest.MonkeyPatch, pickscore_dir: Path, images: list[bytes]
) -> None:
    """A GRPO group: many images, few prompts. The text tower sees each prompt once per batch,
    and a score is the same in any batch, micro-batch or order."""
    scorer = make_scorer(monkeypatch, "pickscore", model=str(pickscore_dir), micro_batch="5")
    scorer.setup("cpu")
    assert scorer.model is not None
    text_rows: list[int] = []
    hook = scorer.model.clip.text_model.register_forward_hook(
        lambda _module, _args, output: text_rows.append(output.last_hidden_state.shape[0])
    )
    prompts = [PROMPTS[i % 3] for i in range(len(images))]
    batched = scorer.score(scorer.prepare({"images": images, "prompts": prompts}))
    hook.remove()
    assert sum(text_rows) == 3
    alone = [
        scorer.score(scorer.prepare({"images": [image], "prompts": [prompt]}))[0]
        for image, prompt in zip(images, prompts)
    ]
    reversed_batch = scorer.score(scorer.prepare({"images": images[::-1], "prompts": prompts[::-1]}))[::-1]
    np.testing.assert_allclose(batched, alone, atol=1e-5)
    np.testing.assert_allclose(batched, reversed_batch, atol=1e-5)
    assert np.std(batched) > 1e-3


@pytest.mark.parametrize("service", ["pickscore", "clipscore"])
def test_an_image_given_several_times_is_preprocessed_once(
    monkeypatch: pytest.MonkeyPatch, pickscore_dir: Path, images: list[bytes], service: str
) -> None:
    """The core decodes bytes the pickle memo references several times once and hands every
    reference the same image: its pixels are preprocessed once (the processor's path and the
    float transform's), the references' items sharing them."""
    scorer = make_scorer(monkeypatch, service, model=str(pickscore_dir))
    scorer.setup("cpu")
    first, second = images[:2]
    items = scorer.prepare({"images": [first, second, first, first], "prompts": ["a", "b", "c", "a"]})
    assert items[0].pixels is items[2].pixels is items[3].pixels and items[1].pixels is not items[0].pixels
    assert items[2].tokens != items[3].tokens == items[0].tokens


def test_pickscore_follows_its_formula(
    monkeypatch: pytest.MonkeyPatch, pickscore_dir: Path, images: list[bytes]
) -> None:
    """logit_scale.exp() x cosine / divisor: the divisor setting scales it, nothing else moves."""
    default = make_scorer(monkeypatch, "pickscore", model=str(pickscore_dir))
    default.setup("cpu")
    scaled = make_scorer(monkeypatch, "pickscore", model=str(pickscore_dir), divisor="100")
    scaled.setup("cpu")
    payload = {"images": images[:4], "prompts": pairs(4)}
    np.testing.assert_allclose(
        np.multiply(default.score(default.prepare(payload)), 26 / 100), scaled.score(scaled.prepare(payload)), atol=1e-6
    )
    assert default.model is not None
    assert default.model.factor == pytest.approx(np.exp(4.2) / 26, rel=1e-5)
    assert default.info()["processor"] == str(pickscore_dir)


def test_concurrent_tokenising_is_safe(monkeypatch: pytest.MonkeyPatch, pickscore_dir: Path) -> None:
    """Request threads tokenise at once (the fast tokenizer refuses concurrent settings changes)."""
    scorer = make_scorer(monkeypatch, "pickscore", model=str(pickscore_dir))
    scorer.setup("cpu")
    assert scorer.model is not None
    model = scorer.model
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda i: model.tokenize([PROMPTS[i % len(PROMPTS)]] * 8), range(400)))
    assert all(result == model.tokenize([PROMPTS[i % len(PROMPTS)]] * 8) for i, result in enumerate(results))
    assert max(len(ids) for ids in model.tokenize(PROMPTS)) == 77


@pytest.mark.parametrize("service", list(SCORERS))
def test_missing_weights_are_clear_config_errors(monkeypatch: pytest.MonkeyPatch, service: str, tmp_path: Path) -> None:
    setting = f"SCORER_{service.upper()}_MODEL"
    missing = make_scorer(monkeypatch, service, model=str(tmp_path / "nowhere"))
    assert setting in (reason(missing.name) or "") and "is not a directory" in (reason(missing.name) or "")
    with pytest.raises(ConfigError, match=setting):
        missing.setup("cpu")
    empty = make_scorer(monkeypatch, service, model=str(tmp_path))  # a directory without weights
    with pytest.raises(ConfigError, match=rf"{setting}.*has no"):
        empty.setup("cpu")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    hub = make_scorer(monkeypatch, service, model="org/some-model")
    assert "not in the local hub cache" in (reason(hub.name) or "")


def test_missing_processor_names_its_setting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """PickScore weights without a processor beside them: the usual processor (a hub id) is not
    cached here, and --processor is what to set."""
    model = save_random_clip_model(tmp_path / "model", processor=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    scorer = make_scorer(monkeypatch, "pickscore", model=str(model))
    problem = reason(scorer.name) or ""
    assert "SCORER_PICKSCORE_PROCESSOR='laion/CLIP-ViT-H-14-laion2B-s32B-b79K'" in problem
    given = make_scorer(monkeypatch, "pickscore", model=str(model), processor=str(save_processor(tmp_path / "proc")))
    assert reason(given.name) is None
    given.setup("cpu")


def test_hpsv2_refuses_a_checkpoint_of_another_shape(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    save_processor(tmp_path)
    torch.save({"state_dict": {"visual.conv1.weight": torch.zeros(4, 3, 14, 14)}}, tmp_path / "HPS_v2.1_compressed.pt")
    scorer = make_scorer(monkeypatch, "hpsv2", model=str(tmp_path))
    assert reason(scorer.name) is None
    with pytest.raises(ConfigError, match=r"SCORER_HPSV2_MODEL.*is not an HPSv2 checkpoint.*does not fit"):
        scorer.setup("cpu")
    (tmp_path / "open_clip_config.json").write_text(
        json.dumps({"model_cfg": {**TINY_OPEN_CLIP, "timm_model_name": "x"}})
    )
    with pytest.raises(ConfigError, match=r"\['timm_model_name'\] are not supported"):
        scorer.setup("cpu")
    (tmp_path / "HPS_v2.1_compressed.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match="could not be read"):
        scorer.setup("cpu")


@pytest.fixture(scope="module")
def pickscore_server(pickscore_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    env = {"SCORER_PICKSCORE_MODEL": str(pickscore_dir), "SCORER_DEVICE": "cpu"}
    with gunicorn_server("pickscore", env=env, log_dir=tmp_path_factory.mktemp("logs")) as server:
        yield server.url


@pytest.mark.parametrize(
    ("payload", "status", "message"),
    [
        ({"images": [b"not an image"], "prompts": ["p"]}, 422, "images[0] could not be decoded"),
        ({"images": [encode(Image.new("RGB", (8, 8)), "PNG")] * 2, "prompts": ["p"]}, 422, "one prompt per image"),
        ({"images": [encode(Image.new("RGB", (8, 8)), "PNG")], "prompts": [7]}, 422, "prompts[0] must be a string"),
        ({"images": [encode(Image.new("RGB", (1, 300_000)), "PNG")], "prompts": ["p"]}, 422, "aspect ratio"),
    ],
)
def test_bad_samples_get_clear_errors(pickscore_server: str, payload: dict, status: int, message: str) -> None:
    response = post(pickscore_server, payload)
    assert response.status_code == status
    assert message in pickle.loads(response.content)["error"]
    good = post(pickscore_server, {"images": sample_images(1), "prompts": ["still fine"]})
    assert len(scores_of(good)) == 1


def test_info_names_model_processor_and_divisor(pickscore_server: str, pickscore_dir: Path) -> None:
    info = requests.get(pickscore_server + "/info", timeout=10).json()
    assert info["service"] == "pickscore"
    assert info["model"] == {
        "model": str(pickscore_dir),
        "processor": str(pickscore_dir),
        "precision": "float32",
        "micro_batch": 8,
        "divisor": 26.0,
    }


def test_server_without_weights_says_why_and_preflight_skips(tmp_path: Path) -> None:
    env = {"SCORER_HPSV2_MODEL": str(tmp_path / "none.pt"), "SCORER_DEVICE": "cpu", "SCORER_READY_WAIT_S": "5"}
    refused_without_weights(
        "hpsv2", env, "SCORER_HPSV2_MODEL", {"images": sample_images(1), "prompts": ["p"]}, tmp_path
    )
