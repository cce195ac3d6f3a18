"""The GenEval service end to end under gunicorn, on a tiny random Mask2Former and a tiny random
CLIP loaded as real weights are: flow_grpo's request and its five lists, the core protocol and
its JSON twin, bad input as 4xx (flow_grpo's client retries a 500 a thousand times).

``SCORER_TEST_FLOW_GRPO_REWARDS``: the path of flow_grpo's ``flow_grpo/rewards.py`` (not
shipped); when set, its ``geneval_score`` runs unchanged against the service, which then listens
on the port that client posts to (18085)."""

from __future__ import annotations

import base64
import io
import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
from PIL import Image, ImageDraw
from requests.adapters import HTTPAdapter, Retry

from testing import fetched
from testing import geneval_reference as reference
from testing.geneval_models import geneval_service_settings
from testing.server import Server, gunicorn_server

pytestmark = pytest.mark.integration

FLOW_GRPO_REWARDS = os.environ.get("SCORER_TEST_FLOW_GRPO_REWARDS")
FLOW_GRPO_PORT = 18085
OPTIONS = {"threshold": 0.3, "counting_threshold": 0.9, "max_objects": 16, "position_threshold": 0.1}
# GenEval metadata of every tag, with colours, positions and exclude clauses, for classes the tiny
# detector finds (see testing/geneval_models.py).
METADATAS: list[dict[str, Any]] = [
    {"tag": "single_object", "include": [{"class": "dog", "count": 1}], "prompt": "a photo of a dog"},
    {"tag": "two_object", "include": [{"class": "dog", "count": 1}, {"class": "cat", "count": 1}], "prompt": "p"},
    {"tag": "counting", "include": [{"class": "dog", "count": 2}], "exclude": [{"class": "dog", "count": 3}]},
    {"tag": "colors", "include": [{"class": "dog", "count": 1, "color": "red"}], "prompt": "a red dog"},
    {
        "tag": "position",
        "include": [{"class": "cat", "count": 1}, {"class": "dog", "count": 1, "position": ["left of", 0]}],
        "prompt": "a dog left of a cat",
    },
    {
        "tag": "color_attr",
        "include": [{"class": "dog", "count": 1, "color": "blue"}, {"class": "cup", "count": 1, "color": "red"}],
        "prompt": "a blue dog and a red cup",
    },
]


def scene(seed: int, size: tuple[int, int] = (80, 64)) -> np.ndarray:
    rng = np.random.default_rng(seed)
    image = Image.new("RGB", size, (20, 20, 20))
    draw = ImageDraw.Draw(image)
    for _ in range(4):
        x, y = int(rng.integers(0, size[0] - 10)), int(rng.integers(0, size[1] - 10))
        draw.rectangle([x, y, x + 14, y + 11], fill=tuple(int(v) for v in rng.integers(0, 255, 3)))
    return np.array(image)


def jpeg(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG")  # as flow_grpo's client: PIL's default quality
    return out.getvalue()


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The service's settings for the tiny random models."""
    return geneval_service_settings(tmp_path_factory.mktemp("geneval-models"))


@pytest.fixture(scope="module")
def server(models: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    logs = tmp_path_factory.mktemp("geneval-logs")
    port = FLOW_GRPO_PORT if FLOW_GRPO_REWARDS else 0
    with gunicorn_server("geneval", env=models, threads=8, require_ready=False, log_dir=logs, port=port) as server:
        server.wait_ready(timeout=400)
        yield server


def flow_grpo_post(url: str, images: list[bytes], metadatas: list[dict[str, Any]], only_strict: bool) -> dict:
    """What flow_grpo's ``geneval_score`` sends, as it sends it (a session retrying 500s)."""
    session = requests.Session()
    session.mount("http://", HTTPAdapter(max_retries=Retry(total=3, backoff_factor=1, status_forcelist=[500])))
    body = pickle.dumps({"images": images, "meta_datas": metadatas, "only_strict": only_strict})
    response = session.post(url, data=body, timeout=120)
    assert response.status_code == 200, response.content[:500]
    return pickle.loads(response.content)


def rejudged(answer: dict, metadatas: list[dict[str, Any]], only_strict: bool) -> dict:
    """The reference's five lists from the answer's own detections and colours."""
    samples = []
    colors: dict[int, str] = {}
    for details, metadata in zip(answer["details"], metadatas):
        bbox: dict[str, list[list[float]]] = {}
        for detection in details["detections"]:
            key = len(colors) + 1000 * len(samples)
            colors[key] = detection.get("color", "")
            bbox.setdefault(detection["class"], []).append([*detection["box"], detection["confidence"], key])
        samples.append(({name: np.array(rows, dtype=np.float32) for name, rows in bbox.items()}, metadata))

    def color_fn(classname: str, rows: list[np.ndarray]) -> list[str]:
        return [colors[int(row[5])] for row in rows]

    return reference.compute(samples, only_strict, color_fn, OPTIONS)


@pytest.mark.parametrize("only_strict", [False, True])
def test_flow_grpos_request_gets_its_five_lists(server: Server, only_strict: bool) -> None:
    metadatas = METADATAS * 2
    images = [jpeg(scene(seed)) for seed in range(len(metadatas))]
    answer = flow_grpo_post(server.url, images, metadatas, only_strict)
    five = ("scores", "rewards", "strict_rewards", "group_rewards", "group_strict_rewards")
    assert set(five) <= set(answer)
    assert all(len(answer[key]) == len(images) for key in ("scores", "rewards", "strict_rewards"))
    assert set(answer["group_rewards"]) == set(reference.GROUP_KEYS)
    assert {key: answer[key] for key in five} == rejudged(answer, metadatas, only_strict)
    # The detector found things and (GenEval's rule asks for colours where at least the count is
    # found) the colour clauses were judged.
    assert any(details["detections"] for details in answer["details"])
    assert only_strict or any("color" in d for details in answer["details"] for d in details["detections"])
    assert len(set(answer["scores"])) > 1


def test_the_core_protocol_and_its_json_twin_agree_with_flow_grpos(server: Server) -> None:
    images = [jpeg(scene(seed)) for seed in range(len(METADATAS))]
    flow = flow_grpo_post(server.url, images, METADATAS, False)
    prompts = [m.get("prompt", "") for m in METADATAS]
    core = requests.post(
        server.url + "/score",
        data=pickle.dumps({"images": images, "prompts": prompts, "metadata": {"geneval": METADATAS}}),
        timeout=120,
    )
    twin = requests.post(
        server.url + "/score",
        json={
            "images": [base64.b64encode(image).decode() for image in images],
            "prompts": prompts,
            "metadata": {"geneval": METADATAS},
        },
        timeout=120,
    )
    assert core.status_code == twin.status_code == 200
    for answer in (pickle.loads(core.content), twin.json()):
        assert answer["scores"] == answer["outputs"] == flow["scores"]
        assert answer["rewards"] == flow["rewards"] and answer["strict_rewards"] == flow["strict_rewards"]
        assert answer["tag"] == [m["tag"] for m in METADATAS]


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"images": "IMAGES", "meta_datas": [{"include": []}], "only_strict": False}, "tag"),
        (
            {"images": "IMAGES", "meta_datas": [{"tag": "counting", "include": [{"class": "unicorn", "count": 1}]}]},
            "80",
        ),
        ({"images": "IMAGES", "meta_datas": METADATAS[:1] * 2, "only_strict": False}, "1 images but 2 'meta_datas'"),
        ({"images": "IMAGES", "meta_datas": "dog", "only_strict": False}, "meta_datas"),
        ({"images": "IMAGES", "meta_datas": METADATAS[:1], "only_strict": "yes"}, "true or false"),
        ({"images": "IMAGES", "prompts": ["p"]}, "metadata['geneval']"),
        ({"videos": [["IMAGE", "IMAGE"]], "prompts": ["p"], "metadata": {"geneval": METADATAS[:1]}}, "videos"),
    ],
)
def test_bad_input_is_a_422_never_a_500(server: Server, payload: dict[str, Any], message: str) -> None:
    image = jpeg(scene(0))
    payload = {
        key: [image] if value == "IMAGES" else [[image, image]] if key == "videos" else value
        for key, value in payload.items()
    }
    response = requests.post(server.url, data=pickle.dumps(payload), timeout=120)
    assert response.status_code == 422, response.content[:300]
    assert message in pickle.loads(response.content)["error"]


def test_info_names_the_detector_and_the_thresholds(server: Server) -> None:
    info = requests.get(server.url + "/info", timeout=10).json()["model"]
    assert info["detector"].endswith("detector") and info["clip"].endswith("clip")
    assert info["detector_source"] == "directory"
    assert info["thresholds"] == {
        "threshold": 0.3,
        "counting_threshold": 0.9,
        "max_objects": 16,
        "position_threshold": 0.1,
    }


def test_the_multi_service_serves_geneval_as_one_more_reward(
    server: Server, models: dict[str, str], tmp_path: Path
) -> None:
    images = [jpeg(scene(seed)) for seed in range(len(METADATAS))]
    body = {"images": images, "prompts": [""] * len(images), "metadata": {"geneval": METADATAS}}
    alone = pickle.loads(requests.post(server.url, data=pickle.dumps(body), timeout=120).content)
    env = {**models, "SCORER_MULTI_REWARDS": "geneval"}
    with gunicorn_server("multi", env=env, threads=8, require_ready=False, log_dir=tmp_path) as multi:
        multi.wait_ready(timeout=400)
        response = requests.post(multi.url, data=pickle.dumps(body), timeout=120)
    assert response.status_code == 200, response.content[:300]
    combined = pickle.loads(response.content)
    assert combined["details"]["geneval"] == combined["scores"] == alone["scores"]


@pytest.mark.skipif(not FLOW_GRPO_REWARDS, reason="SCORER_TEST_FLOW_GRPO_REWARDS names no copy of flow_grpo/rewards.py")
def test_flow_grpos_own_client_unchanged(server: Server) -> None:
    score = fetched.load_module(Path(str(FLOW_GRPO_REWARDS)), "flow_grpo_rewards").geneval_score("cpu")
    pixels = np.stack([scene(seed) for seed in range(len(METADATAS))])
    scores, rewards, strict, groups, strict_groups = score(pixels, [""] * len(METADATAS), METADATAS, False)
    assert len(scores) == len(rewards) == len(strict) == len(METADATAS)
    assert set(groups) == set(strict_groups) == set(reference.GROUP_KEYS)
    direct = flow_grpo_post(server.url, [jpeg(p) for p in pixels], METADATAS, False)
    assert scores == direct["scores"] and groups == direct["group_rewards"]


def test_multi_drops_an_optional_geneval_from_the_sample_it_refuses_alone(
    server: Server, models: dict[str, str], tmp_path: Path
) -> None:
    """One sample's GenEval metadata names an unknown tag: GenEval, optional, is dropped from that
    sample alone, counted there at its lowest score (2 - max_objects: 1 - 15/1 for one object of
    a count of 1 with 16 found), so that no sample gains by making it fail; the others keep
    GenEval's own scores. On 40d4ae2 it was dropped from every sample (``dropped: [0, 1, 2]``):
    the samples left were checked, and prepared, against the wrong metadata entries."""
    metadatas = [METADATAS[0], {"tag": "no such tag", "include": [{"class": "dog", "count": 1}]}, METADATAS[3]]
    images = [jpeg(scene(seed)) for seed in range(3)]
    prompts = ['a sign that says "dog"'] * 3
    kept = {
        "images": [images[0], images[2]],
        "prompts": [""] * 2,
        "metadata": {"geneval": [metadatas[0], metadatas[2]]},
    }
    alone = pickle.loads(requests.post(server.url, data=pickle.dumps(kept), timeout=120).content)["scores"]
    body = {"images": images, "prompts": prompts, "metadata": {"geneval": metadatas}}
    env = {**models, "SCORER_MULTI_REWARDS": "geneval,ocr", "SCORER_DEVICE": "cpu"}
    with gunicorn_server("multi", env, threads=8, require_ready=False, log_dir=tmp_path) as multi:
        multi.wait_ready(timeout=400)
        response = requests.post(f"{multi.url}/?ocr=1&geneval=1!optional", data=pickle.dumps(body), timeout=120)
        assert response.status_code == 200, response.content[:300]
        answer = pickle.loads(response.content)
        required = requests.post(f"{multi.url}/?ocr=1&geneval=1", data=pickle.dumps(body), timeout=120)
    assert answer["dropped"] == [1], answer
    details = answer["details"]
    assert [details["geneval"][0], details["geneval"][2]] == alone and np.isnan(details["geneval"][1])
    lowest = 2 - OPTIONS["max_objects"]
    assert answer["scores"][1] == details["ocr"][1] + lowest, answer
    assert required.status_code == 422 and "metadata['geneval'][1]" in pickle.loads(required.content)["error"]
