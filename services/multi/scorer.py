"""Several image rewards in one call (the ``multi`` service): one upload and one decode per
image, each reward's own model and batcher, the weighted sum and each reward's own score.

The rewards are the image scorers ``SCORER_MULTI_REWARDS`` lists, each built with its own
service's settings and run by its own ``ScorerRuntime``, so its batcher gathers the items of
concurrent requests as when it is served alone. A request's images are parsed, opened and
checked against every requested reward's bounds (``check_images``), decoded once, and handed to
every reward's ``prepare_images`` (the decoded images are shared, never modified); the rewards
then score concurrently, each on its own batcher.

A request names its rewards and weights in the URL's query (``?ocr=0.7&pickscore=0.3``; a
weight ending ``!optional`` marks its reward optional), else in ``metadata["rewards"]``
(``{"ocr": 0.7, "pickscore": {"weight": 0.3, "optional": true}}``), else every served reward
has weight 1. A required reward's failure fails the request as it would fail its own service's,
its message naming the reward, and a required reward's score that is not a finite number (what
its own service answers for that sample: a judge's parse failure under ``nan``) makes that
sample's sum NaN. An optional reward's failure drops it from the samples it failed for
(``dropped``): a sample whose own input it refuses (``check_images``, each prompt's group, then
each sample alone) alone; every sample of the request when a bound on the samples together
refuses it (the work budget, the request's pixels: never some samples by their position), or
when it fails while preparing or scoring. A dropped reward counts at its worst score
(``score_bounds``), so that no sample gains by making it fail. A refusal for the node's load
(503) is never dropped, and a sample left with nothing to measure it by is NaN, never 0.
"""

from __future__ import annotations

import contextvars
import logging
import math
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from PIL import Image

from common import metrics, registry
from common.budget import tentative_work, trial_work
from common.config import ConfigError
from common.errors import NotReady, Overloaded, ScorerError, Unprocessable, quote
from common.images import open_images
from common.media import MEAN, MediaRequest, VideoRule, parse_media_request
from common.rewards import Wanted, requested
from common.runtime import ScorerRuntime
from common.scorer import Combined, ImageScorer, Query, Result, Samples, Scored, Scorer, combine_frames, decode
from common.settings import CoreSettings

log = logging.getLogger(__name__)

# A reward's refusals that tell of the node's load (a full queue, the deadline, the work bytes
# held by other requests) or its readiness, not of the sample: the request fails with the 503
# its client retries, optional reward or not, so that a sample's sum never depends on the load.
FROM_THE_LOAD = (Overloaded, NotReady)


class CombinedScorer(Scorer):
    """The rewards ``SCORER_MULTI_REWARDS`` lists, behind one request path. Each of a request's
    images gets one entry per requested reward: the reward's item for it, or the error that
    reward met for its sample; ``score_request`` turns items into results, errors staying."""

    name = "multi"
    batched = False  # each reward batches its own calls
    reads_query = True

    def __init__(self, core: CoreSettings) -> None:
        super().__init__(core)
        try:
            names = registry.multi_rewards()
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self.rewards: dict[str, ImageScorer] = {name: registry.load_scorer_class(name)(core) for name in names}
        self.runtimes = {name: ScorerRuntime(scorer) for name, scorer in self.rewards.items()}
        # flow_grpo's names of the rewards, where they are not the services' (the judge's ``qwenvl``).
        self.aliases = {alias: name for name, scorer in self.rewards.items() for alias in scorer.aliases()}
        # The rules a request may name: any reward's; one that a reward does not offer is the mean for it.
        self.video_rules: dict[str, VideoRule] = {
            rule.name: rule for scorer in self.rewards.values() for rule in scorer.video_rules.values()
        }
        # Every reward of a request but one is scored on a thread of this pool, the last on the
        # request's own: the rewards wait on their batchers at once, not one after another.
        threads = registry.request_threads(core.threads, "multi")
        self._pool = ThreadPoolExecutor(max(1, threads * (len(names) - 1)), thread_name_prefix="multi")

    def setup(self, device: str) -> None:
        """Load the rewards one after another, each by its own runtime (two loading at once in
        one process race in transformers' lazy imports); not ready unless all of them are."""
        for runtime in self.runtimes.values():
            runtime.start()
            runtime.wait_setup()
        failed = [f"{name}: {runtime.setup_error}" for name, runtime in self.runtimes.items() if runtime.setup_error]
        if failed:
            raise ConfigError("; ".join(failed))

    def prepare(self, payload: dict[str, Any]) -> list[Any]:
        return self.prepare_samples(payload).items

    def prepare_samples(self, payload: dict[str, Any], query: Query = ()) -> Samples:
        request = parse_media_request(payload, self.core, self.video_rules)
        wanted = requested(query, request.metadata, list(self.rewards), self.aliases)
        opened = open_images(request.images, self.core, request.names)
        spans = request.spans
        entries: list[dict[str, Any]] = [{} for _ in request.images]
        # The required rewards' bounds first: an optional reward's work never leaves one refused.
        for name, want in sorted(wanted.items(), key=lambda pair: pair[1].optional):
            self._check(name, want, opened, request, entries)
        images = decode(opened, request, self.name)
        for name, want in wanted.items():
            self._prepare(name, want, images, request, entries)
        rules = {name: self.rewards[name].video_rules.get(request.rule.name, MEAN) for name in wanted}
        bounds = {name: self.rewards[name].score_bounds() for name in wanted}

        def combine(results: Sequence[Any]) -> list[Result]:  # each image's results by reward
            return combined_results(results, wanted, spans, rules if request.frames is not None else None, bounds)

        return Samples(entries, combine)

    def _check(
        self, name: str, want: Wanted, opened: list[Image.Image], request: MediaRequest, entries: list[dict[str, Any]]
    ) -> None:
        """The reward's bounds on the request. An optional reward's refusal keeps nothing it
        held, and is then looked for holding nothing (``trial_work``) in each prompt's group
        (what a pairwise judge checks together), and in a refused group each sample alone: a
        sample refused alone, and what is left of its group when that is refused again, get the
        error as their entry. The others are checked together again, and a refusal there (a
        bound on the samples together) is every one's entry. Which samples keep the reward
        never depends on their order, nor on another reward's checks."""
        refusal = self._check_together(name, want, opened, request)
        if refusal is None:
            return
        refused: dict[int, ScorerError] = {}
        groups: dict[str, list[int]] = {}
        for index, prompt in enumerate(request.prompts):
            groups.setdefault(prompt, []).append(index)
        for group in groups.values():
            group_refusal = self._trial(name, opened, request, group)
            if group_refusal is None:
                continue
            for index in group:
                error = group_refusal if len(group) == 1 else self._trial(name, opened, request, [index])
                if error is not None:
                    refused[index] = error
            left = [index for index in group if index not in refused]
            if len(left) == len(group):  # none refused alone: a bound on the group together, its own
                refused.update(dict.fromkeys(group, group_refusal))
            elif left and (error := self._trial(name, opened, request, left)) is not None:
                refused.update(dict.fromkeys(left, error))
        rest = [index for index in range(len(request.spans)) if index not in refused]
        if refused:
            images = [opened[i] for index in rest for i in request.spans[index]]
            refusal = self._check_together(name, want, images, request.samples(rest)) if rest else None
        for index, error in refused.items():
            for i in request.spans[index]:
                entries[i][name] = error
        if refusal is not None:  # a bound on the samples together
            for entry in entries:
                entry.setdefault(name, refusal)

    def _trial(
        self, name: str, opened: list[Image.Image], request: MediaRequest, samples: list[int]
    ) -> ScorerError | None:
        """The reward's check of ``samples`` alone, holding nothing: None when it passes, else its
        refusal (a refusal for the node's load is the request's)."""
        try:
            with trial_work():
                images = [opened[i] for index in samples for i in request.spans[index]]
                self.rewards[name].check_images(images, request.samples(samples))
        except ScorerError as exc:
            if isinstance(exc, FROM_THE_LOAD):
                raise from_reward(name, exc) from None
            return from_reward(name, exc)
        return None

    def _check_together(
        self, name: str, want: Wanted, opened: list[Image.Image], request: MediaRequest
    ) -> ScorerError | None:
        """The reward's bounds on these samples together, holding their work: None when they
        pass; else its refusal, holding nothing, which is raised (the request's) when the
        reward is required or the refusal is for the node's load."""
        try:
            with tentative_work():
                self.rewards[name].check_images(opened, request)
        except ScorerError as exc:
            if not want.optional or isinstance(exc, FROM_THE_LOAD):
                raise from_reward(name, exc) from None
            return from_reward(name, exc)
        return None

    def _prepare(
        self, name: str, want: Wanted, images: list[Image.Image], request: MediaRequest, entries: list[dict[str, Any]]
    ) -> None:
        """The reward's items of the images its check let through, in their entries, with the
        metadata of their samples alone (``sample_metadata``: GenEval's entry per sample)."""
        indices = [i for i in range(len(images)) if name not in entries[i]]
        if not indices:
            return
        scorer, prompts = self.rewards[name], request.item_prompts
        metadata = request.metadata
        if len(indices) < len(images):
            kept = set(indices)
            metadata = scorer.sample_metadata(
                metadata,
                [request.sample_positions[s] for s, span in enumerate(request.spans) if span and span[0] in kept],
            )
        try:
            items = scorer.prepare_images([images[i] for i in indices], [prompts[i] for i in indices], metadata)
        except Exception as exc:
            if not want.optional or isinstance(exc, FROM_THE_LOAD):
                raise from_reward(name, exc) from None
            log.warning("optional reward %s failed to prepare a request: %s", name, exc)
            items = [from_reward(name, exc)] * len(indices)
        for i, item in zip(indices, items):
            entries[i][name] = item

    def score_request(self, items: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Each reward's items through its own runtime, the rewards at once; a reward's error is
        its result for every item it had."""
        names = list(dict.fromkeys(name for entry in items for name in entry))
        results: list[dict[str, Any]] = [dict(entry) for entry in items]

        def score(name: str) -> None:
            indices = [i for i, entry in enumerate(items) if not isinstance(entry[name], BaseException)]
            try:
                scored: list[Any] = self.runtimes[name].score([items[i][name] for i in indices])
            except Exception as exc:  # raised for a required reward, dropped for an optional one, in ``combine``
                scored = [from_reward(name, exc)] * len(indices)
            for i, result in zip(indices, scored):
                results[i][name] = result

        others = [self._pool.submit(contextvars.copy_context().run, score, name) for name in names[1:]]
        if names:
            score(names[0])
        for future in others:
            future.result()
        return results

    def ready_problem(self) -> str | None:
        """A reward that cannot serve now (the judge's engine down) makes the node not ready: a
        balancer sends its requests to a node where every reward answers."""
        for name, scorer in self.rewards.items():
            problem = scorer.ready_problem()
            if problem:
                return f"{name}: {problem}"
        return None

    def info(self) -> dict[str, Any]:
        return {
            "rewards": {
                name: {
                    "scorer": type(scorer).__name__,
                    "ready": self.runtimes[name].ready,
                    "setup_error": self.runtimes[name].setup_error,
                    "batching": self.runtimes[name].batching(),
                    "model": scorer.info(),
                }
                for name, scorer in self.rewards.items()
            }
        }


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
