# Over 400 lines: the opcode walk, its numpy-array rules (they need its stack and memo) and the decoders.
"""Wire formats: the pickle protocol of flow_grpo / deepgen_rl / VeRL-Omni and its JSON twin.

A network body is never given to ``pickle.loads``. ``check_pickle`` walks its opcodes first
and refuses any opcode outside the plain-data allow-list (so a payload naming a class or a
function, which is how a pickle runs code, is refused before anything is built), data that would
be too large or too deep once expanded, and dict keys that hash slowly; then ``SafeUnpickler``,
whose every class lookup fails, builds dict, list, tuple, str, bytes, int, float, bool, None.
One exception, for flow_grpo's prompts: a 1-D numpy array of str, whose numpy globals the
pre-check follows and ``RequestUnpickler`` gives stand-ins that decode it to a list of str
without numpy (``common/sdk/numpy_strings.py``).
"""

from __future__ import annotations

import io
import json
import pickle
import pickletools
import re
from dataclasses import dataclass
from typing import Any, Literal

from common.limits.errors import BadRequest, PayloadTooLarge, describe_error, quote
from common.sdk import numpy_strings

WireFormat = Literal["pickle", "json"]

PICKLE_MIMETYPE = "application/octet-stream"
JSON_MIMETYPE = "application/json"


# Opcodes per pickle: a request of a thousand images with rich metadata needs tens of
# thousands; more is an attack on memory (each opcode can push an object) or on time (the
# pre-check walks 200,000 to 500,000 opcodes a second). The items of a body's numpy string
# arrays, together, are held to as many (``numpy_strings.StandIns``): 4 bytes of data an item
# at least, each a str object of 50 bytes or more.
MAX_PICKLE_OPCODES = 100_000
# Nodes of the decoded data counted as a tree, a value reached twice through the pickle memo
# counting twice: the work of hashing, comparing or printing it. 430 bytes of tuples that each
# hold the previous one twice are 2**40 nodes, hours of hashing with the GIL held.
MAX_PICKLE_NODES = 1_000_000
# Containers (and the MARKs that open them) nested deeper than this are refused: hashing a
# tuple recurses in C without a recursion check, and a 200 KB pickle of nested tuples crashed
# the worker (SIGSEGV).
MAX_NESTING = 64
# A dict key or set member must hash in constant time without collisions an attacker can choose:
# str and bytes hashes are salted per process, and ints below 2**61 are their own hash.
_KEY_INT_BOUND = 2**61 - 1
# A JSON string once the escapes of quotes and backslashes are gone (``check_json``).
_JSON_STRING = re.compile(rb'"[^"]*"')
PLAIN_DATA = (
    "only plain data (dict, list, tuple, str, bytes, int, float, bool, None) and 1-D numpy arrays of str are accepted"
)

# The scalar opcodes, and whether what they push may be a dict key (None: an int, if small).
_SCALARS: dict[str, bool | None] = {
    **dict.fromkeys(("STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "SHORT_BINUNICODE"), True),
    **dict.fromkeys(("BINUNICODE", "BINUNICODE8", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8"), True),
    **dict.fromkeys(("NONE", "NEWTRUE", "NEWFALSE"), True),
    **dict.fromkeys(("FLOAT", "BINFLOAT", "BYTEARRAY8"), False),
    **dict.fromkeys(("INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4"), None),
}
_EMPTY_CONTAINERS = {"EMPTY_LIST": "list", "EMPTY_TUPLE": "tuple", "EMPTY_DICT": "dict", "EMPTY_SET": "set"}
_FROM_MARK = {"LIST": "list", "TUPLE": "tuple", "DICT": "dict", "FROZENSET": "frozenset"}
_TUPLE_N = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}
# Opcodes that add to the container below their items: (its kind, items taken from the stack).
_ADD_ONE = {"APPEND": ("list", 1), "SETITEM": ("dict", 2)}
_ADD_FROM_MARK = {"APPENDS": "list", "SETITEMS": "dict", "ADDITEMS": "set"}
_BYTES = {"BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8"}
_GETS = {"GET", "BINGET", "LONG_BINGET"}
_PUTS = {"PUT", "BINPUT", "LONG_BINPUT"}


class _Value:
    """What the pre-check knows of one value the unpickler would build."""

    __slots__ = ("depth", "key", "kind", "literal", "nodes", "shared", "size")

    def __init__(self, kind: str, key: bool = False) -> None:
        self.kind = kind  # "scalar", the container type, or a numpy part ("numpy ...")
        self.nodes = 1  # as a tree, memo re-use expanded
        self.depth = 0 if kind == "scalar" else 1
        self.shared = False  # reachable twice (memo GET or DUP): never changed again
        self.key = key  # usable as a dict key or set member
        self.size = 0  # bytes: their length; a tuple: its bytes items' (an array's data)
        self.literal: str | None = None  # a string that may name a numpy global

    def add(self, items: list[_Value]) -> None:
        if self.kind in ("dict", "set", "frozenset"):
            keys = items[::2] if self.kind == "dict" else items
            if not all(item.key for item in keys):
                raise BadRequest(
                    f"pickle has a {self.kind} {'key' if self.kind == 'dict' else 'member'} that is not a string, "
                    f"bytes, an int under 2**61, a bool or None; {PLAIN_DATA}"
                )
        self.nodes += sum(item.nodes for item in items)
        self.depth = max(self.depth, 1 + max((item.depth for item in items), default=0))
        if self.nodes > MAX_PICKLE_NODES:
            raise PayloadTooLarge(
                f"pickle data of over {MAX_PICKLE_NODES} values counted as a tree (shared values counted each "
                "time they are used)"
            )
        if self.depth > MAX_NESTING:
            raise BadRequest(f"pickle has containers nested over {MAX_NESTING} deep")


# Scalars are never changed, so every one of a kind can share one record.
_KEY_SCALAR, _OTHER_SCALAR = _Value("scalar", key=True), _Value("scalar")


class _Stack:
    """The unpickler's stack and marks, with its rule that nothing below the top mark is popped."""

    def __init__(self) -> None:
        self.items: list[_Value] = []
        self.marks: list[int] = []

    def fence(self) -> int:
        return self.marks[-1] if self.marks else 0

    def pop(self, count: int) -> list[_Value]:
        if len(self.items) - count < self.fence():
            raise ValueError("stack underflow")
        taken = self.items[len(self.items) - count :]
        del self.items[len(self.items) - count :]
        return taken

    def pop_mark(self) -> list[_Value]:
        if not self.marks:
            raise ValueError("no MARK")
        start = self.marks.pop()
        taken = self.items[start:]
        del self.items[start:]
        return taken

    def top(self) -> _Value:
        if len(self.items) <= self.fence():
            raise ValueError("stack underflow")
        return self.items[-1]

    def target(self, kind: str) -> _Value:
        """The container an APPEND/SETITEM/ADDITEMS adds to; one reachable twice may not change,
        since the sizes counted where it is used would no longer hold."""
        value = self.top()
        if value.kind != kind:
            raise ValueError(f"adds items to a {value.kind}, not a {kind}")
        if value.shared:
            raise BadRequest(f"pickle changes a {kind} after reusing it (a cycle or a rewrite); {PLAIN_DATA}")
        return value


def check_pickle(body: bytes) -> None:
    """Refuse, before anything is built, a pickle that is not plain data of bounded size.

    Every opcode is checked against an allow-list of those that build plain data (an opcode
    that loads a class, calls, or refers to outside objects or buffers is refused wherever it
    is) while the unpickler's stack, marks and memo are replayed, so that the size of the data
    as a tree, its nesting and its dict keys are known before ``pickle`` builds any of it. A
    stream this walk cannot parse is refused too: it is never handed to the unpickler.
    """
    stack, memo = _Stack(), {}
    try:
        for count, (op, arg, _) in enumerate(pickletools.genops(body), 1):
            if count > MAX_PICKLE_OPCODES:
                raise PayloadTooLarge(f"pickle of over {MAX_PICKLE_OPCODES} opcodes")
            name = op.name
            if name in _SCALARS:
                key = _SCALARS[name]
                key = -_KEY_INT_BOUND < arg < _KEY_INT_BOUND if key is None else key
                if name in _BYTES:
                    stack.items.append(_sized(arg, key))
                elif type(arg) is str and arg in numpy_strings.GLOBAL_PARTS:
                    stack.items.append(_literal(arg))
                else:
                    stack.items.append(_KEY_SCALAR if key else _OTHER_SCALAR)
            elif name in _EMPTY_CONTAINERS:
                stack.items.append(_Value(_EMPTY_CONTAINERS[name]))
            elif name in _FROM_MARK:
                items = stack.pop_mark()
                if name == "DICT" and len(items) % 2:
                    raise ValueError("odd number of items for DICT")
                stack.items.append(_built(_FROM_MARK[name], items))
            elif name in _TUPLE_N:
                stack.items.append(_built("tuple", stack.pop(_TUPLE_N[name])))
            elif name in _ADD_ONE:
                kind, size = _ADD_ONE[name]
                items = stack.pop(size)
                stack.target(kind).add(items)
            elif name in _ADD_FROM_MARK:
                items = stack.pop_mark()
                if name == "SETITEMS" and len(items) % 2:
                    raise ValueError("odd number of items for SETITEMS")
                stack.target(_ADD_FROM_MARK[name]).add(items)
            elif name == "MARK":
                if len(stack.marks) >= MAX_NESTING:
                    raise BadRequest(f"pickle has MARKs nested over {MAX_NESTING} deep")
                stack.marks.append(len(stack.items))
            elif name == "POP":
                if stack.marks and stack.marks[-1] == len(stack.items):
                    stack.marks.pop()
                else:
                    stack.pop(1)
            elif name == "POP_MARK":
                stack.pop_mark()
            elif name == "DUP":
                stack.items.append(_shared(stack.top()))
            elif name in _GETS:
                if arg not in memo:
                    raise ValueError(f"{name} of memo index {arg}, which no PUT stored")
                stack.items.append(_shared(memo[arg]))
            elif name in _PUTS:
                if not 0 <= arg < count:
                    # The unpickler's memo is an array as long as the largest index put: an index
                    # past the values this stream could have stored zero-fills gigabytes.
                    raise BadRequest(f"pickle {name} of memo index {arg}, past the {count} opcodes before it")
                memo[arg] = stack.top()
            elif name == "MEMOIZE":
                memo[len(memo)] = stack.top()
            elif name == "STOP":
                stack.pop(1)  # the result
            elif name == "GLOBAL":
                module, _, attribute = arg.partition(" ")
                stack.items.append(_numpy_global(name, module, attribute))
            elif name == "STACK_GLOBAL":
                module, attribute = stack.pop(2)
                stack.items.append(_numpy_global(name, module.literal, attribute.literal))
            elif name == "REDUCE":
                function, args = stack.pop(2)
                stack.items.append(_numpy_call(function, args))
            elif name == "BUILD":
                _numpy_build(stack.pop(1)[0], stack.top())
            elif name not in ("PROTO", "FRAME"):
                raise BadRequest(f"pickle opcode {name} ({_purpose(name)}) is refused; {PLAIN_DATA}")
    except ValueError as exc:  # truncated, unknown opcode, bad memo index, stack misuse
        raise BadRequest(f"body is not a valid pickle: {describe_error(exc)}") from None


def _built(kind: str, items: list[_Value]) -> _Value:
    value = _Value(kind, key=False)
    value.add(items)
    if kind == "tuple":
        value.size = sum(item.size for item in items)
    return value


def _sized(data: bytes, key: bool) -> _Value:
    value = _Value("scalar", key)
    value.size = len(data)
    return value


def _literal(text: str) -> _Value:
    value = _Value("scalar", key=True)
    value.literal = text
    return value


def _numpy_global(opcode: str, module: str | None, attribute: str | None) -> _Value:
    """One of the numpy globals of a pickled string array (``numpy_strings.GLOBALS``), or a 400."""
    role = numpy_strings.GLOBALS.get((module, attribute)) if module and attribute else None
    if role is None:
        named = f" {quote(f'{module}.{attribute}')}" if module and attribute else ""
        raise BadRequest(f"pickle opcode {opcode} ({_purpose(opcode)}{named}) is refused; {PLAIN_DATA}")
    return _Value(f"numpy {role}")


def _numpy_call(function: _Value, args: _Value) -> _Value:
    """A REDUCE: only ``_reconstruct`` (an array its BUILD fills), ``dtype`` or ``_frombuffer``
    (an array of its data), each on a tuple; the stand-in checks the arguments themselves."""
    if args.kind == "tuple" and function.kind == f"numpy {numpy_strings.RECONSTRUCT}":
        return _Value("numpy pending array")
    if args.kind == "tuple" and function.kind == f"numpy {numpy_strings.DTYPE}":
        return _Value("numpy dtype")
    if args.kind == "tuple" and function.kind == f"numpy {numpy_strings.FROMBUFFER}":
        return _numpy_array(_Value("numpy array"), args.size)
    raise BadRequest(f"pickle opcode REDUCE ({_purpose('REDUCE')}) is refused here; {PLAIN_DATA}")


def _numpy_build(state: _Value, target: _Value) -> None:
    """A BUILD: only the state of a numpy array or dtype just made, before anything refers to
    it again (the record changes in place, so that a memo PUT before the BUILD sees the array)."""
    if state.kind == "tuple" and not target.shared and target.kind == "numpy dtype":
        target.kind = "numpy built dtype"
    elif state.kind == "tuple" and not target.shared and target.kind == "numpy pending array":
        _numpy_array(target, state.size)
    else:
        raise BadRequest(f"pickle opcode BUILD ({_purpose('BUILD')}) is refused here; {PLAIN_DATA}")


def _numpy_array(value: _Value, data_size: int) -> _Value:
    """An array becomes a list of at most a str per 4 bytes of its data (the stand-in holds it
    to exactly its shape): counted as that many values, wherever it is used, before any is built."""
    value.kind, value.nodes = "numpy array", 1 + data_size // 4
    return value


def _shared(value: _Value) -> _Value:
    value.shared = True
    return value


def _purpose(name: str) -> str:
    if name in ("GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "NEWOBJ", "NEWOBJ_EX", "REDUCE", "BUILD"):
        return "loads or calls a class or function"
    if name.startswith("EXT"):
        return "loads a registered extension object"
    if "PERSID" in name:
        return "refers to a persistent object"
    return "refers to an out-of-band buffer"


class SafeUnpickler(pickle.Unpickler):
    """An unpickler whose every class or global lookup fails."""

    def find_class(self, module: str, name: str) -> Any:
        raise BadRequest(f"pickle payload refers to {quote(module)}.{quote(name)}; {PLAIN_DATA}")

    def persistent_load(self, pid: Any) -> Any:
        raise BadRequest(f"pickle payload uses persistent ids; {PLAIN_DATA}")


class RequestUnpickler(SafeUnpickler):
    """A request body's unpickler: plain data, and numpy string arrays through the stand-ins of
    ``numpy_strings`` (never numpy); once it has used them, ``numpy_strings.plain`` finishes it."""

    stand_ins: numpy_strings.StandIns | None = None

    def find_class(self, module: str, name: str) -> Any:
        role = numpy_strings.GLOBALS.get((module, name))
        if role is None:
            return super().find_class(module, name)
        self.stand_ins = self.stand_ins or numpy_strings.StandIns(MAX_PICKLE_OPCODES)
        return self.stand_ins.lookup(role)


@dataclass(frozen=True)
class JsonCap:
    """The most values (dict keys included) a protocol's JSON body may decode to, and the
    setting that says so, which the 413 names."""

    values: int
    setting: str


def check_json(body: bytes, cap: JsonCap) -> None:
    """Refuse a UTF-8 JSON body of more than ``cap.values`` values (dict keys included) before
    ``json.loads`` builds any, in a few C-speed passes over it: 32 MB of ``[],`` are 10 M empty
    lists, 800 MB and 6 s with the GIL held.

    Every value but the outermost follows a ``[``, a ``,`` or a ``:`` outside the strings, and
    every key a ``{`` or a ``,``: one plus their count is at least the values (at most twice:
    an empty container counts its opener). Counted over the whole body first (most bodies end
    there), then without the strings: the escapes that can hide a quote go (``\\\\`` and
    ``\\"``, left to right: in JSON a backslash is only ever in a string and starts an escape),
    then what is between two quotes (in UTF-8 no byte of a longer character is an ASCII one).
    Each string is a value too, so more than ``2 * cap`` quotes is over the cap at once, and
    the strings taken out are at most that many. ``json.loads`` builds nothing past the first
    error, and up to it the count holds, so it bounds invalid JSON as well.
    """
    if _openers(body) <= cap.values:
        return
    unescaped = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    strings = unescaped.count(b'"') // 2
    count = strings if strings > cap.values else _openers(_JSON_STRING.sub(b"", unescaped))
    if count > cap.values:
        raise PayloadTooLarge(f"JSON body of over {cap.values} values; the limit is {cap.values} ({cap.setting})")


def _openers(text: bytes) -> int:
    return 1 + sum(text.count(char) for char in b"[{,:")


def pickle_status(status: int, retry_later: bool) -> int:
    """An error's status on a pickle body of the core protocol (``WireProtocol.status``): 500
    for what a retry later cures, 503 for any other failure of the node's, a 4xx as it is."""
    if status < 500:
        return status
    return 500 if retry_later else 503


def wire_format(content_type: str | None) -> WireFormat:
    """JSON when the client says so; everything else is the pickle protocol.

    flow_grpo posts ``pickle.dumps(...)`` with no content type, curl ``--data-binary`` with a
    form type: both are pickle.
    """
    return "json" if content_type and "json" in content_type.lower() else "pickle"


def decode_body(body: bytes, fmt: WireFormat, json_cap: JsonCap) -> dict[str, Any]:
    """Decode a request body to a dict of plain data, or raise ``BadRequest`` (413 over a limit)."""
    if not body:
        raise BadRequest("empty request body")
    if fmt == "json":
        if json.detect_encoding(body) not in ("utf-8", "utf-8-sig"):
            raise BadRequest("JSON body must be UTF-8 (RFC 8259)")  # the value count reads UTF-8 bytes
        check_json(body, json_cap)
        try:
            payload = json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise BadRequest(f"body is not valid JSON: {describe_error(exc)}") from None
    else:
        check_pickle(body)
        unpickler = RequestUnpickler(io.BytesIO(body))
        try:
            payload = unpickler.load()
            if unpickler.stand_ins:
                payload = numpy_strings.plain(payload)
        except (BadRequest, PayloadTooLarge):
            raise
        except Exception as exc:  # any malformed pickle: truncated, bad opcode, bad memo...
            raise BadRequest(f"body is not a valid pickle: {describe_error(exc)}") from None
    if not isinstance(payload, dict):
        raise BadRequest(f"body must encode a dict, got {type(payload).__name__}")
    return payload


def encode_body(obj: dict[str, Any], fmt: WireFormat) -> tuple[bytes, str]:
    """Encode an answer in the request's format; returns (body, mimetype)."""
    if fmt == "json":
        return json.dumps(obj, allow_nan=True).encode(), JSON_MIMETYPE
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), PICKLE_MIMETYPE
