"""Attacks on the ``multi`` service (issue 20) against the running service, as an HTTP client with
no token and requests of a few KB, and as a trainer that must never be handed a wrong score:
each test asserts what SHOULD happen. Written to fail on the code they were found on (the
issue20-core branch at 932c533).

One multi service serves OCR, PickScore and an aesthetic score whose head gives NaN (a model's
fault, as an fp16 overflow gives), one item per batch and a queue of three, so that concurrent
requests fill a reward's queue.
"""

from __future__ import annotations

import base64
import io
import math
import pickle
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests
import torch
from PIL import Image

from services.aesthetic.settings import DEFAULT_HEAD
from testing.images import render_text
from testing.multi import multi_server
from testing.server import Server, gunicorn_server

IMAGE = render_text("Open", size=256)
PROMPT = 'a sign that says "Open"'
# OCR refuses a prompt whose quoted target is empty (422), for its sample alone.
REFUSED_BY_OCR = 'a sign that says ""'
TOKEN = "attack-multi-secret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
QUEUE = 3
WORK_BYTES = 256 * 2**20


def nan_head(path: Path) -> Path:
    """The LAION aesthetic head with every weight NaN: a model whose every output is NaN."""
    state = torch.load(DEFAULT_HEAD, map_location="cpu", weights_only=True)
    torch.save({name: torch.full_like(tensor, math.nan) for name, tensor in state.items()}, path)
    return path


@pytest.fixture(scope="module")
def multi(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    models = tmp_path_factory.mktemp("models")
    env = {
        "SCORER_AESTHETIC_HEAD": str(nan_head(models / "nan-head.pth")),
        "SCORER_MAX_BATCH": "1",
        "SCORER_MAX_QUEUE": str(QUEUE),
        "SCORER_AUTH_TOKEN": TOKEN,
    }
    logs = tmp_path_factory.mktemp("logs")
    with multi_server(["ocr", "pickscore", "aesthetic"], models, env, threads=32, log_dir=logs) as server:
        yield server


@pytest.fixture(scope="module")
def clip_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """PickScore and the aesthetic score (its shipped head), with 256 MiB of request work."""
    models, logs = tmp_path_factory.mktemp("pair-models"), tmp_path_factory.mktemp("pair-logs")
    env = {"SCORER_MAX_WORK_BYTES": str(WORK_BYTES)}
    with multi_server(["pickscore", "aesthetic"], models, env, threads=8, log_dir=logs) as server:
        yield server


@pytest.fixture(scope="module")
def single_ocr(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with gunicorn_server("ocr", {"SCORER_DEVICE": "cpu"}, log_dir=tmp_path_factory.mktemp("ocr-logs")) as server:
        yield server


def post(url: str, query: str = "", prompts: list[str] | None = None, **payload: Any) -> tuple[int, dict]:
    prompts = prompts or [PROMPT]
    body = pickle.dumps({"images": [IMAGE] * len(prompts), "prompts": prompts, **payload})
    response = requests.post(f"{url}/{query}", data=body, headers=AUTH, timeout=120)
    return response.status_code, pickle.loads(response.content)


@pytest.mark.parametrize("query", ["?ocr=1.7e308&pickscore=-1e308", "?ocr=-1.7e308&pickscore=1e308"])
def test_weights_whose_sum_overflows_are_a_422_not_an_infinite_score(multi: Server, query: str) -> None:
    """Each weight and each weighted score is finite, their sum is not (PickScore's score here is
    about -0.2): was a 500 (fsum's intermediate overflow); with a weighted score over the largest
    float (the aesthetic score of 4.7 at weight 1e308), a 200 whose score is ``inf``."""
    status, answer = post(multi.url, query)
    assert status == 422, answer
    assert "overflow" in answer["error"]


def test_an_overflowing_sum_is_refused_in_json_too(multi: Server) -> None:
    body = {"images": [base64.b64encode(IMAGE).decode()], "prompts": [PROMPT]}
    response = requests.post(f"{multi.url}/?ocr=1.7e308&pickscore=-1e308", json=body, headers=AUTH, timeout=120)
    assert response.status_code == 422, response.text
    assert "Infinity" not in response.text


def test_a_single_service_refuses_the_rewards_it_would_ignore(single_ocr: Server) -> None:
    """VeRL-Omni pointed at the OCR service with a multi service's URL, or flow_grpo with its
    metadata: was a 200 with OCR's own score (1.0) where the trainer expects 0.5 x OCR + 0.5 x
    PickScore."""
    status, answer = post(single_ocr.url, "?ocr=0.5&pickscore=0.5")
    assert status == 422, answer
    assert "query" in answer["error"] and "multi" in answer["error"]
    # flow_grpo's form of the same request
    status, answer = post(single_ocr.url, metadata={"rewards": {"ocr": 0.5, "pickscore": 0.5}})
    assert status == 422, answer
    assert "metadata['rewards']" in answer["error"] and "multi" in answer["error"]
    status, answer = post(single_ocr.url)
    assert status == 200 and answer["scores"] == [1.0], answer


def test_a_sample_only_weightless_rewards_scored_is_not_a_false_zero(multi: Server) -> None:
    """OCR (weight 1, optional) refuses sample 1's prompt; PickScore has weight 0 (watched in
    ``details``). Sample 1's sum would be 0 x PickScore = 0, a measurement of nothing: it is NaN,
    for that sample alone (it was a 422 for the request, losing sample 0's score too)."""
    status, answer = post(multi.url, "?ocr=1!optional&pickscore=0", [PROMPT, REFUSED_BY_OCR])
    assert status == 200 and answer["dropped"] == [1], answer
    assert answer["scores"][0] == 1.0 and math.isnan(answer["scores"][1])
    # With weight on PickScore, the sample keeps PickScore's part, OCR counted at its lowest (0).
    status, answer = post(multi.url, "?ocr=1!optional&pickscore=0.5", [PROMPT, REFUSED_BY_OCR])
    assert status == 200 and answer["dropped"] == [1], answer
    assert answer["scores"][1] == pytest.approx(0.5 * answer["details"]["pickscore"][1])


def test_every_weight_zero_answers_zero_sums_and_true_details(multi: Server) -> None:
    """All weights 0 is a request for the details alone (monitoring): the sums are 0, exactly."""
    status, answer = post(multi.url, "?ocr=0&pickscore=0")
    assert status == 200, answer
    assert answer["scores"] == [0.0] and answer["details"]["ocr"] == [1.0]


def test_a_model_giving_nan_gives_no_sum_and_lists_an_optional_one_as_dropped(multi: Server) -> None:
    """The aesthetic head gives NaN, as the aesthetic service alone answers it: required, the
    sample's sum is NaN (no verdict, never a 500 losing the request's other samples); optional,
    the sample is listed in ``dropped`` and its sum is NaN too, since the aesthetic score has no
    lowest value to count it at (summing the others would raise the sum of a sample that made
    the reward fail)."""
    status, answer = post(multi.url, "?ocr=1&aesthetic=1")
    assert status == 200 and answer["dropped"] == [], answer
    assert math.isnan(answer["scores"][0]) and math.isnan(answer["details"]["aesthetic"][0])
    status, answer = post(multi.url, "?ocr=1&aesthetic=1!optional")
    assert status == 200 and answer["dropped"] == [0], answer
    assert math.isnan(answer["scores"][0]) and answer["details"]["ocr"] == [1.0]


def test_an_optional_reward_whose_queue_is_full_is_waited_for_not_dropped(multi: Server) -> None:
    """PickScore's queue holds three items; 24 concurrent requests fill it. A full queue says
    nothing about a sample: was a 200 without PickScore's part (``dropped``), so the same
    sample's reward changed with the node's load; then a 503; now each request waits for room
    within its deadline and is scored whole."""
    with ThreadPoolExecutor(24) as pool:
        answers = list(pool.map(lambda _: post(multi.url, "?ocr=1&pickscore=1!optional"), range(48)))
    assert all(status == 200 and answer["dropped"] == [] for status, answer in answers), answers
    # Alone, the same request is scored whole.
    status, answer = post(multi.url, "?ocr=1&pickscore=1!optional")
    assert status == 200 and answer["dropped"] == [], answer


def tiny_pngs(count: int) -> list[bytes]:
    """``count`` distinct 8x8 PNGs, ~70 bytes each."""
    pngs = []
    for index in range(count):
        buffer = io.BytesIO()
        Image.new("RGB", (8, 8), (index % 256, index // 256, 90)).save(buffer, "PNG")
        pngs.append(buffer.getvalue())
    return pngs


def test_each_rewards_model_inputs_count_in_the_work_bytes(clip_pair: Server) -> None:
    """150 8x8 PNGs (12 KB): 115 KB of decoded pixels, but each CLIP reward makes a 1.2 MB input
    of each (224x224x3 float32, stacked once more into its batch), 180 MB a reward. Was a 200
    for both rewards (the inputs not counted: a few KB of body held gigabytes, 1,024 such images
    took a worker 1.6 GB higher); now one reward fits the 256 MiB, two are a 413 that names them."""
    count = 150
    body = pickle.dumps({"images": tiny_pngs(count), "prompts": ["a red square"] * count})
    assert len(body) < 16_000
    answer = requests.post(f"{clip_pair.url}/?pickscore=1", data=body, timeout=300)
    assert answer.status_code == 200, pickle.loads(answer.content)
    answer = requests.post(f"{clip_pair.url}/?pickscore=1&aesthetic=1", data=body, timeout=300)
    error = pickle.loads(answer.content)
    assert answer.status_code == 413, error
    assert "aesthetic inputs" in error["error"] and "SCORER_MAX_WORK_BYTES" in error["error"]


def test_an_optional_reward_a_bound_on_the_request_refuses_drops_from_every_sample(clip_pair: Server) -> None:
    """The two rewards' inputs of 150 8x8 PNGs are over the 256 MiB of work, each one's alone
    under it. An optional reward was re-checked sample by sample, each check holding
    its input in the same request: the first samples kept it, the rest dropped it (one group's
    sums with and without it), and checked first it left the required one refused for its
    reservations. It drops from every sample, in either order, each counted at PickScore's lowest
    score (minus its factor), the same for every sample."""
    count = 150
    body = pickle.dumps({"images": tiny_pngs(count), "prompts": ["a red square"] * count})
    for query in ("?aesthetic=1&pickscore=1!optional", "?pickscore=1!optional&aesthetic=1"):
        answer = requests.post(f"{clip_pair.url}/{query}", data=body, timeout=300)
        result = pickle.loads(answer.content)
        assert answer.status_code == 200, (query, result)
        assert result["dropped"] == list(range(count)), (query, result["dropped"])
        assert all(math.isnan(score) for score in result["details"]["pickscore"]), query
        dropped_terms = {s - a for s, a in zip(result["scores"], result["details"]["aesthetic"])}
        assert len({round(term, 9) for term in dropped_terms}) == 1 and min(dropped_terms) < 0, (query, dropped_terms)


def test_an_image_referenced_many_times_is_preprocessed_once_per_reward(clip_pair: Server) -> None:
    """One 8x8 PNG referenced 220 times by the pickle memo: decoded once, but each CLIP reward
    preprocessed it once per reference, 220 equal 1.2 MB inputs (264 MB a reward, the 413 of 220
    distinct images); now once per reward, its input shared by the references, and the request
    holds one input a reward."""
    count = 220
    body = pickle.dumps({"images": tiny_pngs(1) * count, "prompts": ["a red square"] * count})
    assert len(body) < 2_000
    answer = requests.post(f"{clip_pair.url}/?pickscore=1&aesthetic=1", data=body, timeout=300)
    result = pickle.loads(answer.content)
    assert answer.status_code == 200, result
    assert len(set(result["scores"])) == 1 and len(result["scores"]) == count


@pytest.mark.parametrize("query", ["?pickscore=1", "?pickscore=1!optional"])
def test_the_pixels_clip_resizes_to_count_in_the_requests_pixels(clip_pair: Server, query: str) -> None:
    """A 1x50 PNG (70 bytes) referenced 64 times: 3,200 pixels by the request's limits, but CLIP
    resizes each to 224x11200 (2.5 Mpx, ~0.1 s of one core) before its centre crop, once per
    reference and per reward. Was a 200 after seconds of CPU for a 400-byte body (1,024 such
    references: over 100 s a reward); now a 413 from the headers, as 160 Mpx of images are. An
    optional reward's bounds were checked one sample at a time, each within every bound: the
    request's bounds are checked first, a refusal no sample earns alone is the request's."""
    buffer = io.BytesIO()
    Image.new("RGB", (1, 50), (200, 10, 10)).save(buffer, "PNG")
    body = pickle.dumps({"images": [buffer.getvalue()] * 64, "prompts": ["a red line"] * 64})
    assert len(body) < 1_000
    answer = requests.post(f"{clip_pair.url}/{query}", data=body, timeout=300)
    error = pickle.loads(answer.content)
    assert answer.status_code == 413, error
    assert "SCORER_MAX_REQUEST_PIXELS" in error["error"] and "224x11200" in error["error"]


def test_a_rewards_refusal_names_the_reward(multi: Server) -> None:
    """Four samples for PickScore's queue of three: was "4 items in one request; the batch queue
    holds 3", not saying which of the request's rewards refused it (OCR's queue holds three too);
    now the reward's name first, its status kept; as for a refusal of a sample's input."""
    distinct = [render_text(word, size=256) for word in ("Open", "Shop", "Cafe", "Bank")]  # OCR reads each once
    for reward in ("pickscore", "ocr"):
        status, answer = post(multi.url, f"?{reward}=1", [PROMPT] * (QUEUE + 1), images=distinct)
        assert status == 413, answer
        assert answer["error"].startswith(f"{reward}: 4 items in one request; the batch queue holds 3"), answer
    status, answer = post(multi.url, "?ocr=1&pickscore=1", [REFUSED_BY_OCR])
    assert status == 422, answer
    assert answer["error"].startswith("ocr: ") and "quoted target" in answer["error"], answer


def test_no_token_is_a_401_before_the_query_is_read_and_info_masks_the_token(multi: Server) -> None:
    """Without the token, an unknown reward in the query answers 401 (not the 422 that lists the
    served rewards); ``/info`` shows the token masked."""
    body = pickle.dumps({"images": [IMAGE], "prompts": [PROMPT]})
    response = requests.post(f"{multi.url}/?nosuchreward=1", data=body, timeout=60)
    assert response.status_code == 401
    info = requests.get(f"{multi.url}/info", timeout=10).text
    assert TOKEN not in info and '"auth_token":"***"' in info
