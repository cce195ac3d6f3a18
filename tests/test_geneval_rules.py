"""GenEval's rules against an independent re-statement of its evaluator and of the reward
server's strict rule (``testing/geneval_reference.py``) on constructed detections, then each
rule and quirk by hand."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from services.geneval.rules import (
    CLASSNAMES,
    COLORS,
    Detection,
    TaskError,
    Thresholds,
    colors_needed,
    geneval_correct,
    group_lists,
    kept_detections,
    parse_task,
    strict_score,
)
from testing import geneval_reference as reference

pytestmark = pytest.mark.unit

OPTIONS = {"threshold": 0.3, "counting_threshold": 0.9, "max_objects": 16, "position_threshold": 0.1}
# Scores on and around both thresholds, repeated so that ties occur.
SCORES = (0.2, 0.3, 0.3000001, 0.5, 0.5, 0.9, 0.9000001, 0.95)
CLASSES = ("dog", "cat", "cup", "tv remote", "hair drier")


def colour_of(box: Sequence[float]) -> str:
    """The colour the test's classifier sees: a function of the box alone."""
    return COLORS[int(box[0] + 3 * box[1]) % 4]


def service_colors(classname: str, detections: Sequence[Detection]) -> list[str]:
    return [colour_of(d.box) for d in detections]


def reference_colors(classname: str, rows: list[np.ndarray]) -> list[str]:
    return [colour_of(row[:4]) for row in rows]


def served(samples: list[tuple[dict[str, np.ndarray], dict[str, Any]]], only_strict: bool) -> dict[str, Any]:
    """The service's rule layer on the same samples, in the reward server's answer shape."""
    thresholds = Thresholds()
    out: dict[str, Any] = {"scores": [], "rewards": [], "strict_rewards": []}
    tags = []
    asked: list[tuple[str, int]] = []

    def colors(classname: str, detections: Sequence[Detection]) -> list[str]:
        asked.append((classname, len(detections)))
        return service_colors(classname, detections)

    for bbox, meta in samples:
        task = parse_task(meta)
        by_class = {
            name: [Detection(tuple(map(float, row[:4])), float(row[4]), i) for i, row in enumerate(rows)]
            for name, rows in bbox.items()
        }
        objects = kept_detections(by_class, task.tag, thresholds)
        asked.clear()
        strict = strict_score(task, objects, colors, thresholds.position)
        correct = False if only_strict else geneval_correct(task, objects, colors, thresholds.position).correct
        needed = colors_needed(task, objects, only_strict)
        # The colours are computed ahead for exactly the prefixes the rules then ask for.
        assert all(needed.get(name, 0) >= count for name, count in asked)
        assert set(needed) == {name for name, _ in asked}
        out["scores"].append(strict.score)
        out["rewards"].append(1.0 if correct else 0.0)
        out["strict_rewards"].append(1.0 if strict.correct else 0.0)
        tags.append(task.tag)
    out["group_rewards"] = group_lists(tags, out["rewards"])
    out["group_strict_rewards"] = group_lists(tags, out["strict_rewards"])
    return out


def random_sample(rng: random.Random) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    tag = rng.choice(reference.GROUP_KEYS)
    classes = rng.sample(CLASSES, 3)
    include: list[dict[str, Any]] = [{"class": classes[0], "count": rng.randint(1, 4)}]
    if rng.random() < 0.6:
        include.append({"class": classes[1], "count": rng.randint(1, 3)})
    for clause in include:
        if rng.random() < 0.4:
            clause["color"] = rng.choice(COLORS[:4])
    if len(include) == 2 and rng.random() < 0.6:
        include[1]["position"] = [rng.choice(["left of", "right of", "above", "below"]), 0]
    meta: dict[str, Any] = {"tag": tag, "include": include, "prompt": "a photo"}
    if rng.random() < 0.4:
        meta["exclude"] = [{"class": rng.choice(classes), "count": rng.randint(1, 4)}]
    bbox = {}
    for name in CLASSES:
        rows = []
        for _ in range(rng.choice((0, 0, 1, 1, 2, 2, 3, 4, 6, 20))):
            x, y = rng.randint(0, 60), rng.randint(0, 60)
            rows.append([x, y, x + rng.randint(1, 30), y + rng.randint(1, 30), rng.choice(SCORES)])
        bbox[name] = np.array(rows, dtype=np.float32).reshape(-1, 5)
    return bbox, meta


@pytest.mark.parametrize("only_strict", [False, True])
def test_the_rules_match_the_reference_on_random_detections(only_strict: bool) -> None:
    rng = random.Random(29)
    samples = [random_sample(rng) for _ in range(3000)]
    expected = reference.compute(samples, only_strict, reference_colors, OPTIONS)
    got = served(samples, only_strict)
    assert got == expected
    # The cases cover every outcome: both correctness values either way, partial and negative scores.
    assert {0.0, 1.0} <= set(got["strict_rewards"])
    assert only_strict or {0.0, 1.0} <= set(got["rewards"])
    assert min(got["scores"]) < 0 < max(s for s in got["scores"] if s < 1)


def test_reasons_match_the_reference() -> None:
    rng = random.Random(7)
    thresholds = Thresholds()
    for _ in range(1500):
        bbox, meta = random_sample(rng)
        task = parse_task(meta)
        by_class = {
            name: [Detection(tuple(map(float, row[:4])), float(row[4])) for row in rows] for name, rows in bbox.items()
        }
        objects = kept_detections(by_class, task.tag, thresholds)
        ref_objects = reference.keep(bbox, meta["tag"], OPTIONS)
        _, expected = reference.evaluate(ref_objects, meta, reference_colors, 0.1)
        _, _, expected_strict = reference.evaluate_reward(ref_objects, meta, reference_colors, 0.1)
        assert list(geneval_correct(task, objects, service_colors, 0.1).reasons) == expected
        assert list(strict_score(task, objects, service_colors, 0.1).reasons) == expected_strict


def dets(*rows: tuple[float, float, float, float, float]) -> list[Detection]:
    return [Detection(row[:4], row[4], i) for i, row in enumerate(rows)]


def white(classname: str, detections: Sequence[Detection]) -> list[str]:
    return ["white"] * len(detections)


def test_the_count_term_goes_negative_past_twice_the_count() -> None:
    task = parse_task({"tag": "counting", "include": [{"class": "dog", "count": 2}]})
    objects = {"dog": dets(*[(0, 0, 1, 1, 0.95)] * 5)}
    # 1 - |2 - 5| / 2
    assert strict_score(task, objects, white, 0.1).score == -0.5
    # GenEval's own rule counts at least 2: correct.
    assert geneval_correct(task, objects, white, 0.1).correct


def test_a_failed_position_adds_a_zero_then_a_one() -> None:
    task = parse_task(
        {
            "tag": "position",
            "include": [{"class": "dog", "count": 1}, {"class": "cat", "count": 1, "position": ["left of", 0]}],
        }
    )
    # The cat is right of the dog: terms dog 1, cat 1, position 0 then 1 -> 3/4.
    objects = {"dog": dets((0, 0, 10, 10, 0.9)), "cat": dets((50, 0, 60, 10, 0.9))}
    verdict = strict_score(task, objects, white, 0.1)
    assert (verdict.correct, verdict.score) == (False, 0.75)
    assert verdict.reasons == ("expected cat left of target, found right of target",)
    left = {"dog": dets((50, 0, 60, 10, 0.9)), "cat": dets((0, 0, 10, 10, 0.9))}
    assert strict_score(task, left, white, 0.1).score == 1.0


def test_the_strict_rule_ignores_exclude_clauses_unless_asked() -> None:
    task = parse_task(
        {"tag": "counting", "include": [{"class": "dog", "count": 1}], "exclude": [{"class": "dog", "count": 2}]}
    )
    objects = {"dog": dets((0, 0, 1, 1, 0.95))}
    assert strict_score(task, objects, white, 0.1).correct
    two = {"dog": dets((0, 0, 1, 1, 0.95), (5, 5, 6, 6, 0.95))}
    assert not geneval_correct(task, two, white, 0.1).correct
    cats = parse_task(
        {"tag": "two_object", "include": [{"class": "dog", "count": 1}], "exclude": [{"class": "cat", "count": 1}]}
    )
    with_cat = {"dog": dets((0, 0, 1, 1, 0.95)), "cat": dets((5, 5, 6, 6, 0.95))}
    assert strict_score(cats, with_cat, white, 0.1).correct
    assert not strict_score(cats, with_cat, white, 0.1, check_exclude=True).correct
    assert geneval_correct(cats, with_cat, white, 0.1).reasons == ("expected cat<1, found 1",)


def test_thresholds_are_strict_and_per_tag_and_16_per_class() -> None:
    thresholds = Thresholds()
    by_class = {"dog": dets((0, 0, 1, 1, 0.3), (0, 0, 1, 1, 0.31), (0, 0, 1, 1, 0.9), (0, 0, 1, 1, 0.91))}
    assert [d.confidence for d in kept_detections(by_class, "colors", thresholds)["dog"]] == [0.91, 0.9, 0.31]
    assert [d.confidence for d in kept_detections(by_class, "counting", thresholds)["dog"]] == [0.91]
    many = {"cup": dets(*[(i, 0, i + 1, 1, 0.5) for i in range(20)])}
    kept = kept_detections(many, "single_object", thresholds)["cup"]
    # 16 kept; of equal confidences, the later first.
    assert [d.box[0] for d in kept] == list(range(19, 3, -1))
    assert kept_detections({"cup": dets((0, 0, 1, 1, 0.2))}, "single_object", thresholds) == {}


def test_an_empty_include_scores_zero_and_is_correct() -> None:
    task = parse_task({"tag": "single_object", "include": []})
    verdict = strict_score(task, {}, white, 0.1)
    assert (verdict.correct, verdict.score) == (True, 0.0)


def test_colours_are_asked_only_where_the_count_passes() -> None:
    task = parse_task({"tag": "color_attr", "include": [{"class": "dog", "count": 2, "color": "red"}]})
    three = {"dog": dets(*[(i, 0, i + 1, 1, 0.9) for i in range(3)])}
    assert colors_needed(task, three, only_strict=True) == {}
    assert colors_needed(task, three, only_strict=False) == {"dog": 2}
    assert colors_needed(task, {"dog": three["dog"][:1]}, only_strict=False) == {}


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ({"include": []}, "tag"),
        ({"tag": "colours", "include": []}, "tag"),
        ({"tag": "counting"}, "include"),
        ({"tag": "counting", "include": [{"class": "dragon", "count": 1}]}, "80 object names"),
        ({"tag": "counting", "include": [{"class": "dog", "count": 0}]}, "count"),
        ({"tag": "counting", "include": [{"class": "dog", "count": True}]}, "count"),
        ({"tag": "colors", "include": [{"class": "dog", "count": 1, "color": "teal"}]}, "colour"),
        ({"tag": "position", "include": [{"class": "dog", "count": 1, "position": ["left of", 0]}]}, "earlier"),
        (
            {
                "tag": "position",
                "include": [{"class": "dog", "count": 1}, {"class": "cat", "count": 1, "position": ["beside", 0]}],
            },
            "relation",
        ),
        ({"tag": "counting", "include": [{"class": "dog", "count": 1, "colour": "red"}]}, "keys"),
        ("dog", "dict"),
        ({"tag": "counting", "include": [{"class": "dog", "count": 1}] * 9}, "limit is 8"),
    ],
)
def test_bad_metadata_is_refused_with_its_place(metadata: Any, message: str) -> None:
    with pytest.raises(TaskError, match=message):
        parse_task(metadata, "meta_datas[3]")


def test_the_class_names_are_genevals_80() -> None:
    assert len(CLASSNAMES) == len(set(CLASSNAMES)) == 80
    assert CLASSNAMES[:3] == ("person", "bicycle", "car") and CLASSNAMES[-1] == "toothbrush"
