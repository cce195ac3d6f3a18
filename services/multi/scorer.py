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
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from PIL import Image

from common.configuration.config import ConfigError
from common.configuration.settings import CoreSettings
from common.imaging.images import open_images
from common.imaging.media import MEAN, MediaRequest, VideoRule, parse_media_request
from common.limits.budget import tentative_work, trial_work
from common.limits.errors import ScorerError
from common.pipeline.runtime import ScorerRuntime
from common.pipeline.scorer import ImageScorer, Query, Result, Samples, Scorer, decode
from common.setup import registry
from services.multi import combine
from services.multi.combine import FROM_THE_LOAD, combined_results, from_reward
from services.multi.settings import listed_rewards
from services.multi.wanted import Wanted, requested

log = logging.getLogger(__name__)


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
            names = listed_rewards()
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

    def answer_fields(self, results: Sequence[Result]) -> dict[str, Any]:
        return combine.answer_fields(results)

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
