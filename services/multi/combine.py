"""A ``multi`` request's answer: each sample's rewards' results made into its weighted sum
(``Combined``, ``combined_results``) by each reward's own failure policy, and the answer's
fields beyond the scores (``answer_fields``: ``details``, ``dropped``, ``frame_details``)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from common.imaging.media import VideoRule
from common.limits.errors import NotReady, Overloaded, ScorerError, Unprocessable, quote
from common.pipeline import metrics
from common.pipeline.scorer import Result, Scored, combine_frames
from services.multi.wanted import Wanted

# A reward's refusals that tell of the node's load (a full queue, the deadline, the work bytes
# held by other requests) or its readiness, not of the sample: the request fails with the 503
# its client retries, optional reward or not, so that a sample's sum never depends on the load.
FROM_THE_LOAD = (Overloaded, NotReady)


@dataclass
class Combined(Scored):
    """A weighted sum of several rewards' scores: ``details`` holds each reward's unweighted
    score, NaN where an optional reward failed (``dropped``: one did); of a video,
    ``frame_details`` each reward's scores of its chosen frames (NaN each where it failed)."""

    details: dict[str, float] = field(default_factory=dict)
    dropped: bool = False
    frame_details: dict[str, list[float]] | None = None


def answer_fields(results: Sequence[Result]) -> dict[str, Any]:
    """Of ``Combined`` results, the answer's ``details`` (each reward's per-sample list,
    flow_grpo's ``score_details`` shape), ``dropped`` (the indices of the samples that dropped
    one) and, of videos, ``frame_details`` (each reward's per-video list of its frames' scores,
    as a single service's ``frame_scores``)."""
    combined = [r for r in results if isinstance(r, Combined)]
    if not combined:
        return {}
    assert len(combined) == len(results), "a combined answer is combined for every sample"
    out: dict[str, Any] = {
        "details": {name: [r.details[name] for r in combined] for name in combined[0].details},
        "dropped": [index for index, r in enumerate(combined) if r.dropped],
    }
    if combined[0].frame_details is not None:
        out["frame_details"] = {name: [r.frame_details[name] for r in combined] for name in combined[0].frame_details}
    return out


def from_reward(name: str, error: Exception) -> Exception:
    """Reward ``name``'s refusal with the name first (``pickscore: 4 items in one request; ...``),
    its type and status kept, so that a request of several rewards says which one refused it. A
    new object: a batcher hands one exception to every request of its batch. A fault that is no
    ``ScorerError`` stays as it is, its traceback logged."""
    if not isinstance(error, ScorerError):
        return error
    return type(error)(f"{name}: {error.message}")


def combined_results(
    images: Sequence[Mapping[str, Any]],
    wanted: Mapping[str, Wanted],
    spans: Sequence[range],
    rules: Mapping[str, VideoRule] | None,
    bounds: Mapping[str, tuple[float, float]],
) -> list[Result]:
    """Each image's results by reward -> each sample's ``Combined``: each reward's score, keyed
    by the name the request gave it (a
    video's by its rule for that reward, ``rules``; None for images, and a video's frames'
    scores by reward, ``frame_details``) and their weighted sum. Each reward's failure for a
    sample follows that reward's own policy, never another sample's:

    - a required reward's error is raised, as its own service's is, and any reward's 503
      (``FROM_THE_LOAD``: the load, not the sample);
    - a score that is not a finite number is what the reward's own service answers for the
      sample (a judge's parse failure under ``nan``, or under ``mean`` when no reply parsed):
      a required reward's makes the sample's sum NaN, no verdict, as its own service's answer;
    - an optional reward that failed for the sample, or gave it no finite score, is dropped
      for that sample alone and counted at its worst score (``bounds``: its lowest for a
      positive weight, its highest for a negative one), so that no sample gains by making it
      fail; where that bound is infinite, or where none of the sample's weighted rewards is
      left, the sum is NaN (never 0: there is nothing to measure it by), unless that is so of
      every sample for an error (a bound on the request together): the request gets that error.

    A sum past the largest float is a 422: the weights are too large."""
    combined: list[Result] = []
    dropped: dict[str, int] = dict.fromkeys(wanted, 0)
    unmeasured: list[BaseException] = []  # each sample's error that left it nothing to measure it by
    for index, span in enumerate(spans):
        details: dict[str, float] = {}
        frames: dict[str, list[float]] = {}
        weighted: list[float] = []
        dropped_here = measured = False
        verdict = True
        failure: BaseException | None = None
        for name, want in wanted.items():
            key = want.alias or name
            values = [images[i][name] for i in span]
            error = next((value for value in values if isinstance(value, BaseException)), None)
            frames[key] = [math.nan] * len(span)
            details[key] = math.nan
            if error is None:
                score, frames[key] = _score(values, rules[name] if rules is not None else None)
                if math.isfinite(score):
                    details[key] = score
                    weighted.append(want.weight * score)
                    measured = measured or want.weight != 0
                    continue
                if not want.optional:
                    verdict = False
                    continue
            elif not want.optional or isinstance(error, FROM_THE_LOAD):
                raise error
            failure = failure or error
            dropped_here = True
            dropped[name] += 1
            worst = worst_term(want.weight, bounds[name])
            if worst is None:
                verdict = False
            else:
                weighted.append(worst)
        if dropped_here and not measured and failure is not None:
            unmeasured.append(failure)
        total = _sum(weighted, index) if verdict and (measured or not dropped_here) else math.nan
        combined.append(Combined(total, details=details, dropped=dropped_here, frame_details=frames if rules else None))
    if unmeasured and len(unmeasured) == len(spans):
        raise unmeasured[0]
    for name, count in dropped.items():
        if count:
            metrics.REWARD_DROPPED.labels(name).inc(count)
    return combined


def worst_term(weight: float, bounds: tuple[float, float]) -> float | None:
    """A dropped reward's term in the weighted sum: its weight times the score that makes the
    term lowest (its lowest for a positive weight, its highest for a negative one); None when
    that score is unbounded."""
    if weight == 0:
        return 0.0
    bound = bounds[0] if weight > 0 else bounds[1]
    return weight * bound if math.isfinite(bound) else None


def _sum(weighted: Sequence[float], index: int) -> float:
    """Sample ``index``'s weighted scores summed; a 422 when the sum is past the largest float."""
    try:
        total = math.fsum(weighted)
    except (OverflowError, ValueError):  # an intermediate sum past the largest float; inf - inf
        total = math.inf
    if not math.isfinite(total):
        raise Unprocessable(
            f"sample {index}'s weighted sum overflows a float (its weighted scores: {quote(weighted)}); "
            "the weights are too large"
        )
    return total


def _score(values: Sequence[Result], rule: VideoRule | None) -> tuple[float, list[float]]:
    """One sample's score from its image's result, or (``rule``) its video's frames' results;
    and the scores of its frames (a video's chosen ones, in order)."""
    (result,) = values if rule is None else combine_frames(values, [len(values)], rule)
    frames = [float(value.score if isinstance(value, Scored) else value) for value in values]
    return float(result.score if isinstance(result, Scored) else result), frames
