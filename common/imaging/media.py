"""The image scorers' request (docs/ARCHITECTURE.md §5.1): samples that are images or videos.

A request carries ``images`` (one encoded image per sample) or ``videos`` (one list of encoded
frames per sample), never both, and one prompt per sample. ``metadata["frame_interval"]`` (k)
chooses frames 0, k, 2k, ... of every video; each chosen frame is one image to score, one item
of the scorer's batches, and counts toward the request's items, pixels and work bytes as an
image does. A frame not chosen is never decoded: only its first bytes are read, to check that it
is a JPEG, PNG or WebP. A video's score is its chosen frames' scores combined by the request's
``VideoRule`` (``metadata["video_rule"]``: the mean unless a scorer offers others).
"""

from __future__ import annotations

import base64
import binascii
import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from common.configuration.config import env_name
from common.configuration.settings import CoreSettings
from common.imaging.image_bytes import JPEG_START, PNG_SIGNATURE
from common.imaging.image_request import (
    check_items,
    check_metadata,
    check_prompts,
    encoded_images,
    image_names,
)
from common.limits.errors import PayloadTooLarge, Unprocessable, quote


@dataclass(frozen=True)
class VideoRule:
    """How a video's chosen frames' scores make its score: their mean, or (``positive_only``)
    the mean of those above 0, 0 when none is; ``frame_interval`` is the k a request that does
    not say gets."""

    name: str
    frame_interval: int = 1
    positive_only: bool = False

    def aggregate(self, scores: Sequence[float]) -> float:
        kept = [score for score in scores if score > 0] if self.positive_only else list(scores)
        return math.fsum(kept) / len(kept) if kept else 0.0


MEAN = VideoRule("mean")


@dataclass(frozen=True)
class MediaRequest:
    """A validated image or video request.

    ``images`` are the encoded images to decode and score, in order: every image of an image
    request, or every chosen frame of every video; ``names`` say which each is in errors
    (``images[2]``, ``videos[1][8]``). ``frames`` gives, per video, the indices of its chosen
    frames (None for an image request); ``prompts`` are one per sample.
    """

    images: list[bytes]
    names: list[str]
    prompts: list[str]
    metadata: dict[str, Any]
    frames: list[list[int]] | None
    rule: VideoRule
    # Each sample's index in the client's request (None: 0, 1, ...): samples taken alone or
    # together (the multi service's checks) keep their own, so that an error names the prompt
    # the client sent and a scorer reads their entries of per-sample metadata (GenEval's).
    positions: tuple[int, ...] | None = None

    @property
    def sample_positions(self) -> Sequence[int]:
        """Each sample's index in the client's request."""
        return range(len(self.prompts)) if self.positions is None else self.positions

    @property
    def first_prompt(self) -> int:
        """The index in the client's request of ``prompts[0]``."""
        return self.sample_positions[0] if self.prompts else 0

    @functools.cached_property
    def spans(self) -> list[range]:
        """Which of ``images`` each sample has: its image, or its video's chosen frames."""
        if self.frames is None:
            return [range(index, index + 1) for index in range(len(self.images))]
        starts = [0]
        for chosen in self.frames:
            starts.append(starts[-1] + len(chosen))
        return [range(start, end) for start, end in itertools.pairwise(starts)]

    def sample(self, index: int) -> MediaRequest:
        """Sample ``index`` alone, as a request of its own (its images keep their names)."""
        return self.samples([index])

    def samples(self, indices: Sequence[int]) -> MediaRequest:
        """The samples ``indices`` (in order), as a request of their own; their images keep their
        names and the samples their positions in the client's request."""
        spans = [self.spans[index] for index in indices]
        return MediaRequest(
            [self.images[i] for span in spans for i in span],
            [self.names[i] for span in spans for i in span],
            [self.prompts[index] for index in indices],
            self.metadata,
            None if self.frames is None else [self.frames[index] for index in indices],
            self.rule,
            tuple(self.sample_positions[index] for index in indices),
        )

    @property
    def item_prompts(self) -> list[str]:
        """The prompt of each image to score: a video's for each of its chosen frames."""
        if self.frames is None:
            return self.prompts
        return [prompt for prompt, chosen in zip(self.prompts, self.frames) for _ in chosen]


def video_rule(metadata: dict[str, Any], rules: dict[str, VideoRule]) -> VideoRule:
    """The rule ``metadata["video_rule"]`` names among a scorer's ``rules`` (default ``mean``)."""
    name = metadata.get("video_rule", MEAN.name)
    if not isinstance(name, str) or name not in rules:
        raise Unprocessable(
            f"metadata['video_rule'] = {quote(name)} is not a video rule of this service; known: {', '.join(rules)}"
        )
    return rules[name]


def frame_interval(metadata: dict[str, Any], rule: VideoRule) -> int:
    """``metadata["frame_interval"]``: a whole number from 1 (the rule's default when absent)."""
    interval = metadata.get("frame_interval", rule.frame_interval)
    if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
        raise Unprocessable(f"metadata['frame_interval'] = {quote(interval)} must be a whole number from 1")
    return interval


def parse_media_request(payload: dict[str, Any], core: CoreSettings, rules: dict[str, VideoRule]) -> MediaRequest:
    """Check the shape and limits of an image or video request, choose the videos' frames,
    and base64-decode (JSON) only the images to score; a clear 413/422 otherwise."""
    if "images" in payload and "videos" in payload:
        raise Unprocessable("a request carries 'images' or 'videos', not both; send images and videos separately")
    metadata = check_metadata(payload)
    rule = video_rule(metadata, rules)
    if "videos" not in payload:
        images = payload.get("images")
        if not isinstance(images, (list, tuple)):
            raise Unprocessable("'images' must be a list of encoded images (or 'videos' a list of lists of frames)")
        check_items(len(images), "images", core)
        prompts = check_prompts(payload.get("prompts"), len(images), "image", core)
        names = image_names(len(images))
        return MediaRequest(encoded_images(images, names), names, prompts, metadata, None, rule)

    videos = payload["videos"]
    if not isinstance(videos, (list, tuple)):
        raise Unprocessable("'videos' must be a list of videos, each a list of encoded frames")
    check_items(len(videos), "videos", core)
    prompts = check_prompts(payload.get("prompts"), len(videos), "video", core)
    interval = frame_interval(metadata, rule)
    for index, video in enumerate(videos):
        if not isinstance(video, (list, tuple)):
            raise Unprocessable(f"videos[{index}] must be a list of encoded frames, got {type(video).__name__}")
        if not video:
            raise Unprocessable(f"videos[{index}] has no frames")
        if len(video) > core.max_frames:
            raise PayloadTooLarge(
                f"videos[{index}] has {len(video)} frames; the limit is {core.max_frames} "
                f"({env_name('', 'max_frames')})"
            )
    frames = [list(range(0, len(video), interval)) for video in videos]
    check_items(sum(map(len, frames)), f"chosen frames (every {interval}th frame of {len(videos)} videos)", core)
    chosen, names = [], []
    for index, video in enumerate(videos):
        for number, value in enumerate(video):
            name = f"videos[{index}][{number}]"
            if number % interval:
                _check_format(value, name)
            else:
                chosen.append(value)
                names.append(name)
    return MediaRequest(encoded_images(chosen, names), names, prompts, metadata, frames, rule)


def _check_format(value: Any, name: str) -> None:
    """A frame not chosen, from its first bytes only: a JPEG, PNG or WebP, as bytes or base64
    text (422 otherwise); never decoded."""
    if isinstance(value, str):
        try:
            head = base64.b64decode(value[:16], validate=True)
        except (binascii.Error, ValueError):
            raise Unprocessable(f"{name} is not valid base64") from None
    elif isinstance(value, (bytes, bytearray)):
        head = bytes(value[:12])
    else:
        raise Unprocessable(f"{name} must be bytes (or base64 text in JSON), got {type(value).__name__}")
    webp = head.startswith(b"RIFF") and head[8:12] == b"WEBP"
    if not (head.startswith(JPEG_START) or head.startswith(PNG_SIGNATURE) or webp):
        raise Unprocessable(f"{name} is not a JPEG, PNG or WebP")
