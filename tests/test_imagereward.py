"""ImageReward on its real loading path: random checkpoints in the release's layout
(``ImageReward.pt`` + ``med_config.json``, testing/imagereward_models.py) served by gunicorn;
the ``image-reward`` package itself, in its own environment, scores ImageReward's ViT-L layout
for the reference comparison."""

from __future__ import annotations

import io
import json
import pickle
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import requests
import torch
from PIL import Image

from common.configuration.config import ConfigError
from common.configuration.settings import CoreSettings
from services.imagereward.model import ImageRewardModel
from services.imagereward.scorer import ImageRewardScorer
from testing.imagereward_models import med_config, save_checkpoint, save_tokenizer
from testing.images import encode, sample_images
from testing.multi import multi_server, reward_settings
from testing.reference import IMAGEREWARD_PYTHON, needs_imagereward, run_reference
from testing.server import batch_stats, post, running_server, scores_of

# Prompts of every shape: empty, blank, words the vocabulary lacks, upper case and accents
# (BERT lower-cases and strips them), CJK, BLIP's own [DEC] / [ENC] spelled out, control
# characters, and past the 35 tokens the package truncates to.
PROMPTS = [
    "a red cat sitting on a table",
    "",
    "   \t\n ",
    "A BLUE Dog, très Grand!",
    "猫 and 狗 中文 zebra",
    "[DEC] [ENC] [SEP] [CLS] [PAD]",
    "a\x00b\x1fc\u200bd\ufeff",
    "a photo of a small green tree in the sky " * 20,
]
TOKENS = 35


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_checkpoint(tmp_path_factory.mktemp("imagereward"))


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def model(weights: Path, tokenizer: Path) -> ImageRewardModel:
    return ImageRewardModel(str(weights), str(tokenizer), "cpu", "float32", 8)


@pytest.fixture(scope="module")
def images() -> list[bytes]:
    return sample_images(8)


def in_process(model: ImageRewardModel, images: list[bytes], prompts: list[str]) -> list[float]:
    """Each sample alone through the model: no batch, no shared image."""
    decoded = [Image.open(io.BytesIO(data)).convert("RGB") for data in images]
    return [model.scores(model.prepare([image], [prompt]))[0] for image, prompt in zip(decoded, prompts)]


@pytest.fixture(scope="module")
def server(weights: Path, tokenizer: Path) -> str:
    env = {
        "SCORER_IMAGEREWARD_WEIGHTS": str(weights),
        "SCORER_IMAGEREWARD_TOKENIZER": str(tokenizer),
        "SCORER_DEVICE": "cpu",
        "SCORER_MAX_WAIT_MS": "20",
    }
    with running_server("imagereward", env=env, threads=96) as url:
        yield url


def test_scores_spread_over_images_and_prompts(model: ImageRewardModel, images: list[bytes]) -> None:
    """Different images, and one image with different prompts, score differently, or the
    comparisons below would prove nothing."""
    by_image = in_process(model, images, [PROMPTS[0]] * len(images))
    by_prompt = in_process(model, [images[0]] * len(PROMPTS), PROMPTS)
    assert np.std(by_image) > 0.01 and np.std(by_prompt) > 0.01


def test_one_request_matches_each_sample_alone(server: str, model: ImageRewardModel, images: list[bytes]) -> None:
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(len(images))]
    scores = scores_of(post(server, {"images": images, "prompts": prompts, "metadata": {}}))
    np.testing.assert_allclose(scores, in_process(model, images, prompts), rtol=1e-5, atol=1e-5)


def test_concurrent_one_image_requests_batch_and_match(
    server: str, model: ImageRewardModel, images: list[bytes]
) -> None:
    order = [(i % len(images), i % len(PROMPTS)) for i in range(48)]
    expected = in_process(model, [images[i] for i, _ in order], [PROMPTS[p] for _, p in order])
    count_before, sum_before = batch_stats(server, "imagereward")
    with ThreadPoolExecutor(48) as pool:
        payloads = [{"images": [images[i]], "prompts": [PROMPTS[p]]} for i, p in order]
        responses = list(pool.map(lambda payload: post(server, payload), payloads))
    count_after, sum_after = batch_stats(server, "imagereward")
    np.testing.assert_allclose([scores_of(r)[0] for r in responses], expected, rtol=1e-5, atol=1e-5)
    assert sum_after - sum_before == 48
    assert count_after - count_before < 48, "concurrent requests were never batched together"


def test_many_references_to_one_image(server: str, model: ImageRewardModel, images: list[bytes]) -> None:
    """One bytes object 300 times (the pickle memo sends it once), each with its own prompt: each
    scores as that image alone with that prompt."""
    image = images[1]
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(300)]
    scores = scores_of(post(server, {"images": [image] * 300, "prompts": prompts}))
    alone = in_process(model, [image] * len(PROMPTS), PROMPTS)
    np.testing.assert_allclose(scores, [alone[i % len(PROMPTS)] for i in range(300)], rtol=1e-5, atol=1e-5)


def test_an_image_referenced_several_times_is_prepared_once(model: ImageRewardModel, images: list[bytes]) -> None:
    image, other = (Image.open(io.BytesIO(data)).convert("RGB") for data in images[:2])
    items = model.prepare([image, other, image], ["a", "b", "c"])
    assert items[0].pixels is items[2].pixels and items[1].pixels is not items[0].pixels


def test_prompts_are_truncated_to_35_tokens_as_the_package_does(model: ImageRewardModel, images: list[bytes]) -> None:
    """A prompt past 35 tokens scores as its first 33 word pieces between [CLS] and [SEP]."""
    [long] = model.prepare([Image.new("RGB", (64, 64))], [PROMPTS[-1]])
    assert long.input_ids.shape == (TOKENS,) and int(long.attention_mask.sum()) == TOKENS
    words = PROMPTS[-1].split()
    assert model.tokenizer.convert_ids_to_tokens(long.input_ids.tolist())[1:-1] == words[:33]
    [longer, cut] = in_process(model, [images[2]] * 2, [PROMPTS[-1] + " cat dog", " ".join(words[:33])])
    assert longer == pytest.approx(cut, abs=1e-6)


@pytest.mark.parametrize(
    ("image", "status", "message"),
    [
        (encode(Image.new("RGB", (1, 300_000)), "PNG"), 422, "aspect ratio"),
        (encode(Image.new("RGB", (5000, 5000)), "PNG"), 413, "pixels"),
        (b"not an image", 422, "could not be decoded"),
    ],
)
def test_bad_images_get_clear_errors(server: str, image: bytes, status: int, message: str) -> None:
    response = post(server, {"images": [image], "prompts": ["p"]})
    assert response.status_code == status
    assert message in pickle.loads(response.content)["error"]


@pytest.mark.parametrize("size", [(1, 1), (2, 3), (7, 224), (40, 1)])
def test_tiny_images_score_as_the_model_scores_them(
    server: str, model: ImageRewardModel, size: tuple[int, int]
) -> None:
    image = encode(Image.new("RGB", size, (250, 10, 90)), "PNG")
    [score] = scores_of(post(server, {"images": [image], "prompts": ["a red cat"]}))
    assert score == pytest.approx(in_process(model, [image], ["a red cat"])[0], abs=1e-5)


def test_multi_serves_it_by_flow_grpo_s_name(tmp_path: Path, images: list[bytes]) -> None:
    """``imagereward`` beside another reward in one ``multi`` call: its detail is the single
    service's score on the same settings, and the sum weighs it."""
    payload = {"images": images[:4], "prompts": PROMPTS[:4]}
    with multi_server(["imagereward", "aesthetic"], tmp_path, threads=16) as multi:
        response = requests.post(multi.url + "/?imagereward=0.5&aesthetic=1", data=pickle.dumps(payload), timeout=120)
        assert response.status_code == 200, response.content[:500]
        answer = pickle.loads(response.content)
    with running_server("imagereward", env=reward_settings(["imagereward"], tmp_path / "single")) as single:
        alone = scores_of(post(single, payload))
    assert answer["details"]["imagereward"] == pytest.approx(alone, abs=1e-6)
    for index, score in enumerate(answer["scores"]):
        assert score == pytest.approx(0.5 * alone[index] + answer["details"]["aesthetic"][index], abs=1e-6)


def test_info_describes_the_model(server: str, weights: Path) -> None:
    info = requests.get(server + "/info", timeout=10).json()["model"]
    assert info["weights"] == str(weights) and info["precision"] == "float32" and info["micro_batch"] == 8


def make_scorer(monkeypatch: pytest.MonkeyPatch, **settings: str) -> ImageRewardScorer:
    for name, value in settings.items():
        monkeypatch.setenv(f"SCORER_IMAGEREWARD_{name.upper()}", value)
    return ImageRewardScorer(CoreSettings(service="imagereward"))


def test_a_directory_without_the_release_s_files_names_the_setting(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer: Path
) -> None:
    scorer = make_scorer(monkeypatch, weights=str(tmp_path), tokenizer=str(tokenizer))
    with pytest.raises(ConfigError, match=r"SCORER_IMAGEREWARD_WEIGHTS.*ImageReward\.pt"):
        scorer.setup("cpu")


def test_a_checkpoint_of_another_model_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer: Path
) -> None:
    torch.save({"layers.0.weight": torch.zeros(2, 2)}, tmp_path / "ImageReward.pt")
    (tmp_path / "med_config.json").write_text(json.dumps(med_config()))
    scorer = make_scorer(monkeypatch, weights=str(tmp_path), tokenizer=str(tokenizer))
    with pytest.raises(ConfigError, match=r"is not ImageReward-v1\.0's.*unknown tensor 'layers\.0\.weight'"):
        scorer.setup("cpu")


def test_a_tokenizer_larger_than_the_bert_s_vocabulary_is_refused(
    monkeypatch: pytest.MonkeyPatch, weights: Path, tmp_path: Path, tokenizer: Path
) -> None:
    bigger = tmp_path / "tokenizer"
    bigger.mkdir()
    (bigger / "vocab.txt").write_text((tokenizer / "vocab.txt").read_text() + "zebra\n")
    scorer = make_scorer(monkeypatch, weights=str(weights), tokenizer=str(bigger))
    with pytest.raises(ConfigError, match="not this checkpoint's tokenizer"):
        scorer.setup("cpu")


@needs_imagereward
def test_scores_equal_the_image_reward_package(tmp_path: Path, images: list[bytes]) -> None:
    """ImageReward's own layout (ViT-L/16; a 2-layer BERT at the release's width), scored by
    ``image-reward`` 1.5 (``score`` and flow_grpo's ``inference_rank(prompt, [image])``) and by
    the service's model on the same files: the same tensors in the same layout, the same
    tokens, the same scores."""
    weights = save_checkpoint(tmp_path / "weights", vision="large", text="small", dtype=torch.float16)
    workdir = tmp_path / "work"
    tokenizer = save_tokenizer(workdir / "bert-base-uncased")
    paths = []
    for i, data in enumerate(images[: len(PROMPTS)]):
        paths.append(tmp_path / f"{i}.png")
        Image.open(io.BytesIO(data)).convert("RGB").save(paths[-1])
    job = {
        "workdir": str(workdir),
        "checkpoint": str(weights / "ImageReward.pt"),
        "med_config": str(weights / "med_config.json"),
        "images": [str(path) for path in paths],
        "prompts": PROMPTS,
    }
    reference = run_reference("imagereward_reference.py", job, python=IMAGEREWARD_PYTHON, timeout=1500)
    stored = torch.load(weights / "ImageReward.pt", weights_only=True)
    assert reference["shapes"] == {key: list(tensor.shape) for key, tensor in stored.items()}
    model = ImageRewardModel(str(weights), str(tokenizer), "cpu", "float32", 8)
    decoded = [Image.open(path) for path in paths]
    items = model.prepare(decoded, PROMPTS)
    assert [item.input_ids.tolist() for item in items] == reference["tokens"]
    ours = model.scores(items)
    np.testing.assert_allclose(reference["rank"], reference["score"], rtol=0, atol=1e-6)
    assert np.std(reference["score"]) > 0.05
    np.testing.assert_allclose(ours, reference["score"], rtol=0, atol=1e-4)
