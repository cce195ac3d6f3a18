"""From what the trainer sent to the code to run: response location and code extraction."""

from __future__ import annotations

import re

from services.code.languages import language_of

# Chat-template and tokenizer markers that surround a decoded response: <|im_end|>,
# <|eot_id|>, </s>, <eos>, <end_of_turn>, DeepSeek's <｜end▁of▁sentence｜>, ...
SPECIAL_TOKEN = re.compile(
    r"<\|[^|<>\s]{1,64}\|>|<｜[^｜<>]{1,64}｜>|</?s>|<pad>|<unk>|<eos>|<bos>|<end_of_turn>|<start_of_turn>"
)
_EDGE_TOKENS = re.compile(rf"^(?:\s*(?:{SPECIAL_TOKEN.pattern}))+|(?:(?:{SPECIAL_TOKEN.pattern})\s*)+$")
FENCE = re.compile(r"```([^\n`]*)\n(.*?)(?:```|\Z)", re.DOTALL)
PROMPT_TAIL_CHARS = 256


def response_from_query(query: str, prompt: str) -> str | None:
    """The response part of ``query`` (prompt + response decoded together).

    The prompt may have been cut from the front, so the response starts after the last
    occurrence of the prompt's final characters. ``None`` when the prompt cannot be located:
    such a query is never scored as text.
    """
    if query.startswith(prompt):
        return query[len(prompt) :]
    tail = prompt[-PROMPT_TAIL_CHARS:]
    at = query.rfind(tail)
    if at < 0:
        return None
    return query[at + len(tail) :]


def strip_special_tokens(text: str) -> str:
    """Drop special tokens (and padding) before and after the response."""
    return _EDGE_TOKENS.sub("", text).strip()


def extract_code(response: str) -> str:
    """The code of ``extract_program``."""
    return extract_program(response)[1]


def extract_program(response: str) -> tuple[str | None, str]:
    """(language of its fence's tag or None, code): the last fenced block whose tag is a known
    language (``languages.ALIASES``) or empty; else the last fenced block whatever its tag;
    else the whole response. ``""`` when that has no code.

    A last block cut off by the length limit (no closing fence) still counts.
    """
    text = strip_special_tokens(response)
    blocks = FENCE.findall(text)
    if not blocks:
        return None, text if text.strip() else ""
    tagged = [(language_of(tag), code) for tag, code in blocks]
    known = [(language, code) for (language, code), (tag, _) in zip(tagged, blocks, strict=True)
             if language is not None or not tag.strip()]  # fmt: skip
    language, code = known[-1] if known else (None, blocks[-1][1])
    return language, code if code.strip() else ""
