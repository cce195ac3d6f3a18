"""From what the trainer sent to the code to run: response location and code extraction."""

from __future__ import annotations

import re

from services.code.languages import LANGUAGES, language_of

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


def extract_program(response: str, language: str | None = None) -> tuple[str | None, str]:
    """(language of its fence's tag or None, code) of the program in ``response``. ``""`` when
    that has no code; a last block cut off by the length limit (no closing fence) still counts.

    With the ``language`` the label (or request) names: the last fenced block tagged in it (any
    of its standards: ``cpp20`` for ``cpp``), else the last untagged one, so that a sample run or
    a cross-check in another language after it is not taken for the program. Otherwise, or when
    neither exists: the last block whose tag is a known language (``languages.ALIASES``) or
    empty; else the last fenced block whatever its tag; else the whole response.
    """
    text = strip_special_tokens(response)
    blocks = FENCE.findall(text)
    if not blocks:
        return None, text if text.strip() else ""
    tagged = [(language_of(tag), code, not tag.strip()) for tag, code in blocks]
    chosen = None
    if language is not None:
        wanted = _family(language)
        chosen = _last([b for b in tagged if b[0] is not None and _family(b[0]) == wanted]) or _last(
            [b for b in tagged if b[2]]
        )
    chosen = chosen or _last([b for b in tagged if b[0] is not None or b[2]]) or tagged[-1]
    return chosen[0], chosen[1] if chosen[1].strip() else ""


def _family(language: str) -> str:
    """What a language's standards share (its sources' extension): ``cpp`` and ``cpp20`` are one."""
    return LANGUAGES[language].extension if language in LANGUAGES else language


def _last(blocks: list[tuple[str | None, str, bool]]) -> tuple[str | None, str, bool] | None:
    return blocks[-1] if blocks else None
