"""GenEval's rules on one image's detections: which detections count, the colour and position
checks, GenEval's own correctness and the reward server's strict correctness and partial score.

Pure Python: the detector and the colour classifier are elsewhere (``detector.py``,
``colors.py``); a rule asks for colours through a callable. Every rule and quirk is stated in
``services/geneval/README.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# GenEval's evaluation/object_names.txt: the COCO classes, in the detector's label order.
CLASSNAMES = (
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat", "traffic light",
    "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat", "dog", "horse", "sheep", "cow",
    "elephant", "bear", "zebra", "giraffe", "backpack", "umbrella", "handbag", "tie", "suitcase", "frisbee",
    "skis", "snowboard", "sports ball", "kite", "baseball bat", "baseball glove", "skateboard", "surfboard",
    "tennis racket", "bottle", "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple",
    "sandwich", "orange", "broccoli", "carrot", "hot dog", "pizza", "donut", "cake", "chair", "couch",
    "potted plant", "bed", "dining table", "toilet", "tv", "laptop", "computer mouse", "tv remote",
    "computer keyboard", "cell phone", "microwave", "oven", "toaster", "sink", "refrigerator", "book",
    "clock", "vase", "scissors", "teddy bear", "hair drier", "toothbrush",
)  # fmt: skip
COLORS = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white")
# The reward server's tags, in its order: each sample's group lists hold -10.0 under the others.
TAGS = ("single_object", "two_object", "counting", "colors", "position", "color_attr")
# The relations in the order GenEval's ``relative_position`` adds them.
RELATIONS = ("left of", "right of", "above", "below")
NOT_THIS_TAG = -10.0
# Clauses of each kind a sample may have (GenEval's have at most 2): a position clause costs up
# to 16 x 16 relations, and a request's metadata is the client's.
MAX_CLAUSES = 8


@dataclass(frozen=True)
class Thresholds:
    """GenEval's evaluator options (``--options``), at its defaults."""

    # A detection counts when its confidence is above this (strictly), above ``counting`` for the
    # ``counting`` tag.
    threshold: float = 0.3
    counting: float = 0.9
    # At most this many detections per class, the most confident.
    max_objects: int = 16
    # A relation holds when the centres' offset passes this fraction of the two boxes' summed size.
    position: float = 0.1

    def confidence(self, tag: str) -> float:
        return self.counting if tag == "counting" else self.threshold


@dataclass(frozen=True)
class Detection:
    """A kept detection: its box (x1, y1, x2, y2) in the image's pixels and its confidence;
    ``key`` finds its mask in the detector's output."""

    box: tuple[float, float, float, float]
    confidence: float
    key: int = 0


@dataclass(frozen=True)
class Clause:
    """One ``include`` or ``exclude`` entry of GenEval's metadata."""

    classname: str
    count: int
    color: str | None = None
    # (relation, index of an earlier include clause)
    position: tuple[str, int] | None = None


@dataclass(frozen=True)
class Task:
    """A sample's GenEval metadata, checked."""

    tag: str
    include: tuple[Clause, ...]
    exclude: tuple[Clause, ...]


class TaskError(ValueError):
    """The metadata is not a GenEval task this service can judge."""


# A colour classifier: the colour of each of these detections of this class.
Colors = Callable[[str, Sequence[Detection]], list[str]]


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TaskError(f"{where}['count'] must be a whole number from 1, got {value!r}")
    return value


def _clause(entry: Any, where: str, earlier: int | None) -> Clause:
    """An include clause (``earlier``: how many include clauses precede it) or an exclude one (None)."""
    if not isinstance(entry, Mapping):
        raise TaskError(f"{where} must be a dict")
    allowed = {"class", "count"} if earlier is None else {"class", "count", "color", "position"}
    unknown = set(entry) - allowed
    if unknown:
        raise TaskError(f"{where} has keys GenEval does not read: {sorted(map(str, unknown))}")
    classname = entry.get("class")
    if classname not in CLASSNAMES:
        raise TaskError(f"{where}['class'] = {classname!r} is not one of GenEval's 80 object names")
    color = entry.get("color")
    if color is not None and color not in COLORS:
        raise TaskError(f"{where}['color'] = {color!r} is not one of GenEval's colours {', '.join(COLORS)}")
    position = entry.get("position")
    if position is not None:
        if not (isinstance(position, (list, tuple)) and len(position) == 2):
            raise TaskError(f"{where}['position'] must be [relation, index of an earlier include clause]")
        relation, target = position
        if relation not in RELATIONS:
            raise TaskError(
                f"{where}['position'][0] = {relation!r} is not a relation GenEval knows: {', '.join(RELATIONS)}"
            )
        if isinstance(target, bool) or not isinstance(target, int) or not 0 <= target < (earlier or 0):
            raise TaskError(f"{where}['position'][1] = {target!r} is not the index of an earlier include clause")
        position = (relation, target)
    return Clause(classname, _count(entry.get("count"), where), color, position)


def parse_task(metadata: Any, where: str = "metadata") -> Task:
    """GenEval's metadata of one sample (``tag``, ``include``, optional ``exclude``; other keys,
    such as ``prompt``, are not read); ``TaskError`` naming the bad entry."""
    if not isinstance(metadata, Mapping):
        raise TaskError(f"{where} must be a dict of GenEval metadata (tag, include, exclude)")
    tag = metadata.get("tag")
    if tag not in TAGS:
        raise TaskError(f"{where}['tag'] = {tag!r} is not one of GenEval's tags {', '.join(TAGS)}")
    include, exclude = metadata.get("include"), metadata.get("exclude", [])
    for key, value in (("include", include), ("exclude", exclude)):
        if not isinstance(value, (list, tuple)):
            raise TaskError(f"{where}['{key}'] must be a list of clauses")
        if len(value) > MAX_CLAUSES:
            raise TaskError(f"{where}['{key}'] has {len(value)} clauses; the limit is {MAX_CLAUSES}")
    clauses = tuple(_clause(entry, f"{where}['include'][{i}]", i) for i, entry in enumerate(include))
    excluded = tuple(_clause(entry, f"{where}['exclude'][{i}]", None) for i, entry in enumerate(exclude))
    return Task(tag, clauses, excluded)


def kept_detections(
    by_class: Mapping[str, Sequence[Detection]], tag: str, thresholds: Thresholds
) -> dict[str, list[Detection]]:
    """Per class, the detections above the tag's confidence threshold, most confident first (of
    equal ones, the later first, as NumPy's sort reversed gives), at most ``max_objects``; a
    class with none is absent. No non-maximum suppression (GenEval's ``max_overlap`` is 1).
    Compared in float32, as mmdet's float32 scores are against the threshold: 0.3 is not above 0.3."""
    floor = np.float32(thresholds.confidence(tag))
    kept: dict[str, list[Detection]] = {}
    for classname, detections in by_class.items():
        ordered = sorted(reversed(detections), key=lambda d: d.confidence, reverse=True)
        chosen = [d for d in ordered if np.float32(d.confidence) > floor][: thresholds.max_objects]
        if chosen:
            kept[classname] = chosen
    return kept


def relations(a: Detection, b: Detection, margin: float) -> list[str]:
    """Where ``a`` is relative to ``b``: the centres' offset, each axis shrunk towards 0 by
    ``margin`` x the two boxes' summed extent on it, over the offset's length; a relation holds
    past 0.5 on its axis, none when both shrunk offsets are under 1e-3. In float32, as GenEval
    computes on mmdet's float32 boxes."""
    boxes = np.array([a.box, b.box], dtype=np.float32)
    centers = (boxes[:, :2] + boxes[:, 2:]) / np.float32(2)
    extent = np.abs(boxes[:, 2:] - boxes[:, :2]).sum(axis=0)
    offset = centers[0] - centers[1]
    shrunk = np.maximum(np.abs(offset) - np.float32(margin) * extent, np.float32(0)) * np.sign(offset)
    if np.all(np.abs(shrunk) < 1e-3):
        return []
    dx, dy = shrunk / np.linalg.norm(offset)
    checks = (dx < -0.5, dx > 0.5, dy < -0.5, dy > 0.5)
    return [relation for relation, holds in zip(RELATIONS, checks) if holds]


def _color_reason(clause: Clause, colors: list[str]) -> str:
    tally = ", ".join(f"{colors.count(c)} {c}" for c in COLORS if c in colors)
    return (
        f"expected {clause.color} {clause.classname}>={clause.count}, found "
        f"{colors.count(clause.color or '')} {clause.color}; and {tally}"
    )


def _position_failure(
    clause: Clause, found: Sequence[Detection], targets: Sequence[Detection], margin: float
) -> str | None:
    """The reason of the first (object, target) pair whose relation is not the expected one."""
    assert clause.position is not None
    expected = clause.position[0]
    for obj in found:
        for target in targets:
            true = relations(obj, target, margin)
            if expected not in true:
                return f"expected {clause.classname} {expected} target, found {' and '.join(true)} target"
    return None


@dataclass(frozen=True)
class Verdict:
    correct: bool
    reasons: tuple[str, ...]
    score: float = 0.0


def geneval_correct(task: Task, objects: Mapping[str, Sequence[Detection]], colors: Colors, margin: float) -> Verdict:
    """GenEval's own correctness (``evaluate``): each include clause's most confident ``count``
    detections exist, have the colour, stand in the relation to every detection of the target
    clause; no exclude clause's class is detected ``count`` times or more."""
    correct, reasons = True, []
    groups: list[Sequence[Detection] | None] = []
    for clause in task.include:
        found = list(objects.get(clause.classname, []))[: clause.count]
        matched = True
        if len(found) < clause.count:
            matched = False
            reasons.append(f"expected {clause.classname}>={clause.count}, found {len(found)}")
        else:
            if clause.color is not None:
                seen = colors(clause.classname, found)
                if seen.count(clause.color) < clause.count:
                    matched = False
                    reasons.append(_color_reason(clause, seen))
            if clause.position is not None and matched:
                targets = groups[clause.position[1]]
                if targets is None:
                    matched = False
                    reasons.append(f"no target for {clause.classname} to be {clause.position[0]}")
                elif (failure := _position_failure(clause, found, targets, margin)) is not None:
                    matched = False
                    reasons.append(failure)
        correct = correct and matched
        groups.append(found if matched else None)
    for clause in task.exclude:
        detected = len(objects.get(clause.classname, []))
        if detected >= clause.count:
            correct = False
            reasons.append(f"expected {clause.classname}<{clause.count}, found {detected}")
    return Verdict(correct, tuple(reasons))


def strict_score(
    task: Task, objects: Mapping[str, Sequence[Detection]], colors: Colors, margin: float, check_exclude: bool = False
) -> Verdict:
    """The reward server's ``evaluate_reward``: strict correctness (each include clause's class
    detected exactly ``count`` times, all of them of the colour and in the relation; the exclude
    clauses unread unless ``check_exclude``) and the partial score, the mean of its terms: per
    clause ``1 - |count - detected| / count`` (negative past twice the count), then a 0 for a
    failed count of a clause with a colour or position; else the colour's term as the count's,
    and for a position 0 with no target, else (a 0 on a failure, then) a 1."""
    correct, reasons, terms = True, [], []
    groups: list[Sequence[Detection] | None] = []
    for clause in task.include:
        found = list(objects.get(clause.classname, []))
        terms.append(1 - abs(clause.count - len(found)) / clause.count)
        matched = True
        if len(found) != clause.count:
            matched = False
            reasons.append(f"expected {clause.classname}=={clause.count}, found {len(found)}")
            if clause.color is not None or clause.position is not None:
                terms.append(0.0)
        else:
            if clause.color is not None:
                seen = colors(clause.classname, found)
                terms.append(1 - abs(clause.count - seen.count(clause.color)) / clause.count)
                if seen.count(clause.color) != clause.count:
                    matched = False
                    reasons.append(_color_reason(clause, seen))
            if clause.position is not None and matched:
                targets = groups[clause.position[1]]
                if targets is None:
                    matched = False
                    reasons.append(f"no target for {clause.classname} to be {clause.position[0]}")
                    terms.append(0.0)
                else:
                    if (failure := _position_failure(clause, found, targets, margin)) is not None:
                        matched = False
                        reasons.append(failure)
                        terms.append(0.0)
                    terms.append(1.0)
        correct = correct and matched
        groups.append(found if matched else None)
    if check_exclude:
        for clause in task.exclude:
            detected = len(objects.get(clause.classname, []))
            if detected >= clause.count:
                correct = False
                reasons.append(f"expected {clause.classname}<{clause.count}, found {detected}")
    score = sum(terms) / len(terms) if terms else 0.0  # summed left to right, as the server does
    return Verdict(correct, tuple(reasons), score)


def colors_needed(task: Task, objects: Mapping[str, Sequence[Detection]], only_strict: bool) -> dict[str, int]:
    """Per class, how many of its most confident detections the rules will ask the colours of
    (both rules ask of a prefix of a class's detections): the count of each colour clause whose
    count check passes, in the strict rule, or (unless ``only_strict``) GenEval's."""
    needed: dict[str, int] = {}
    for clause in task.include:
        if clause.color is None:
            continue
        detected = len(objects.get(clause.classname, []))
        if detected == clause.count or (not only_strict and detected >= clause.count):
            needed[clause.classname] = max(needed.get(clause.classname, 0), clause.count)
    return needed


def group_lists(tags: Sequence[str], values: Sequence[float]) -> dict[str, list[float]]:
    """The reward server's per-tag lists: each sample's value under its own tag, -10.0 under the others."""
    if not tags:
        return {}
    return {key: [value if tag == key else NOT_THIS_TAG for tag, value in zip(tags, values)] for key in TAGS}
