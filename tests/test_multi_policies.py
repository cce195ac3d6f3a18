"""Issue 39's multi findings against the running ``multi`` service, a judge beside OCR, its engine
a stand-in answering chosen replies (``testing/engine_standin.py``): each reward's per-sample
failure follows that reward's own policy, for that sample alone, never a 500 for the request.
On 40d4ae2 a judge parse failure under ``mean`` with no reply parsed was a 500 ("judge scored
sample 0 nan, not a finite number"), and a pairwise judge dropped from every sample for one
prompt with a single sample."""

from __future__ import annotations

import contextlib
import math
import pickle
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests

from testing.clock import wait_until
from testing.engine_standin import StandInEngine
from testing.images import render_text
from testing.server import Server, gunicorn_server

pytestmark = pytest.mark.integration

# UnifiedReward v1's reply that parses (4 / 5), and one that does not.
SCORED, UNREADABLE = "Final Score: 4", "I would rather not say"
OPEN, CLOSED = 'a sign that says "Open"', 'a sign that says "Closed"'


@contextlib.contextmanager
def judge_beside_ocr(
    judge: str, policy: str, reply: Callable[[str], str], log_dir: Path
) -> Iterator[tuple[Server, StandInEngine]]:
    engine = StandInEngine(reply_for=reply)
    try:
        env = {
            "SCORER_MULTI_REWARDS": "ocr,judge",
            "SCORER_DEVICE": "cpu",
            "SCORER_JUDGE_JUDGE": judge,
            "SCORER_JUDGE_ENGINE": engine.url,
            "SCORER_JUDGE_MODEL": "stand-in",
            "SCORER_JUDGE_PARSE_FAILURE_SCORE": policy,
        }
        with gunicorn_server("multi", env, threads=16, log_dir=log_dir) as server:
            yield server, engine
    finally:
        engine.close()


def post(server: Server, query: str, prompts: list[str]) -> tuple[int, dict]:
    images = [render_text(prompt.split('"')[1], size=256) for prompt in prompts]
    body = pickle.dumps({"images": images, "prompts": prompts})
    response = requests.post(f"{server.url}/{query}", data=body, timeout=120)
    return response.status_code, pickle.loads(response.content)


def test_no_judge_reply_parsing_under_mean_is_the_judges_nan_not_a_500(tmp_path: Path) -> None:
    """``mean`` with no reply parsed leaves the judge nothing to take the mean of: its own
    service answers NaN. Required, the samples' sums are NaN (no verdict); optional, the judge is
    dropped from each sample and counted at its lowest score, 0: a drop never raises a sum."""
    with judge_beside_ocr("unifiedreward-v1", "mean", lambda _: UNREADABLE, tmp_path) as (server, _):
        status, answer = post(server, "?ocr=1&judge=1", [OPEN, CLOSED])
        assert status == 200, answer
        assert all(math.isnan(score) for score in answer["scores"] + answer["details"]["judge"]), answer
        assert answer["details"]["ocr"] == [1.0, 1.0] and answer["dropped"] == []
        status, answer = post(server, "?ocr=1&judge=1!optional", [OPEN, CLOSED])
        assert status == 200 and answer["dropped"] == [0, 1], answer
        assert answer["scores"] == [1.0, 1.0], answer  # OCR's 1.0 and the judge's lowest, 0


def test_one_unparsed_reply_under_nan_is_that_samples_alone(tmp_path: Path) -> None:
    """Under ``nan`` a reply that does not parse is its sample's NaN in the judge's own service;
    the other samples keep their sums."""
    with judge_beside_ocr("unifiedreward-v1", "nan", lambda p: UNREADABLE if "Closed" in p else SCORED, tmp_path) as (
        s,
        _,
    ):
        status, answer = post(s, "?ocr=1&judge=1", [OPEN, CLOSED, OPEN])
        assert status == 200, answer
        assert answer["scores"][0] == answer["scores"][2] == pytest.approx(1.8), answer
        assert math.isnan(answer["scores"][1]) and math.isnan(answer["details"]["judge"][1])
        status, answer = post(s, "?ocr=1&judge=1!optional", [OPEN, CLOSED, OPEN])
        assert status == 200 and answer["dropped"] == [1], answer
        assert answer["scores"][0] == answer["scores"][2] == pytest.approx(1.8), answer


def test_a_prompt_with_one_sample_drops_the_pairwise_judge_from_it_alone(tmp_path: Path) -> None:
    """The pairwise judge scores a sample by its wins in its prompt's group: a prompt sent once
    cannot be judged, which drops the judge from that sample alone; the complete groups keep it.
    Required, the request is the judge's own 422."""
    with judge_beside_ocr("unifiedreward-think", "nan", lambda _: "<answer>Image 1 is better</answer>", tmp_path) as (
        s,
        _,
    ):
        prompts = [OPEN, OPEN, CLOSED, OPEN]
        status, answer = post(s, "?ocr=1&judge=1!optional", prompts)
        assert status == 200 and answer["dropped"] == [2], answer
        wins = answer["details"]["judge"]
        assert sorted(wins[i] for i in (0, 1, 3)) == [0.0, 0.5, 1.0] and math.isnan(wins[2]), answer
        assert [answer["scores"][i] for i in (0, 1, 3)] == [1.0 + wins[i] for i in (0, 1, 3)]
        status, answer = post(s, "?ocr=1&judge=1", prompts)
        assert status == 422 and "prompts[2] has no other sample" in answer["error"], answer


def test_multi_is_not_ready_while_a_rewards_engine_is_down(tmp_path: Path) -> None:
    """A balancer sends a multi node's requests elsewhere while its judge's engine is down, and
    back once it answers again (the judge's own probe, not one call per /ready)."""
    with judge_beside_ocr("unifiedreward-v1", "nan", lambda _: SCORED, tmp_path) as (server, engine):
        assert requests.get(server.url + "/ready", timeout=30).status_code == 200
        engine.down()
        status, _ = post(server, "?ocr=1&judge=1", [OPEN])  # a call that finds the engine down
        assert status == 500  # on a pickle body, the overload flow_grpo retries
        ready = requests.get(server.url + "/ready", timeout=30)
        assert ready.status_code == 503 and "judge" in ready.json()["reason"], ready.text
        engine.up()
        wait_until(
            lambda: requests.get(server.url + "/ready", timeout=30).status_code == 200, "ready again", pause_s=0.5
        )


def test_a_flow_grpo_reward_fn_names_the_judge_by_flow_grpos_name(tmp_path: Path) -> None:
    """flow_grpo's ``reward_fn = {"ocr": 1, "qwenvl": 0.5}`` is one URL, ``details`` keyed by its
    names; the judge named twice, or by a name of a judge it is not, is a 422."""
    reply = "<Thought>\nSharp.\n</Thought>\n<Score>4</Score>"
    with judge_beside_ocr("qwenvl", "nan", lambda _: reply, tmp_path) as (s, _):
        status, answer = post(s, "?ocr=1&qwenvl=0.5", [OPEN, CLOSED])
        assert status == 200 and answer["details"] == {"ocr": [1.0, 1.0], "qwenvl": [0.8, 0.8]}, answer
        assert answer["scores"] == [pytest.approx(1.4)] * 2, answer
        status, answer = post(s, "?qwenvl=1&judge=1", [OPEN])
        assert status == 422 and "gives 'judge' twice" in answer["error"], answer
        status, answer = post(s, "?unifiedreward=1", [OPEN])
        assert status == 422 and "it serves ocr, judge (also by the names qwenvl)" in answer["error"], answer
