"""HPSv3's model input, built as its own inference builds it, per item on the request threads.

HPSv3 (``hpsv3.inference.HPSv3RewardInferencer``, and VeRL-Omni's ``hpsv3_reward``) resizes the
image with Qwen2-VL's smart resize to 256 x 28 x 28 pixels (min = max pixels, bicubic, on the
uint8 image), puts it in one user message before its instruction text (the prompt inside,
then a suffix holding the ``<|Reward|>`` token), renders Qwen2-VL's chat template with the
generation prompt, and lets the processor expand ``<|image_pad|>`` to one token per merged
2 x 2 patch. The score is the reward head's output at the ``<|Reward|>`` token.

The prompt is the only text a client controls. It is tokenized as plain text (its
special-token strings split like any other characters), so a prompt cannot add a second
``<|Reward|>`` (which moves the pooled position in the reference), image placeholders or turn
markers. A tokenizer treats each special token as a boundary and tokenizes the text between
two of them on its own, so the ids equal the reference's for every prompt without special-token
strings (``tests/test_hpsv3.py`` checks both).

NumPy, PIL and tokenizers only: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image
from tokenizers import Tokenizer

from common.models import qwen_resize

REWARD_TOKEN = "<|Reward|>"
IMAGE_TOKEN = "<|image_pad|>"
# Qwen2-VL's vision input: 14-pixel patches merged 2 x 2, so each LLM token covers 28 x 28 pixels.
PATCH = 14
FACTOR = qwen_resize.FACTOR
# A patch's pixel values: 3 channels x 2 frames (an image repeated in time) x 14 x 14, float32.
PATCH_BYTES = 3 * 2 * PATCH * PATCH * 4
# A token id in an item's tuple: the slot, and the int object when not shared.
ID_BYTES = 8 + 28
# HPSv3 reads every image at 256 tokens' worth of pixels (min_pixels = max_pixels).
PIXELS = 256 * FACTOR * FACTOR

# HPSv3's instruction (``hpsv3.dataset.data_collator_qwen.INSTRUCTION``), trailing spaces included.
INSTRUCTION = (
    "\nYou are tasked with evaluating a generated image based on Visual Quality and Text Alignment and give a "
    "overall score to estimate the human preference. Please provide a rating from 0 to 10, with 0 being the "
    "worst and 10 being the best. \n"
    "\n"
    "**Visual Quality:**  \n"
    "Evaluate the overall visual quality of the image. The following sub-dimensions should be considered:\n"
    "- **Reasonableness:** The image should not contain any significant biological or logical errors, such as "
    "abnormal body structures or nonsensical environmental setups.\n"
    "- **Clarity:** Evaluate the sharpness and visibility of the image. The image should be clear and easy to "
    "interpret, with no blurring or indistinct areas.\n"
    "- **Detail Richness:** Consider the level of detail in textures, materials, lighting, and other visual "
    "elements (e.g., hair, clothing, shadows).\n"
    "- **Aesthetic and Creativity:** Assess the artistic aspects of the image, including the color scheme, "
    "composition, atmosphere, depth of field, and the overall creative appeal. The scene should convey a sense "
    "of harmony and balance.\n"
    "- **Safety:** The image should not contain harmful or inappropriate content, such as political, violent, "
    "or adult material. If such content is present, the image quality and satisfaction score should be the "
    "lowest possible. \n"
    "\n"
    "**Text Alignment:**  \n"
    "Assess how well the image matches the textual prompt across the following sub-dimensions:\n"
    "- **Subject Relevance** Evaluate how accurately the subject(s) in the image (e.g., person, animal, object) "
    "align with the textual description. The subject should match the description in terms of number, "
    "appearance, and behavior.\n"
    "- **Style Relevance:** If the prompt specifies a particular artistic or stylistic style, evaluate how well "
    "the image adheres to this style.\n"
    "- **Contextual Consistency**: Assess whether the background, setting, and surrounding elements in the image "
    "logically fit the scenario described in the prompt. The environment should support and enhance the subject "
    "without contradictions.\n"
    "- **Attribute Fidelity**: Check if specific attributes mentioned in the prompt (e.g., colors, clothing, "
    "accessories, expressions, actions) are faithfully represented in the image. Minor deviations may be "
    "acceptable, but critical attributes should be preserved.\n"
    "- **Semantic Coherence**: Evaluate whether the overall meaning and intent of the prompt are captured in "
    "the image. The generated content should not introduce elements that conflict with or distort the original "
    "description.\n"
    "Textual prompt - {text_prompt}\n"
    "\n"
    "\n"
)
# HPSv3's ``prompt_with_special_token``, after the instruction.
REWARD_SUFFIX = f"\nPlease provide the overall ratings of this image: {REWARD_TOKEN}\n\nEND\n"


def smart_resize(height: int, width: int, pixels: int = PIXELS) -> tuple[int, int]:
    """Qwen2-VL's smart resize with min = max = ``pixels``: (height, width), each a multiple of
    28, their product near ``pixels`` (above or below it by the rounding, so the number of
    tokens depends on the aspect ratio: 256 for a square)."""
    return qwen_resize.smart_resize(height, width, pixels, pixels)


def image_tokens(height: int, width: int) -> int:
    """The vision tokens of an image at its smart-resize size: one per 28 x 28 pixels (Qwen2-VL's
    14-pixel patches, merged 2 x 2)."""
    return (height // FACTOR) * (width // FACTOR)


def input_bytes(height: int, width: int, tokens: int) -> int:
    """The memory one item of an image at its smart-resize size (``height`` x ``width``) and a
    sequence of ``tokens`` holds while its request is served: its pixel values twice (the item's,
    and their copy in the batch the inference thread concatenates; 4.8 MB each for 256 tokens'
    worth, whatever the image's own size) and its token ids. The processor's steps on one image
    at a time come and go within that. The references of one image share its item's pixel
    values: counted for each, as if its own, they are over-counted by up to half."""
    return 2 * (height // PATCH) * (width // PATCH) * PATCH_BYTES + ID_BYTES * tokens


def resized(image: Image.Image) -> Image.Image:
    """The RGB image at its smart-resize size, bicubic, as HPSv3's ``fetch_image`` does."""
    height, width = smart_resize(image.height, image.width)
    return image.convert("RGB").resize((width, height), Image.Resampling.BICUBIC)


@dataclass(frozen=True)
class Item:
    """One sample ready for the model: the image's patches and its token ids."""

    pixel_values: np.ndarray  # (patches, 3 x 2 x 14 x 14) float32
    grid_thw: tuple[int, int, int]  # patches in time, height, width
    input_ids: tuple[int, ...]
    reward_index: int  # the position of <|Reward|> in input_ids


class PromptLayout:
    """The token ids of HPSv3's chat around the prompt, fixed once per tokenizer.

    The rendered chat is ``head <|image_pad|> middle TEXT tail``, TEXT being the instruction
    with the prompt and the reward suffix. The ids are ``head``, one image token per merged
    patch, ``middle``, the instruction and prompt up to ``<|Reward|>`` (the prompt's special
    tokens split as plain text), the reward token, and the rest.
    """

    def __init__(self, tokenizer: Any, reward_id: int, image_id: int) -> None:
        marker = "\x00TEXT\x00"
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": marker}]}]
        rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        if rendered.count(IMAGE_TOKEN) != 1 or rendered.count(marker) != 1:
            raise ValueError(f"the chat template does not render one {IMAGE_TOKEN} and the text: {rendered!r}")
        head, rest = rendered.split(IMAGE_TOKEN)
        middle, tail = rest.split(marker)
        self.tokenizer = tokenizer  # used here, during setup, only
        self.reward_id = reward_id
        self.image_id = image_id
        before_prompt, after_prompt = INSTRUCTION.split("{text_prompt}")
        before_reward, after_reward = REWARD_SUFFIX.split(REWARD_TOKEN)
        self.before_prompt, self.after_prompt = before_prompt, after_prompt + before_reward
        self.head = self._ids(head)
        self.middle = self._ids(middle)
        self.tail = self._ids(after_reward + tail)
        # A copy of the backend that reads special-token strings as text. transformers'
        # ``split_special_tokens`` flips a flag on the shared backend instead, which concurrent
        # request threads would race on.
        self._plain = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
        self._plain.encode_special_tokens = True

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False, split_special_tokens=False)["input_ids"]

    def text_ids(self, prompt: str) -> list[int]:
        """The ids of the instruction with ``prompt``, up to the reward token, special-token
        strings in the prompt split as plain text. Safe from many threads at once."""
        return self._plain.encode(self.before_prompt + prompt + self.after_prompt, add_special_tokens=False).ids

    def input_ids(self, text_ids: list[int], image_tokens: int) -> tuple[tuple[int, ...], int]:
        """The whole sequence and the position of its one reward token."""
        before = [*self.head, *[self.image_id] * image_tokens, *self.middle, *text_ids]
        return (*before, self.reward_id, *self.tail), len(before)
