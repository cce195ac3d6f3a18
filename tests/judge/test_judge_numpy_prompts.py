"""flow_grpo's ``unifiedreward_score_remote`` against the judge (``unifiedreward-v1``) in front of
the stand-in engine: its prompts go as numpy arrays (``np.array_split`` chunks of 64, pickled by
numpy), which the judge once refused (400, ``KeyError('outputs')`` in flow_grpo). Its scores
equal the judge's on the core protocol for the same JPEGs and prompts, and the engine's reply
depends on each prompt, so a prompt decoded wrong is a wrong score.

Where ``SCORER_TEST_FLOW_GRPO_REWARDS`` names a copy of flow_grpo's ``flow_grpo/rewards.py`` (not
shipped) its function runs unchanged, its hard-coded ``http://10.82.120.15:18085`` reached
through an HTTP proxy setting that names the judge (requests sends the request there, whole
URL and all); without it, the same call is written here."""

from __future__ import annotations

import io
import os
import pickle
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
from PIL import Image
from requests.adapters import HTTPAdapter, Retry

from common.sdk.client import ScorerClient
from testing import fetched
from testing.engine_standin import StandInEngine, judge_server
from testing.server import Server

pytestmark = pytest.mark.integration

FLOW_GRPO_REWARDS = os.environ.get("SCORER_TEST_FLOW_GRPO_REWARDS")
needs_file = pytest.mark.skipif(
    not FLOW_GRPO_REWARDS, reason="missing: SCORER_TEST_FLOW_GRPO_REWARDS names no copy of flow_grpo/rewards.py"
)
PROMPTS = ["a red dog", "dög 🐱 under a 看板", "", "x" * 200, 'a sign that says "Open"', "two\nlines"]
COUNT = 70  # two chunks: 35 and 35, each its own dtype
Score = Callable[[np.ndarray, list[str]], list[float]]


def reply_for(text: str) -> str:
    """A v1 reply whose score is the caption's: 1 + its code points' sum mod 5."""
    caption = re.search(r"Text Caption: \[(.*)\]\Z", text, re.S)
    assert caption is not None, text
    return f"Final Score: {1 + sum(map(ord, caption.group(1))) % 5}"


@pytest.fixture(scope="module")
def judge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    engine = StandInEngine(reply_for=reply_for)
    try:
        with judge_server(engine, tmp_path_factory.mktemp("logs")) as server:
            yield server
    finally:
        engine.close()


def jpeg(image: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(image).save(out, format="JPEG")
    return out.getvalue()


def written_here(url: str) -> Score:
    """``unifiedreward_score_remote``'s call: chunks of 64 by ``np.array_split``, the prompts
    chunk (a numpy array) pickled as is, ``outputs`` read whatever the status."""
    session = requests.Session()
    session.mount("http://", HTTPAdapter(max_retries=Retry(total=1000, backoff_factor=1, status_forcelist=[500])))

    def score(images: np.ndarray, prompts: list[str]) -> list[float]:
        parts = np.ceil(len(images) / 64)
        scores: list[float] = []
        for image_batch, prompt_batch in zip(np.array_split(images, parts), np.array_split(prompts, parts)):
            body = pickle.dumps({"images": [jpeg(image) for image in image_batch], "prompts": prompt_batch})
            scores += pickle.loads(session.post(url, data=body, timeout=120).content)["outputs"]
        return scores

    return score


def flow_grpos(judge: Server, monkeypatch: pytest.MonkeyPatch) -> Score:
    monkeypatch.setenv("http_proxy", judge.url)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    module = fetched.load_module(Path(str(FLOW_GRPO_REWARDS)), "flow_grpo_rewards")
    function = module.unifiedreward_score_remote("cpu")
    return lambda images, prompts: function(images, prompts, {})[0]


@pytest.mark.parametrize("client", ["written here", pytest.param("flow_grpo", marks=needs_file)])
def test_numpy_prompts_score_as_the_core_protocols(judge: Server, client: str, monkeypatch: pytest.MonkeyPatch) -> None:
    images = np.random.default_rng(41).integers(0, 255, (COUNT, 48, 64, 3), dtype=np.uint8)
    prompts = [PROMPTS[index % len(PROMPTS)] + " " * (index % 3) for index in range(COUNT)]
    ours = ScorerClient(judge.url).scores([jpeg(image) for image in images], prompts)
    score = written_here(judge.url + "/") if client == "written here" else flow_grpos(judge, monkeypatch)
    theirs = score(images, prompts)
    assert theirs == ours
    assert ours == [(1 + sum(map(ord, prompt)) % 5) / 5 for prompt in prompts]
