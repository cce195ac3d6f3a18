"""1-D numpy string arrays in a request pickle, decoded to ``list[str]`` without numpy.

flow_grpo's ``unifiedreward_score_remote`` sends its prompts as ``np.array_split(prompts, ...)``
chunks: a ``<U`` array, whose pickle names numpy's reconstruct functions, ``numpy.ndarray`` and
``numpy.dtype``. Those six globals (numpy 1.x's ``numpy.core`` and 2.x's ``numpy._core`` paths)
are given to the unpickler as the stand-ins below, which call nothing the body names: each checks
its arguments to be exactly what numpy writes for a C-ordered 1-D array of ``U<n>`` (either byte
order), its data exactly as long as its shape and item size say, and decodes the UCS-4 data as
numpy's ``tolist`` does (each item's trailing NULs dropped). Anything else is a 400.
``common.sdk.wire.check_pickle`` bounds the data before the unpickler runs; ``plain`` then replaces the
arrays left in the payload by their lists and refuses a stand-in found anywhere else.
"""

from __future__ import annotations

import re
from typing import Any

from common.limits.errors import BadRequest, PayloadTooLarge, quote

RECONSTRUCT, FROMBUFFER, NDARRAY, DTYPE = "reconstruct", "frombuffer", "ndarray class", "dtype class"
GLOBALS: dict[tuple[str, str], str] = {
    ("numpy.core.multiarray", "_reconstruct"): RECONSTRUCT,  # numpy 1.x, pickle protocols 3-4
    ("numpy._core.multiarray", "_reconstruct"): RECONSTRUCT,  # numpy 2.x
    ("numpy.core.numeric", "_frombuffer"): FROMBUFFER,  # protocol 5 (Python 3.14's default)
    ("numpy._core.numeric", "_frombuffer"): FROMBUFFER,
    ("numpy", "ndarray"): NDARRAY,
    ("numpy", "dtype"): DTYPE,
}
# The strings a STACK_GLOBAL of these is made of: the pre-check keeps their text, no other's.
GLOBAL_PARTS = frozenset(part for pair in GLOBALS for part in pair)
ACCEPTED = "a 1-D numpy array of str (dtype U) as flow_grpo pickles its prompts"
_UNICODE_TYPE = re.compile(r"U([1-9][0-9]{0,8})")
_CODECS = {"<": "utf-32-le", ">": "utf-32-be"}


def _refuse(what: str) -> BadRequest:
    return BadRequest(f"pickle has a numpy {what}; only {ACCEPTED} is accepted")


def _exact(value: Any, expected: tuple[Any, ...]) -> bool:
    """``value`` is a tuple equal to ``expected`` item by item, each of the same type
    (``True == 1`` and ``1.0 == 1`` are not the same here)."""
    return (
        type(value) is tuple
        and len(value) == len(expected)
        and all(type(got) is type(want) and got == want for got, want in zip(value, expected))
    )


class Dtype:
    """``numpy.dtype('U<n>')`` as numpy pickles it: ``dtype('U<n>', False, True)``, then its state
    by BUILD, ``(3, '<' or '>', None, None, None, 4n, 4, 8)``."""

    __hash__ = None  # type: ignore[assignment]  # never a dict key or set member

    def __init__(self, *args: Any) -> None:
        code = args[0] if args else None
        match = _UNICODE_TYPE.fullmatch(code) if type(code) is str else None
        if match is None or not _exact(args, (code, False, True)):
            raise _refuse(f"dtype other than U<n> ({quote(args)})")
        self.chars = int(match.group(1))
        self.codec: str | None = None

    def __setstate__(self, state: Any) -> None:
        order = state[1] if type(state) is tuple and len(state) == 8 and type(state[1]) is str else ""
        expected = (3, order, None, None, None, 4 * self.chars, 4, 8)
        if self.codec is not None or order not in _CODECS or not _exact(state, expected):
            raise _refuse(f"dtype state other than numpy's for U{self.chars} ({quote(state)})")
        self.codec = _CODECS[order]


class PendingArray:
    """``numpy.ndarray`` as ``_reconstruct`` makes it: empty until BUILD gives it numpy's state
    ``(1, shape, dtype, is_fortran, data)``."""

    __hash__ = None  # type: ignore[assignment]

    def __init__(self, stand_ins: StandIns) -> None:
        self.stand_ins = stand_ins
        self.strings: list[str] | None = None

    def __setstate__(self, state: Any) -> None:
        if self.strings is not None or type(state) is not tuple or len(state) != 5:
            raise _refuse(f"array state other than numpy's ({quote(state)})")
        version, shape, dtype, fortran, data = state
        if type(version) is not int or version != 1 or fortran is not False:
            raise _refuse(f"array state other than a C-ordered one's ({quote(state)})")
        self.strings = self.stand_ins.decode(data, dtype, shape)

    def plain(self) -> list[str]:
        if self.strings is None:
            raise _refuse("array without its state")
        return self.strings


class NdarrayClass:
    """``numpy.ndarray``: only ever the first argument of ``_reconstruct``."""

    __hash__ = None  # type: ignore[assignment]


NDARRAY_CLASS = NdarrayClass()


class StandIns:
    """The numpy functions one body's unpickler is given: they share its budget of items, all
    its arrays together (a plain pickle makes a str an opcode, at most ``max_items`` of them)."""

    def __init__(self, max_items: int) -> None:
        self.max_items = self.items_left = max_items

    def lookup(self, role: str) -> Any:
        return {RECONSTRUCT: self.reconstruct, FROMBUFFER: self.frombuffer, NDARRAY: NDARRAY_CLASS, DTYPE: Dtype}[role]

    def reconstruct(self, *args: Any) -> PendingArray:
        """``_reconstruct(ndarray, (0,), b'b')``, numpy's only call of it."""
        if len(args) != 3 or args[0] is not NDARRAY_CLASS or not _exact(args[1:], ((0,), b"b")):
            raise _refuse(f"_reconstruct call other than numpy's ({quote(args)})")
        return PendingArray(self)

    def frombuffer(self, *args: Any) -> list[str]:
        """``_frombuffer(data, dtype, shape, 'C')``: numpy's protocol-5 pickle of a contiguous array."""
        if len(args) != 4 or not _exact(args[3:], ("C",)):
            raise _refuse(f"_frombuffer call other than a C-ordered array's ({quote(args)})")
        return self.decode(args[0], args[1], args[2])

    def decode(self, data: Any, dtype: Any, shape: Any) -> list[str]:
        """The items of a 1-D ``U<n>`` array as ``tolist`` gives them: ``n`` code points each, its
        trailing NULs dropped; the data exactly ``count * 4n`` bytes, so that nothing is made of a
        declared size but of the bytes the body carries."""
        if type(dtype) is not Dtype or dtype.codec is None:
            raise _refuse(f"array whose dtype is not a U<n> dtype ({quote(dtype)})")
        if type(shape) is not tuple or len(shape) != 1 or type(shape[0]) is not int or shape[0] < 0:
            raise _refuse(f"array of a shape other than 1-D ({quote(shape)})")
        if type(data) not in (bytes, bytearray):
            raise _refuse(f"array whose data is not bytes ({type(data).__name__})")
        size = 4 * dtype.chars
        if len(data) != shape[0] * size:
            raise _refuse(f"array of {shape[0]} items of {size} bytes with {len(data)} bytes of data")
        if shape[0] > self.items_left:
            raise PayloadTooLarge(f"pickle has numpy arrays of over {self.max_items} items in all")
        self.items_left -= shape[0]
        try:
            text = data.decode(dtype.codec, errors="surrogatepass")
        except UnicodeDecodeError as exc:
            raise _refuse(f"string that is not UCS-4 ({exc.reason} at byte {exc.start})") from None
        chars = dtype.chars
        return [text[start : start + chars].rstrip("\x00") for start in range(0, len(text), chars)]


_SCALAR_TYPES = (str, bytes, bytearray, int, float, bool, type(None))


def plain(value: Any, done: dict[int, tuple[Any, Any]] | None = None) -> Any:
    """``value`` with each array replaced by its list (lists and dicts changed in place, a tuple
    holding an array rebuilt, once: what the pickle shares stays shared, and a tuple reached
    2**20 times through the memo is not rebuilt 2**20 times); a stand-in anywhere else is a 400.
    ``done`` maps a container's id to it and its result, holding both so that no id is reused."""
    done = {} if done is None else done
    kind = type(value)
    if kind in _SCALAR_TYPES:
        return value
    if kind is PendingArray:
        return value.plain()
    if kind in (set, frozenset):  # members are hashable: no stand-in is
        return value
    if kind not in (list, dict, tuple):
        raise _refuse(f"object where plain data belongs ({kind.__name__})")
    if id(value) in done:
        return done[id(value)][1]
    done[id(value)] = (value, value)  # a list or dict is its own result; a tuple holds no cycle
    if kind is list:
        value[:] = [plain(item, done) for item in value]
    elif kind is dict:
        for key, item in value.items():
            value[key] = plain(item, done)
    else:
        items = tuple(plain(item, done) for item in value)
        if any(new is not old for new, old in zip(items, value)):
            done[id(value)] = (value, items)
            return items
    return value
