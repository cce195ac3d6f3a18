"""The image request's shape and limits (docs/ARCHITECTURE.md §5.1): ``images`` (bytes, or
base64 text in the JSON twin), one prompt per image and the free-form ``metadata``, checked
before any byte of an image is read."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from typing import Any

from common.configuration.config import env_name
from common.configuration.settings import CoreSettings
from common.limits.errors import PayloadTooLarge, Unprocessable, quote


def encoded_image(value: Any, name: str) -> bytes:
    """An image as sent: bytes, or base64 text in the JSON twin (422 otherwise)."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, str):  # the JSON twin carries base64
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise Unprocessable(f"{name} is not valid base64") from None
    raise Unprocessable(f"{name} must be bytes (or base64 text in JSON), got {type(value).__name__}")


def encoded_images(values: Sequence[Any], names: Sequence[str]) -> list[bytes]:
    """``encoded_image`` of each value, once per distinct object: the pickle memo lets a body
    reference one string or bytearray many times, and each reference must not cost its own
    base64 decode or copy (the values stay referenced by ``values``, so their ids are stable)."""
    decoded: dict[int, bytes] = {}
    images = []
    for value, name in zip(values, names):
        if id(value) not in decoded:
            decoded[id(value)] = encoded_image(value, name)
        images.append(decoded[id(value)])
    return images


def check_metadata(payload: dict[str, Any]) -> dict[str, Any]:
    """The request's free-form ``metadata`` dict ({} when absent)."""
    metadata = payload.get("metadata")
    metadata = {} if metadata is None else metadata
    if not isinstance(metadata, dict):
        raise Unprocessable(f"'metadata' must be a dict (or absent), got {quote(metadata)}")
    return metadata


def check_prompts(prompts: Any, count: int, kind: str, core: CoreSettings) -> list[str]:
    """One prompt (a string within ``SCORER_MAX_PROMPT_CHARS``) per sample of ``kind`` (image, video)."""
    if not isinstance(prompts, (list, tuple)):
        raise Unprocessable(f"'prompts' must be a list of strings, one per {kind}")
    if len(prompts) != count:
        raise Unprocessable(f"{count} {kind}s but {len(prompts)} prompts; need one prompt per {kind}")
    for index, prompt in enumerate(prompts):
        if not isinstance(prompt, str):
            raise Unprocessable(f"prompts[{index}] must be a string, got {type(prompt).__name__}")
        if len(prompt) > core.max_prompt_chars:
            raise PayloadTooLarge(
                f"prompts[{index}] has {len(prompt)} characters; the limit is {core.max_prompt_chars}"
            )
    return list(prompts)


def check_items(count: int, what: str, core: CoreSettings) -> None:
    """At most ``SCORER_MAX_ITEMS`` images to score in one request (413)."""
    if count > core.max_items:
        raise PayloadTooLarge(
            f"{count} {what} in one request; the limit is {core.max_items} ({env_name('', 'max_items')})"
        )


def image_names(count: int) -> list[str]:
    """How errors name the images of an image request: ``images[i]``."""
    return [f"images[{index}]" for index in range(count)]
