"""Wire formats: the pickle protocol of flow_grpo / deepgen_rl / VeRL-Omni and its JSON twin.

A network body is never given to ``pickle.loads``: ``SafeUnpickler`` builds only plain data
(dict, list, tuple, str, bytes, int, float, bool, None). Any payload that names a class or a
function — which is how a pickle runs code — is rejected before anything is built.
"""

from __future__ import annotations

import io
import json
import pickle
import pickletools
from typing import Any, Literal

from common.errors import BadRequest, PayloadTooLarge

WireFormat = Literal["pickle", "json"]

PICKLE_MIMETYPE = "application/octet-stream"
JSON_MIMETYPE = "application/json"


# Opcodes per pickle: a request of thousands of images with rich metadata needs tens of
# thousands; more is an attack on memory (each opcode can push an object) or on time.
MAX_PICKLE_OPCODES = 1_000_000
# Tuples nested deeper than this are refused: hashing a tuple (as a dict key or set member)
# recurses in C without a recursion check, and a 200 KB pickle of nested tuples crashes the
# worker with a segmentation fault while it is being unpickled.
MAX_TUPLE_DEPTH = 64
_MARK = -1
_POP_TO_MARK = {"TUPLE", "LIST", "DICT", "FROZENSET", "APPENDS", "SETITEMS", "ADDITEMS", "POP_MARK"}
_POPS = {"POP": 1, "APPEND": 1, "SETITEM": 2, "TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}


def check_pickle_shape(body: bytes) -> None:
    """Refuse, before anything is built, a pickle with too many opcodes or too deep tuples.

    A walk over the opcodes that tracks, for each stack item, how deeply it nests tuples (the
    only hashable containers). Malformed or forbidden streams end the walk: the unpickler then
    refuses them with its own message.
    """
    stack: list[int] = []
    memo: dict[int, int] = {}
    try:
        for count, (op, arg, _) in enumerate(pickletools.genops(body)):
            if count > MAX_PICKLE_OPCODES:
                raise PayloadTooLarge(f"pickle of over {MAX_PICKLE_OPCODES} opcodes")
            name = op.name
            popped: list[int] = []
            if name in _POP_TO_MARK:
                while (item := stack.pop()) != _MARK:
                    popped.append(item)
            elif name in _POPS:
                popped = [stack.pop() for _ in range(_POPS[name])]
            if name.startswith("TUPLE"):
                stack.append(1 + max(popped, default=0))
                if stack[-1] > MAX_TUPLE_DEPTH:
                    raise BadRequest(f"tuples nested over {MAX_TUPLE_DEPTH} deep")
            elif name == "MARK":
                stack.append(_MARK)
            elif name in ("LIST", "DICT", "FROZENSET"):
                stack.append(0)
            elif name == "DUP":
                stack.append(stack[-1])
            elif name.endswith("GET"):
                stack.append(memo.get(arg, 0))
            elif name.endswith("PUT") or name == "MEMOIZE":
                memo[len(memo) if arg is None else arg] = stack[-1]
            elif not op.stack_before and len(op.stack_after) == 1:
                stack.append(0)  # a scalar or an empty container
            elif name not in _POP_TO_MARK and name not in _POPS and name not in ("PROTO", "FRAME", "STOP"):
                return  # an opcode that needs a class: the unpickler refuses it
    except (ValueError, IndexError):  # malformed: truncated, unknown opcode, stack underflow
        return


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
        check_pickle_shape(body)
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
