"""The scorer contract: a model server reduced to ``setup``, ``prepare`` and ``score``.

``common`` turns a scorer into an HTTP service (``common.server.app.create_app``): it decodes the
wire format, calls ``prepare`` on the request thread, gathers the items of concurrent requests
into batches for ``score`` on one inference thread, and encodes the answer. A scorer owns only
its model and its rule. An image scorer (``ImageScorer``) does not parse its request: the core
parses the image or video request, applies the limits and decodes each image or chosen frame
once, and the scorer turns decoded images into items (``prepare_images``).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeAlias

from PIL import Image

from common.configuration.settings import CoreSettings
from common.imaging.images import load_images, open_images
from common.imaging.media import MEAN, MediaRequest, VideoRule, parse_media_request
from common.limits.errors import Unprocessable
from common.pipeline import metrics
from common.pipeline.batching import BatchedCall, DynamicBatcher


@dataclass
class Scored:
    """A score with per-sample extras; each extras key becomes a per-sample list in the answer.

    ``score(batch)`` may return plain floats or ``Scored`` values.
    """

    score: float
    extras: dict[str, Any] = field(default_factory=dict)


# What a scorer answers for one item.
Result: TypeAlias = float | Scored
# A request's URL query, as (key, value) pairs in order, a key as often as it is given.
Query: TypeAlias = Sequence[tuple[str, str]]


@dataclass(frozen=True)
class Samples:
    """A request's items and how their results make its samples' results: ``combine`` (None:
    one item per sample, results as they are; a video request: its chosen frames per video)."""

    items: list[Any]
    combine: Callable[[Sequence[Result]], list[Result]] | None = None

    @classmethod
    def of(cls, prepared: list[Any] | Samples) -> Samples:
        return prepared if isinstance(prepared, Samples) else cls(list(prepared))

    def results(self, item_results: Sequence[Result]) -> list[Result]:
        return list(item_results) if self.combine is None else self.combine(item_results)


class Scorer(ABC):
    """Base class of every scorer: ``setup``, ``prepare``, and one of ``score`` / ``score_request``.

    ``score(batch)`` is the model call over items gathered from concurrent requests; the
    runtime batches it. A scorer whose pipeline has several model calls with per-item work
    between them implements ``score_request(items)`` instead and batches each model call itself
    (``batched_stage``). Class attributes give the batching defaults beside the model, as LitServe
    does; the ``SCORER_MAX_BATCH`` / ``SCORER_MAX_WAIT_MS`` settings override them.
    """

    name: ClassVar[str]
    # Whether ``prepare_samples`` reads the URL's query (``multi``); the others' requests may have none.
    reads_query: ClassVar[bool] = False
    max_batch: ClassVar[int] = 16
    max_wait_ms: ClassVar[float] = 5.0
    # False: no model call of the scorer's is batched, so the batching settings do not apply to it
    # (docs/settings.md lists the defaults of those that are).
    batched: ClassVar[bool] = True

    def __init__(self, core: CoreSettings) -> None:
        """Read the scorer's own settings; raise ``ConfigError`` here for a bad setting, so
        the service refuses to start. Keep it cheap: loading belongs in ``setup``."""
        if (type(self).score is not Scorer.score) == self.batches_own_stages():
            raise TypeError(f"{type(self).__name__}: implement exactly one of score(batch) and score_request(items)")
        self.core = core

    @abstractmethod
    def setup(self, device: str) -> None:
        """Load weights once and warm up. Runs in the worker, off the request path.

        Raise ``common.configuration.config.ConfigError`` with a message naming the setting to fix when
        something the model needs is missing.
        """

    @abstractmethod
    def prepare(self, payload: dict[str, Any]) -> list[Any]:
        """Validate a parsed request body and turn it into items, one per sample.

        Runs on the request thread, so expensive per-item work (image decoding,
        preprocessing) belongs here, in parallel, not in ``score``. Raise
        ``common.limits.errors.Unprocessable`` / ``PayloadTooLarge`` for bad input.
        """

    def prepare_samples(self, payload: dict[str, Any], query: Query = ()) -> Samples:
        """The request's items and how their results make its samples' (what the core calls):
        ``prepare``'s items, one per sample, unless the scorer says otherwise (``ImageScorer``).
        ``query``: the URL's, which only a scorer that takes options there reads (``multi``)."""
        return Samples(self.prepare(payload))

    def score(self, batch: Sequence[Any]) -> Sequence[Result]:
        """Score a batch of items gathered from one or many requests, one result per item, in
        order. Runs on the worker's inference thread, one batch at a time."""
        raise NotImplementedError

    def score_request(self, items: Sequence[Any]) -> Sequence[Result]:
        """Score one request's items on its request thread, one result per item, in order; for
        scorers that batch their model calls stage by stage (``batched_stage``) rather than as
        one ``score`` call."""
        raise NotImplementedError

    def answer_fields(self, results: Sequence[Result]) -> dict[str, Any]:
        """The answer's fields beyond ``scores``, ``outputs`` and the ``Scored`` extras' per-sample
        lists, made from a request's results (``multi``: each reward's scores); none by default."""
        return {}

    @classmethod
    def batches_own_stages(cls) -> bool:
        """True when the scorer implements ``score_request`` (and batches its own stages)."""
        return cls.score_request is not Scorer.score_request

    def batch_settings(self) -> tuple[int, float]:
        """The batch size and wait of a batched call: ``SCORER_MAX_BATCH`` / ``SCORER_MAX_WAIT_MS``
        when set, else the class's defaults."""
        return (
            self.core.max_batch or self.max_batch,
            self.core.max_wait_ms if self.core.max_wait_ms is not None else self.max_wait_ms,
        )

    def batched_stage(
        self,
        fn: Callable[[Sequence[Any]], Sequence[Any]],
        stage: str,
        max_batch: int | None = None,
    ) -> BatchedCall:
        """Wrap a model call so that concurrent request threads share its invocations; at most
        ``max_batch`` items per call (default: ``SCORER_MAX_BATCH``, else the class's).

        The runtime wraps ``score`` this way. A scorer whose pipeline has several model calls
        with per-item work between them (OCR: detection, box post-processing, recognition)
        implements ``score_request`` and wraps each model call instead, so the work between them
        runs on the request threads, in parallel. Call from ``setup``.
        """
        default_size, wait = self.batch_settings()
        size = max_batch or default_size  # a stage's own size (its own setting) comes first

        def record(count: int, seconds: float) -> None:
            metrics.BATCH_SIZE.labels(self.name, stage).observe(count)
            metrics.BATCH_SECONDS.labels(self.name, stage).observe(seconds)

        batcher = DynamicBatcher(fn, size, wait, max(self.core.max_queue, size), record, f"{self.name}-{stage}")
        return BatchedCall(batcher, self.core.request_timeout_s)

    def ready_problem(self) -> str | None:
        """Why the scorer, set up, cannot serve now (a remote engine it calls is down); None when
        it can. ``/ready`` asks on every probe: answer from what is known, never by a call."""
        return None

    def info(self) -> dict[str, Any]:
        """Model description for ``GET /info``."""
        return {}


class ImageScorer(Scorer):
    """A scorer of (image, prompt) samples, videos included: the core parses the request
    (``images``, or ``videos`` of frames of which every ``frame_interval``-th is scored),
    checks every limit from the bytes and headers, calls ``check_images`` with the headers
    read, decodes each image or chosen frame once to the RGB image a viewer shows, and hands
    them to ``prepare_images``; a video's result is its frames' combined by the request's
    ``video_rule`` (ARCHITECTURE.md §5.1). Implement ``prepare_images`` (instead of
    ``prepare``) and one of ``score`` / ``score_request``, as any scorer.
    """

    # The rules ``metadata["video_rule"]`` may name; a scorer may offer more (OCR: ``video_ocr``).
    video_rules: ClassVar[dict[str, VideoRule]] = {MEAN.name: MEAN}

    def check_images(self, images: Sequence[Image.Image], request: MediaRequest) -> None:
        """The scorer's own bounds before any pixel is decoded, from the images' headers
        (``images[i]`` opened, not loaded; ``request.names[i]`` names it in an error), its
        prompts and metadata: a 413/422 for what its model cannot take, ``hold_work`` for the
        model inputs it will make. The core's limits have passed. Default: nothing."""

    def sample_metadata(self, metadata: dict[str, Any], positions: Sequence[int]) -> dict[str, Any]:
        """The request's metadata as a request of the samples at ``positions`` alone would
        carry it, for ``prepare_images`` of some of a request's samples (the multi service's): a
        scorer whose metadata holds an entry per sample (GenEval's) keeps theirs. Default: as it is."""
        return metadata

    def aliases(self) -> tuple[str, ...]:
        """Other names a multi request may give this reward, once set up from its settings:
        flow_grpo's for it (``multi_score``'s keys), where they are not its service's. Default: none."""
        return ()

    def score_bounds(self) -> tuple[float, float]:
        """The lowest and highest score the scorer can give, once set up: what a sample that drops
        it as an optional reward of the multi service is counted at, so that a drop never raises a
        sample's weighted sum. Default: unbounded (such a sample gets no sum)."""
        return -math.inf, math.inf

    @abstractmethod
    def prepare_images(self, images: list[Image.Image], prompts: list[str], metadata: dict[str, Any]) -> list[Any]:
        """Decoded RGB images (a video's chosen frames among them) and each one's prompt -> one
        item each, on the request thread: the model's own preprocessing. The images are shared
        (one decode for every scorer of a sample): read them, never modify them. A 4xx that an
        image's header or a prompt can tell belongs in ``check_images``, which names the image."""

    def prepare(self, payload: dict[str, Any]) -> list[Any]:
        """The items of an image or video request, one per image or chosen frame."""
        return self.prepare_samples(payload).items

    def prepare_samples(self, payload: dict[str, Any], query: Query = ()) -> Samples:
        request = parse_media_request(payload, self.core, self.video_rules)
        if "rewards" in request.metadata:
            # As a query's rewards (common/server/serving.py): this reward's score alone is no weighted sum.
            raise Unprocessable(
                f"metadata['rewards'] names the rewards of a multi service; the {self.name} service scores "
                f"{self.name} alone"
            )
        opened = open_images(request.images, self.core, request.names)
        self.check_images(opened, request)
        images = decode(opened, request, self.name)
        items = self.prepare_images(images, request.item_prompts, request.metadata) if images else []
        if request.frames is None:
            return Samples(items)
        return self.video_samples(items, [len(chosen) for chosen in request.frames], request.rule)

    def video_samples(self, items: list[Any], sizes: list[int], rule: VideoRule) -> Samples:
        """A video request's samples from its chosen frames' items (``sizes``: each video's count,
        in order): each frame scored alone, a video's frames combined by ``rule``. A scorer that
        judges a video whole makes one item of each video's frames instead."""
        return Samples(items, lambda results: combine_frames(results, sizes, rule))


def decode(opened: list[Image.Image], request: MediaRequest, service: str) -> list[Image.Image]:
    """The request's opened images decoded, each distinct one once (``load_images``), counted
    in ``scorer_images_decoded_total``: the one decode a request's images get, whatever the
    number of scorers reading them."""
    images = load_images(opened, request.names)
    metrics.IMAGES_DECODED.labels(service).inc(len({id(image) for image in opened}))
    return images


def combine_frames(results: Sequence[Result], sizes: Sequence[int], rule: VideoRule) -> list[Result]:
    """Each video's frame results -> its result: the score by ``rule`` over the frames' scores,
    ``frame_scores`` (the chosen frames' scores, in order), and each extras key of the frames'
    ``Scored`` results as their mean when all are numbers, else the list of the frames' values."""
    combined: list[Result] = []
    start = 0
    for size in sizes:
        frames = results[start : start + size]
        start += size
        scores = [float(r.score if isinstance(r, Scored) else r) for r in frames]
        extras: dict[str, Any] = {}
        for key in sorted({key for r in frames if isinstance(r, Scored) for key in r.extras}):
            values = [r.extras.get(key) if isinstance(r, Scored) else None for r in frames]
            numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
            extras[key] = math.fsum(values) / len(values) if numbers else values
        extras["frame_scores"] = scores
        combined.append(Scored(rule.aggregate(scores), extras))
    return combined
