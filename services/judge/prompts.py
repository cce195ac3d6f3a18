"""The judges' published prompts and the rules that read their replies.

Each prompt is the one its authors publish, word for word (services/judge/README.md names the
file each comes from); each rule reads a reply the way the published code does where that code
is defined, and calls anything else a ``ParseFailure``, never a score: the published parsers
score an unreadable reply 0 (the worst reward), take a ``Final Score: 10`` as 1, or read the
first three numbers of gibberish as the three axes.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

# A reply past this many characters is not read (a model looping until max_tokens).
MAX_REPLY_CHARS = 65_536


class ParseFailure(ValueError):
    """A reply the judge's rule cannot read: the sample's judge failed (``error_types``)."""


@dataclass(frozen=True)
class Sampling:
    """The published sampling parameters of a judge's chat completion; one left None is not
    sent, so the engine applies the model's own generation config, as ``generate`` does."""

    temperature: float | None
    max_tokens: int
    top_p: float | None = None

    def body(self) -> dict[str, float | int]:
        body: dict[str, float | int] = {"max_tokens": self.max_tokens}
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.top_p is not None:
            body["top_p"] = self.top_p
        return body


# UnifiedReward 2.0, pointwise (VeRL-Omni's unified_reward.py).
UNIFIED_REWARD_SAMPLING = Sampling(temperature=0.0, top_p=1.0, max_tokens=512)
# UnifiedReward v1 (flow_grpo's rewards.py: temperature 0, no max_tokens; ours bounds the reply).
UNIFIED_REWARD_V1_SAMPLING = Sampling(temperature=0.0, max_tokens=512)
# UnifiedReward-Think (UnifiedReward's vllm_request.py: do_sample False, max_tokens 4096).
THINK_SAMPLING = Sampling(temperature=0.0, max_tokens=4096)
# VeRL-Omni's genrm_ocr.py.
VLM_OCR_SAMPLING = Sampling(temperature=0.7, top_p=0.8, max_tokens=4096)
# flow_grpo's qwenvl.py: ``generate(max_new_tokens=2048)``, the rest the model's generation config.
QWENVL_SAMPLING = Sampling(temperature=None, max_tokens=2048)


def unified_reward_prompt(caption: str) -> str:
    """UnifiedReward 2.0's point-score prompt for an image (or a video's frame)."""
    return (
        "You are presented with a generated image and its associated text caption. "
        "Your task is to analyze the image across multiple dimensions in relation to the caption. "
        "Specifically:\n"
        "Provide overall assessments for the image along the following axes (each rated from 1 to 5):\n"
        "- Alignment Score: How well the image matches the caption in terms of content.\n"
        "- Coherence Score: How logically consistent the image is "
        "(absence of visual glitches, object distortions, etc.).\n"
        "- Style Score: How aesthetically appealing the image looks, regardless of caption accuracy.\n\n"
        "Output your evaluation using the format below:\n\n"
        "Alignment Score (1-5): X\n"
        "Coherence Score (1-5): Y\n"
        "Style Score (1-5): Z\n\n"
        "Your task is provided as follows:\n"
        f"Text Caption: [{caption}]"
    )


def unified_reward_v1_prompt(caption: str) -> str:
    """flow_grpo's UnifiedReward v1 question (its ``<image>`` marker included, as sent)."""
    return (
        "<image>\nYou are given a text caption and a generated image based on that caption. Your task is to "
        "evaluate this image based on two key criteria:\n1. Alignment with the Caption: Assess how well this "
        "image aligns with the provided caption. Consider the accuracy of depicted objects, their relationships, "
        "and attributes as described in the caption.\n2. Overall Image Quality: Examine the visual quality of "
        "this image, including clarity, detail preservation, color accuracy, and overall aesthetic appeal.\n"
        "Based on the above criteria, assign a score from 1 to 5 after 'Final Score:'.\n"
        f"Your task is provided as follows:\nText Caption: [{caption}]"
    )


_THINK_TEMPLATE = """You are an objective and precise evaluator for image quality comparison. I will provide you with a text caption and two images generated based on this caption. You must analyze the two images carefully and determine which image is better.

        Evaluation procedure:

        1. The caption for the generated images is: 「{caption}」. You must evaluate the two images across these core dimensions:
        - Semantic consistency (how closely the image content aligns with the caption)
        - Aesthetics (composition, color usage, artistic expression)
        - Authenticity (realism and attention to detail)

        2. You are also encouraged to add up to two additional evaluation dimensions if they are relevant to the specific caption or images (e.g., creativity, spatial layout, fine-grained detail). If no extra dimensions are relevant, just keep the three core dimensions.

        3. For each evaluation dimension:
        - Provide a score between 1–10 for both Image 1 and Image 2
        - Provide a short rationale for each score (2–5 short sentences)
        - The evaluation must follow exactly this format with line breaks and indentation:
            Dimension name: 
                Image 1 (x/10) - rationale; 
                Image 2 (y/10) - rationale

        4. After evaluating all dimensions, calculate the total score for each image and show the calculation explicitly, following this exact format:
            Total score:
            Image 1: x+x+x=total
            Image 2: y+y+y=total

        5. Wrap all reasoning and scoring strictly within <think> and </think> tags.

        6. After </think>, output the final judgment strictly inside <answer> and </answer> tags, containing only one of:
        - Image 1 is better
        - Image 2 is better

        Constraints:
        - You must strictly follow the line breaks, indentation, and formatting shown in the example below.
        - Do not merge multiple dimensions into one line. Each dimension must follow the 3-line block format shown below.
        - Do not use Markdown formatting, bullet points, bold text, or headings.
        - Do not output explanations outside <think> and <answer>.
        - The <answer> tag must contain only the final string with no extra words.

        Required output format:

        <think>
        1. Semantic consistency: 
            Image 1 (9/10) - ...; 
            Image 2 (7/10) - ...
        2. Aesthetics: 
            Image 1 (8/10) - ...; 
            Image 2 (8/10) - ...
        3. Authenticity: 
            Image 1 (8/10) - ...; 
            Image 2 (5/10) - ...
        [Additional dimension if any]: 
            Image 1 (7/10) - ...; 
            Image 2 (8/10) - ...
        [Additional dimension if any]: 
            Image 1 (6/10) - ...; 
            Image 2 (7/10) - ...
        Total score:
        Image 1: 9+8+8+7+6=38
        Image 2: 7+8+5+8+7=35
        </think>
        <answer>Image 1 is better</answer>

        Note: The example above is only to illustrate the exact format (line breaks, indentation, symbols, and style). Your actual evaluation must follow this format exactly, but be based on the given caption and images.
        """  # noqa: E501, W291  (the published text, trailing spaces and all)


def think_prompt(caption: str) -> str:
    """UnifiedReward-Think's pairwise prompt (Qwen3-VL image generation), two images before it."""
    return _THINK_TEMPLATE.replace("{caption}", caption)


# Pref-GRPO's UnifiedReward-Think video template (fastvideo/rewards/templates.py), the same text
# as UnifiedReward's qwen3vl_infer_cot_video_generation.py: each video's frames, first then
# second, before it.
_THINK_VIDEO_TEMPLATE = """You are an objective and precise evaluator for video quality comparison. I will provide you with a text caption and a sequence of consecutive frames extracted from two generated videos based on this caption. The first half of the frames belong to Video 1, and the second half of the frames belong to Video 2. You must analyze these two videos carefully and determine which video is better.

        Instructions (MUST follow strictly):
        1. All reasoning, analysis, explanations, and scores MUST be written strictly inside <think> and </think> tags.
        2. The <think> block must start immediately with the first evaluation dimension. Do NOT include any introduction, notes, or explanations before the first numbered dimension.
        3. After </think>, output the final judgment strictly inside <answer> and </answer> tags, containing only one of:
        - Video 1 is better
        - Video 2 is better
        4. Do NOT output anything outside <think> and <answer>. No extra explanations, notes, or prefaces.

        Evaluation procedure:

        1. The caption for the generated videos is: 「{caption}」. The provided frames represent two candidate videos:
        - First half: Video 1
        - Second half: Video 2

        2. You must evaluate the two videos across these core dimensions:
        - Semantic consistency (how closely the video content aligns with the caption)
        - Temporal coherence (smoothness and logical flow of motion across frames)
        - Authenticity (realism and attention to detail)

        3. You may also add up to two additional evaluation dimensions if they are clearly relevant (e.g., camera stability, lighting consistency, creativity). If no extra dimensions are relevant, keep only the three core dimensions.

        4. For each evaluation dimension:
        - Provide a score between 1–10 for both Video 1 and Video 2.
        - Provide a short rationale for each score (2–5 short sentences).
        - Each dimension must follow exactly this 3-line block format with numbering, line breaks, and indentation:
            N. Dimension name: 
                Video 1 (x/10) - rationale; 
                Video 2 (y/10) - rationale

        5. After evaluating all dimensions, calculate the total score for each video and show the calculation explicitly, following this exact format:
            Total score:
            Video 1: x+x+x(+...)=total
            Video 2: y+y+y(+...)=total

        6. All reasoning, analysis, scoring, and totals must be written strictly inside <think> and </think> tags. Nothing related to reasoning or scores may appear outside <think>.

        Required output format (follow this exactly, including line breaks and indentation):

        <think>
        1. Semantic consistency: 
            Video 1 (9/10) - ...; 
            Video 2 (7/10) - ...
        2. Temporal coherence: 
            Video 1 (8/10) - ...; 
            Video 2 (6/10) - ...
        3. Authenticity: 
            Video 1 (7/10) - ...; 
            Video 2 (5/10) - ...
        [Additional dimension if any]: 
            Video 1 (8/10) - ...; 
            Video 2 (6/10) - ...
        [Additional dimension if any]: 
            Video 1 (7/10) - ...; 
            Video 2 (7/10) - ...
        Total score:
        Video 1: 9+8+7+8+7=39
        Video 2: 7+6+5+6+7=31
        </think>
        <answer>Video 1 is better</answer>

        Note: The example above is only to illustrate the exact format (numbering, line breaks, indentation, and style). Your actual evaluation must follow this format exactly, but be based on the given caption and the two provided videos (frames divided into two halves).
        """  # noqa: E501, W291  (the published text, trailing spaces and all)
# Frames of each video a Think video comparison shows, uniformly spaced (Pref-GRPO's num_frames).
THINK_VIDEO_FRAMES = 8


def think_video_prompt(caption: str) -> str:
    """UnifiedReward-Think's pairwise video prompt, both videos' frames before it."""
    return _THINK_VIDEO_TEMPLATE.replace("{caption}", caption)


# flow_grpo's Qwen2.5-VL aesthetic task (``QwenVLScorer.task`` in flow_grpo/qwenvl.py), word for
# word, its line breaks included; sent after the image, the caption not at all.
QWENVL_TASK = """
Your role is to evaluate the aesthetic quality score of given images.
1. Bad: Extremely blurry, underexposed with significant noise, indiscernible
subjects, and chaotic composition.
2. Poor: Noticeable blur, poor lighting, washed-out colors, and awkward
composition with cut-off subjects.
3. Fair: In focus with adequate lighting, dull colors, decent composition but
lacks creativity.
4. Good: Sharp, good exposure, vibrant colors, thoughtful composition with
a clear focal point.
5. Excellent: Exceptional clarity, perfect exposure, rich colors, masterful
composition with emotional impact.

Please first provide a detailed analysis of the evaluation process, including the criteria for judging aesthetic quality, within the <Thought> tag. Then, give a final score from 1 to 5 within the <Score> tag.
<Thought>
[Analyze the evaluation process in detail here]
</Thought>
<Score>X</Score>
"""  # noqa: E501  (the published text)

VLM_OCR_SYSTEM = "You are a helpful assistant."
VLM_OCR_PROMPT = "Please output only the text content from the image without any additional descriptions or formatting."

_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
# VeRL-Omni's pattern for the 2.0 axes.
_AXIS = re.compile(rf"(Alignment|Coherence|Style)\s+Score\s*(?:\(1-5\))?\s*:\s*({_NUMBER})", re.IGNORECASE)
AXES = ("alignment", "coherence", "style")
# flow_grpo's ``Final Score:`` label, followed by the whole number written after it.
_FINAL = re.compile(rf"Final Score:\s*({_NUMBER})")
# flow_grpo's qwenvl.py ``extract_scores`` pattern: whole numbers only (``<Score>3.5</Score>`` is none).
_SCORE_TAG = re.compile(r"<Score>(\d+)</Score>")
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_THINK_CLOSE = "</think>"


def _check_length(reply: str) -> None:
    if len(reply) > MAX_REPLY_CHARS:
        raise ParseFailure(f"the reply has {len(reply)} characters, over {MAX_REPLY_CHARS}")


def _on_scale(text: str, low: float, high: float, what: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and low <= value <= high):
        raise ParseFailure(f"{what} is {text}, outside {low:g}-{high:g}")
    return value


def _one_value(found: list[str], what: str) -> str:
    """The value a reply gives ``what``: several different ones are no answer."""
    if not found:
        raise ParseFailure(f"the reply gives no {what}")
    if len({float(value) for value in found}) > 1:
        raise ParseFailure(f"the reply gives {what} {len(found)} different values: {', '.join(found[:4])}")
    return found[0]


def parse_unified_reward(reply: str) -> dict[str, float]:
    """The three 1-5 axes of a UnifiedReward 2.0 reply, each given (once, or the same each
    time) and on its scale. VeRL-Omni's rule where it is defined; it also takes a reply with
    some axes missing (their mean), out-of-range values (clipped after averaging) or, with no
    axis at all, the reply's first three numbers."""
    _check_length(reply)
    found: dict[str, list[str]] = {axis: [] for axis in AXES}
    for match in _AXIS.finditer(reply):
        found[match.group(1).lower()].append(match.group(2))
    return {axis: _on_scale(_one_value(found[axis], f"{axis} score"), 1, 5, f"{axis} score") for axis in AXES}


def unified_reward_score(axes: dict[str, float]) -> float:
    """The reward of 2.0's axes: their mean mapped from 1-5 to 0-1 (VeRL-Omni's)."""
    return (math.fsum(axes.values()) / len(axes) - 1.0) / 4.0


def parse_unified_reward_v1(reply: str) -> float:
    """The 1-5 ``Final Score`` of a v1 reply. flow_grpo reads one digit 1-5 (``Final Score:
    10`` is 1) and scores a reply without one 0."""
    _check_length(reply)
    return _on_scale(_one_value(_FINAL.findall(reply), "final score"), 1, 5, "final score")


def parse_qwenvl(reply: str) -> float:
    """The 1-5 ``<Score>N</Score>`` of a Qwen-VL aesthetic reply. flow_grpo's ``extract_scores``
    takes the first tag, scores a reply without one 0 and one out of range unbounded (``9``: 1.8)."""
    _check_length(reply)
    return _on_scale(_one_value(_SCORE_TAG.findall(reply), "<Score>"), 1, 5, "<Score>")


def parse_think(reply: str, subject: str = "Image") -> int:
    """Which image (``subject``: or ``Video``) a Think reply prefers, 1 or 2: the ``<answer>``
    after ``</think>``, exactly one of the two published strings (surrounding space aside)."""
    _check_length(reply)
    after = reply.rsplit(_THINK_CLOSE, 1)[1] if _THINK_CLOSE in reply else reply
    answers = {answer.strip() for answer in _ANSWER.findall(after)}
    if not answers:
        raise ParseFailure("the reply has no <answer>...</answer> after its reasoning")
    if len(answers) > 1:
        raise ParseFailure(f"the reply has {len(answers)} different answers")
    answer = answers.pop()
    first, second = f"{subject} 1 is better", f"{subject} 2 is better"
    if answer == first:
        return 1
    if answer == second:
        return 2
    raise ParseFailure(f"the answer {answer[:80]!r} is neither {first!r} nor {second!r}")


def transcription_lines(reply: str) -> list[tuple[str, float]]:
    """A VLM-OCR reply as the OCR rule's recognized lines (each certain): the rule joins them,
    so the reply's line breaks fall away as VeRL-Omni's whitespace removal drops them."""
    _check_length(reply)
    return [(line, 1.0) for line in reply.splitlines()]
