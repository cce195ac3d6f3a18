"""Wire formats: the pickle protocol of flow_grpo / deepgen_rl / VeRL-Omni and its JSON twin.

A network body is never given to ``pickle.loads``: ``SafeUnpickler`` builds only plain data
(dict, list, tuple, str, bytes, int, float, bool, None). Any payload that names a class or a
function — which is how a pickle runs code — is rejected before anything is built.
"""

from __future__ import annotations

import io
import json
import pickle
from typing import Any, Literal

from common.errors import BadRequest

WireFormat = Literal["pickle", "json"]

PICKLE_MIMETYPE = "application/octet-stream"
JSON_MIMETYPE = "application/json"


class SafeUnpickler(pickle.Unpickler):
    """An unpickler whose every class or global lookup fails."""

    def find_class(self, module: str, name: str) -> Any:
        raise BadRequest(
            f"pickle payload refers to {module}.{name}; only plain data "
            "(dict, list, tuple, str, bytes, int, float, bool, None) is accepted"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise BadRequest("pickle payload uses persistent ids; only plain data is accepted")


def wire_format(content_type: str | None) -> WireFormat:
    """JSON when the client says so; everything else is the pickle protocol.

    flow_grpo posts ``pickle.dumps(...)`` with no content type, curl ``--data-binary`` with a
    form type: both are pickle.
    """
    return "json" if content_type and "json" in content_type.lower() else "pickle"


def decode_body(body: bytes, fmt: WireFormat) -> dict[str, Any]:
    """Decode a request body to a dict of plain data, or raise ``BadRequest``."""
    if not body:
        raise BadRequest("empty request body")
    if fmt == "json":
        try:
            payload = json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise BadRequest(f"body is not valid JSON: {exc}") from None
    else:
        try:
            payload = SafeUnpickler(io.BytesIO(body)).load()
        except BadRequest:
            raise
        except Exception as exc:  # any malformed pickle: truncated, bad opcode, bad memo...
            raise BadRequest(f"body is not a valid pickle: {type(exc).__name__}: {exc}") from None
    if not isinstance(payload, dict):
        raise BadRequest(f"body must encode a dict, got {type(payload).__name__}")
    return payload


def encode_body(obj: dict[str, Any], fmt: WireFormat) -> tuple[bytes, str]:
    """Encode an answer in the request's format; returns (body, mimetype)."""
    if fmt == "json":
        return json.dumps(obj, allow_nan=True).encode(), JSON_MIMETYPE
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), PICKLE_MIMETYPE
