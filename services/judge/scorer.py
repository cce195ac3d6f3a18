"""VLM judges served through an OpenAI-compatible engine (services/judge/README.md): each
sample's image and prompt become the judge's published chat completion, its reply the score by
the published rule, and a reply that does not parse the sample's judge failure, never a 0."""

from __future__ import annotations

import base64
import io
import itertools
import math
import time
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from common.configuration.config import ConfigError, describe, env_name, from_env
from common.configuration.settings import CoreSettings
from common.imaging.images import once_per_image, shown_size
from common.imaging.media import MediaRequest, VideoRule
from common.limits.clients import current_client
from common.limits.deadlines import current_deadline
from common.limits.errors import PayloadTooLarge, Unprocessable
from common.models import qwen_resize
from common.models.ocr_rule import RuleOptions, check_targets, reward
from common.pipeline.scorer import ImageScorer, Query, Samples, Scored
from services.judge import prompts
from services.judge.engine import EngineClient, Reply
from services.judge.prompts import ParseFailure
from services.judge.settings import PAIRWISE, SECTION, JudgeSettings, settings_problem

# flow_grpo resizes each image to 512x512 before sending it to UnifiedReward v1.
V1_SIZE = (512, 512)
# flow_grpo's Qwen-VL judge hands its images to qwen_vl_utils, whose fetch_image resizes each
# (bicubic) to Qwen2-VL's smart size between these bounds before the processor sees it.
QWENVL_PIXELS = (4 * qwen_resize.FACTOR**2, 16384 * qwen_resize.FACTOR**2)
# flow_grpo's reward names (``multi_score`` in flow_grpo/rewards.py) of the judges it calls: its
# ``unifiedreward`` is UnifiedReward v1, not the 2.0 judge named ``unifiedreward`` here.
FLOW_GRPO_NAMES = {"qwenvl": "qwenvl", "unifiedreward-v1": "unifiedreward"}
PARSE_FAILURE = "parse_failure"
# Set while the judge's own service prepares a request: only there are a video's frames made one
# item (``video_samples``); the multi service would judge them one by one.
_WHOLE_VIDEOS: ContextVar[bool] = ContextVar("whole_videos", default=False)


@dataclass(frozen=True)
class JudgeItem:
    """One image (or chosen frame) to judge, or for the pairwise judge one video's frames: their
    data URLs, the prompt, and for VLM OCR the prompt's target texts."""

    urls: tuple[str, ...]
    prompt: str
    targets: list[str] | None
    show_reply: bool
    video: bool = False


def data_url(image: Image.Image) -> str:
    """A PNG data URL of an image (lossless: the judge sees the pixels the trainer made)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def qwenvl_sized(image: Image.Image) -> Image.Image:
    """The image as qwen_vl_utils hands it to the processor in flow_grpo's Qwen-VL judge: resized
    to its smart size, bicubic (the engine's processor then leaves a size it already fits)."""
    height, width = qwen_resize.smart_resize(image.height, image.width, *QWENVL_PIXELS)
    return image.resize((width, height), Image.Resampling.BICUBIC)


def _sent(judge: str, image: Image.Image) -> Image.Image:
    """The image as the judge's published client sends it."""
    if judge == "unifiedreward-v1":
        return image.resize(V1_SIZE)
    if judge == "qwenvl":
        return qwenvl_sized(image)
    return image


def _show_reply(metadata: dict[str, Any]) -> bool:
    option = metadata.get("judge", {})
    if not isinstance(option, dict) or set(option) - {"reply"} or not isinstance(option.get("reply", False), bool):
        raise Unprocessable("metadata['judge'] must be {'reply': true|false}")
    return option.get("reply", False)


class JudgeScorer(ImageScorer):
    name = "judge"
    batched = False

    def __init__(self, core: CoreSettings) -> None:
        super().__init__(core)
        self.settings = from_env(JudgeSettings, SECTION)
        problem = settings_problem(self.settings)
        if problem:
            raise ConfigError(problem)
        self.pairwise = self.settings.judge == PAIRWISE
        self.ocr_options = RuleOptions()
        self.engine: EngineClient | None = None
        self.model = self.settings.model

    def setup(self, device: str) -> None:
        s = self.settings
        self.engine = EngineClient(
            s.engine,
            self.name,
            s.concurrency,
            s.retries,
            s.backoff_s,
            s.backoff_max_s,
            s.api_key,
            max_queued=self.core.max_queue,
            probe_s=s.ready_probe_s,
        )
        try:
            served = self.engine.wait_until_up(s.engine_wait_s, need_models=not self.model)
        except Exception as exc:
            raise ConfigError(
                f"the judge's engine at {s.engine} ({env_name(SECTION, 'engine')}) did not list its models "
                f"within {s.engine_wait_s:g} s: {exc}"
            ) from None
        if not self.model:
            if not served:
                raise ConfigError(f"the engine at {s.engine} serves no model")
            self.model = served[0]

    def aliases(self) -> tuple[str, ...]:
        """flow_grpo's name of this judge in a multi request (``multi_score``'s keys)."""
        return (FLOW_GRPO_NAMES[self.settings.judge],) if self.settings.judge in FLOW_GRPO_NAMES else ()

    def score_bounds(self) -> tuple[float, float]:
        """Every judge's score is in [0, 1]: a 1-5 score over 5 or rescaled, a win rate, the OCR
        rule's score; a parse failure's fill (0, or the request's mean) is too."""
        return 0.0, 1.0

    def ready_problem(self) -> str | None:
        """The engine down, as its calls and an occasional probe show."""
        return self.engine.health.problem() if self.engine is not None else None

    def check_images(self, images: Sequence[Image.Image], request: MediaRequest) -> None:
        _show_reply(request.metadata)
        if self.settings.judge == "qwenvl":
            for image, name in zip(images, request.names):
                width, height = shown_size(image)
                try:
                    qwen_resize.smart_resize(height, width, *QWENVL_PIXELS)
                except ValueError as exc:
                    raise Unprocessable(f"{name} is {width}x{height}: Qwen2.5-VL takes no {exc}") from None
        if self.settings.judge == "vlm-ocr":
            for index, prompt in enumerate(request.prompts, request.first_prompt):
                check_targets(prompt, self.ocr_options, index)
        if self.pairwise:
            if request.frames is not None and not _WHOLE_VIDEOS.get():
                raise Unprocessable(
                    "the pairwise judge compares whole videos only when it is served alone (run.sh judge); "
                    "in a multi request it takes images"
                )
            counts: dict[str, int] = {}
            for prompt in request.prompts:
                counts[prompt] = counts.get(prompt, 0) + 1
            alone = [index for index, prompt in enumerate(request.prompts, request.first_prompt) if counts[prompt] < 2]
            if alone:
                raise Unprocessable(
                    f"prompts[{alone[0]}] has no other sample in the request: the pairwise judge scores each "
                    "sample by its wins against the others of its prompt, so send each prompt's group together"
                )
            orders = 2 if self.settings.both_orders else 1
            asked = sum(n * (n - 1) // 2 for n in counts.values()) * orders
            if asked > self.settings.max_comparisons:
                raise PayloadTooLarge(
                    f"the request's groups need {asked} comparisons; the limit is {self.settings.max_comparisons} "
                    f"({env_name(SECTION, 'max_comparisons')}): send smaller groups"
                )

    def prepare_images(self, images: list[Image.Image], prompts_: list[str], metadata: dict[str, Any]) -> list[Any]:
        show = _show_reply(metadata)

        def encode(batch: list[Image.Image]) -> list[str]:
            return [data_url(_sent(self.settings.judge, image)) for image in batch]

        urls = once_per_image(images, encode)
        targets: dict[str, list[str] | None] = {}
        if self.settings.judge == "vlm-ocr":
            for index, prompt in enumerate(prompts_):
                if prompt not in targets:
                    targets[prompt] = check_targets(prompt, self.ocr_options, index)
        return [JudgeItem((url,), prompt, targets.get(prompt), show) for url, prompt in zip(urls, prompts_)]

    def prepare_samples(self, payload: dict[str, Any], query: Query = ()) -> Samples:
        token = _WHOLE_VIDEOS.set(True)
        try:
            return super().prepare_samples(payload, query)
        finally:
            _WHOLE_VIDEOS.reset(token)

    def video_samples(self, items: list[JudgeItem], sizes: list[int], rule: VideoRule) -> Samples:
        """The pairwise judge compares two videos in one call, as Pref-GRPO does: each video one
        item of its chosen frames' ``THINK_VIDEO_FRAMES`` uniformly spaced ones (np.linspace)."""
        if not self.pairwise:
            return super().video_samples(items, sizes, rule)
        videos, start = [], 0
        for size in sizes:
            frames = items[start : start + size]
            start += size
            shown = np.linspace(0, size - 1, min(prompts.THINK_VIDEO_FRAMES, size), dtype=int)
            urls = tuple(frames[index].urls[0] for index in shown)
            videos.append(JudgeItem(urls, frames[0].prompt, None, frames[0].show_reply, video=True))
        return Samples(videos)

    def _expires(self) -> float:
        deadline = current_deadline()
        return deadline.expires if deadline is not None else time.monotonic() + self.core.request_timeout_s

    def _replies(self, bodies: list[dict[str, Any]]) -> list[Reply]:
        """The engine's replies, the calls queued for the request's client (read here, on the
        request's thread: the senders are the engine's own)."""
        return self.engine.replies(bodies, self._expires(), current_client())

    def _body(self, messages: list[dict[str, Any]], sampling: prompts.Sampling) -> dict[str, Any]:
        return {"model": self.model, "messages": messages, **sampling.body()}

    def score_request(self, items: Sequence[JudgeItem]) -> list[Scored]:
        if self.pairwise:
            return self._pairwise(items)
        replies = self._replies([self._pointwise_body(item) for item in items])
        return self._fill_failures([self._pointwise(item, reply) for item, reply in zip(items, replies)])

    def _pointwise_body(self, item: JudgeItem) -> dict[str, Any]:
        image = {"type": "image_url", "image_url": {"url": item.urls[0]}}
        judge = self.settings.judge
        if judge == "vlm-ocr":
            messages = [
                {"role": "system", "content": prompts.VLM_OCR_SYSTEM},
                {"role": "user", "content": [image, {"type": "text", "text": prompts.VLM_OCR_PROMPT}]},
            ]
            return self._body(messages, prompts.VLM_OCR_SAMPLING)
        if judge == "qwenvl":
            text, sampling = prompts.QWENVL_TASK, prompts.QWENVL_SAMPLING
        elif judge == "unifiedreward-v1":
            text, sampling = prompts.unified_reward_v1_prompt(item.prompt), prompts.UNIFIED_REWARD_V1_SAMPLING
        else:
            text, sampling = prompts.unified_reward_prompt(item.prompt), prompts.UNIFIED_REWARD_SAMPLING
        return self._body([{"role": "user", "content": [image, {"type": "text", "text": text}]}], sampling)

    def _pointwise(self, item: JudgeItem, reply: Reply) -> Scored:
        extras: dict[str, Any] = {"reply": reply.text} if item.show_reply else {}
        judge = self.settings.judge
        try:
            _check_read(reply)
            if judge == "vlm-ocr":
                lines = prompts.transcription_lines(reply.text)
                return Scored(reward(item.targets, lines, self.ocr_options), extras)
            if judge == "unifiedreward-v1":
                final = prompts.parse_unified_reward_v1(reply.text)
                return Scored(final / 5.0, {**extras, "final_score": final})
            if judge == "qwenvl":
                rating = prompts.parse_qwenvl(reply.text)
                return Scored(rating / 5.0, {**extras, "rating": rating})
            axes = prompts.parse_unified_reward(reply.text)
            return Scored(prompts.unified_reward_score(axes), {**extras, **axes})
        except ParseFailure as exc:
            return Scored(math.nan, {**extras, "error_types": PARSE_FAILURE, "error": str(exc)})

    def _pairwise(self, items: Sequence[JudgeItem]) -> list[Scored]:
        """Every pair of each prompt's group judged at once (both orders when asked); each
        sample's score its win rate over its comparisons."""
        groups: dict[str, list[int]] = {}
        for index, item in enumerate(items):
            groups.setdefault(item.prompt, []).append(index)
        orders = [
            (first, second)
            for members in groups.values()
            for a, b in itertools.combinations(members, 2)
            for first, second in ([(a, b), (b, a)] if self.settings.both_orders else [(a, b)])
        ]
        answers = self._replies([self._pair_body(items[a], items[b]) for a, b in orders])
        wins = [0.0] * len(items)
        counted = [0] * len(items)
        failed = [0] * len(items)
        replies: list[list[str]] = [[] for _ in items]
        policy = self.settings.parse_failure_score
        for (a, b), reply in zip(orders, answers):
            for index in (a, b):
                replies[index].append(reply.text)
            try:
                _check_read(reply)
                winner = a if prompts.parse_think(reply.text, "Video" if items[a].video else "Image") == 1 else b
            except ParseFailure:
                failed[a] += 1
                failed[b] += 1
                if policy in ("zero", "tie"):
                    counted[a] += 1
                    counted[b] += 1
                    if policy == "tie":
                        wins[a] += 0.5
                        wins[b] += 0.5
                continue
            wins[winner] += 1
            counted[a] += 1
            counted[b] += 1
        results = []
        for index, item in enumerate(items):
            extras: dict[str, Any] = {
                "comparisons": counted[index] + (failed[index] if policy in ("nan", "mean") else 0)
            }
            if item.show_reply:
                extras["replies"] = replies[index]
            if failed[index]:
                extras["error_types"] = PARSE_FAILURE
                extras["failed_comparisons"] = failed[index]
            if (failed[index] and policy == "nan") or not counted[index]:
                results.append(Scored(math.nan, extras))
            else:
                results.append(Scored(wins[index] / counted[index], extras))
        return results

    def _pair_body(self, first: JudgeItem, second: JudgeItem) -> dict[str, Any]:
        """The two images (or the first video's frames, then the second's), then the prompt."""
        content: list[dict[str, Any]] = [
            {"type": "image_url", "image_url": {"url": url}} for url in first.urls + second.urls
        ]
        text = prompts.think_video_prompt(first.prompt) if first.video else prompts.think_prompt(first.prompt)
        content.append({"type": "text", "text": text})
        return self._body([{"role": "user", "content": content}], prompts.THINK_SAMPLING)

    def _fill_failures(self, results: list[Scored]) -> list[Scored]:
        """Parse failures scored by the ``parse_failure_score`` setting (NaN already)."""
        policy = self.settings.parse_failure_score
        if policy == "nan":
            return results
        parsed = [r.score for r in results if "error_types" not in r.extras]
        fill = 0.0 if policy == "zero" else (math.fsum(parsed) / len(parsed) if parsed else math.nan)
        return [Scored(fill, r.extras) if "error_types" in r.extras else r for r in results]

    def info(self) -> dict[str, Any]:
        return {"judge": self.settings.judge, "model": self.model, "settings": describe(self.settings)}


def _check_read(reply: Reply) -> None:
    """A reply the engine sent too much of to read is a parse failure, as a long one is."""
    if reply.problem is not None:
        raise ParseFailure(reply.problem)
