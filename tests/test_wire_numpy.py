"""flow_grpo's prompts as a numpy array (``unifiedreward_score_remote`` pickles its
``np.array_split`` chunks): a 1-D ``U<n>`` array, as numpy 1.x and 2.x pickle it in protocols
3-5, decodes to the list ``tolist`` gives, without numpy; every other use of its globals is a 400
or a 413 before anything is built. The attacks are pickles written opcode by opcode."""

from __future__ import annotations

import pickle
import pickletools
import tracemalloc
from typing import Any

import numpy as np
import pytest

from common.limits.errors import BadRequest, PayloadTooLarge
from common.sdk.wire import MAX_PICKLE_OPCODES, JsonCap, decode_body

pytestmark = pytest.mark.unit

CAP = JsonCap(1_000_000, "SCORER_MAX_JSON_VALUES")
# numpy 1.26.4 (Python 3.11) pickling {"prompts": np.array(["a cat", "dög 🐱"])}: its
# ``numpy.core`` paths, protocol 4 (``_reconstruct``) and 5 (``_frombuffer``).
NUMPY_1_PROTOCOL_4 = bytes.fromhex(
    "800495b7000000000000007d948c0770726f6d707473948c156e756d70792e636f72652e6d756c74696172726179948c0c5f72"
    "65636f6e7374727563749493948c056e756d7079948c076e6461727261799493944b0085944301629487945294284b014b0285"
    "9468058c0564747970659493948c02553594898887945294284b038c013c944e4e4e4b144b044b087494628943286100000020"
    "00000063000000610000007400000064000000f6000000670000002000000031f4010094749462732e"
)
NUMPY_1_PROTOCOL_5 = bytes.fromhex(
    "800595a2000000000000007d948c0770726f6d707473948c126e756d70792e636f72652e6e756d65726963948c0b5f66726f6d"
    "62756666657294939428962800000000000000610000002000000063000000610000007400000064000000f600000067000000"
    "2000000031f40100948c056e756d7079948c0564747970659493948c02553594898887945294284b038c013c944e4e4e4b144b"
    "044b087494624b0285948c01439474945294732e"
)


def decode(body: bytes) -> dict[str, Any]:
    return decode_body(body, "pickle", CAP)


def chunks(prompts: list[str]) -> list[np.ndarray]:
    """The prompts as flow_grpo's remote rewards cut them: ``np.array_split`` into chunks of 64."""
    return np.array_split(prompts, np.ceil(len(prompts) / 64))


PROMPTS = ["a cat", "dög 🐱 on a 看板", "", "ends in NUL\x00", "\x00leading", "x" * 300, "lone \ud800 surrogate"]


@pytest.mark.parametrize("protocol", [3, 4, 5])
@pytest.mark.parametrize("order", ["<", ">"])
def test_numpys_own_string_arrays_decode_to_their_tolist(protocol: int, order: str) -> None:
    strided = np.array(["abc", "d", "e"])[::2]  # not contiguous: its data copied out, as _reconstruct's
    for chunk in [*chunks(PROMPTS * 20), np.array(["a"]), np.array([], dtype="<U3"), strided]:
        array = chunk.astype(f"{order}U{chunk.dtype.itemsize // 4}")
        body = pickle.dumps({"images": [b"\xff\xd8"], "prompts": array, "also": [array, (array,)]}, protocol=protocol)
        decoded = decode(body)
        assert decoded == {
            "images": [b"\xff\xd8"],
            "prompts": array.tolist(),
            "also": [array.tolist(), (array.tolist(),)],
        }
        assert type(decoded["prompts"]) is list and all(type(item) is str for item in decoded["prompts"])


def test_numpy_1s_pickles_decode_too() -> None:
    for body in (NUMPY_1_PROTOCOL_4, NUMPY_1_PROTOCOL_5):
        assert b"numpy.core." in body
        assert decode(body) == {"prompts": ["a cat", "dög 🐱"]}


def test_protocol_2_is_refused_as_its_bytes_are() -> None:
    """Protocols 0-2 pickle bytes through ``_codecs.encode``: refused for images already."""
    with pytest.raises(BadRequest, match=r"'_codecs.encode'"):
        decode(pickle.dumps({"prompts": np.array(["a"])}, protocol=2))


@pytest.mark.parametrize(
    ("array", "refusal"),
    [
        (np.array([b"ab", b"c"]), "dtype other than U<n>"),  # S: bytes prompts
        (np.array(["a", 1], dtype=object), "dtype other than U<n>"),
        (np.array([1.5, 2.0]), "dtype other than U<n>"),
        (np.array([["a", "b"], ["c", "d"]]), "shape other than 1-D"),
        (np.asfortranarray(np.array([["a", "b"], ["c", "d"]])), "C-ordered"),
        (np.array(["a"]).reshape(()), "shape other than 1-D"),
    ],
)
@pytest.mark.parametrize("protocol", [3, 4, 5])
def test_other_numpy_arrays_are_400s(array: np.ndarray, refusal: str, protocol: int) -> None:
    body = pickle.dumps({"prompts": array}, protocol=protocol)
    with pytest.raises(BadRequest, match=refusal):
        decode(body)


# --- Pickles written opcode by opcode: protocol 4, numpy 2's paths unless told.


def op(name: str) -> bytes:
    return next(code.code.encode("latin-1") for code in pickletools.opcodes if code.name == name)


def lit(value: Any) -> bytes:
    """The opcodes that push ``value`` (plain data), memo operations taken out."""
    return pickletools.optimize(pickle.dumps(value, protocol=3))[2:-1]


def text(value: str) -> bytes:
    data = value.encode("utf-8", "surrogatepass")
    return op("BINUNICODE") + len(data).to_bytes(4, "little") + data


def glob(module: str, name: str) -> bytes:
    return text(module) + text(name) + op("STACK_GLOBAL")


def tup(*parts: bytes) -> bytes:
    return op("MARK") + b"".join(parts) + op("TUPLE")


RECONSTRUCT = glob("numpy._core.multiarray", "_reconstruct")
NDARRAY_ARGS = tup(glob("numpy", "ndarray"), lit((0,)), lit(b"b"))


def dtype(code: Any = "U3", state: Any = (3, "<", None, None, None, 12, 4, 8), args: bytes | None = None) -> bytes:
    return glob("numpy", "dtype") + (args or lit((code, False, True))) + op("REDUCE") + lit(state) + op("BUILD")


AB_CDE = "ab\x00cde".encode("utf-32-le")


def array(
    shape: Any = (2,), data: Any = AB_CDE, dtype_ops: bytes | None = None, ops: dict[str, bytes] | None = None
) -> bytes:
    """``_reconstruct`` then BUILD of numpy's state, each part replaceable by its opcodes (``ops``
    by name: version, shape, dtype, fortran, data); by default ``["ab", "cde"]``."""
    parts = {"version": lit(1), "shape": lit(shape), "dtype": dtype_ops or dtype(), "fortran": lit(False)}
    parts = {**parts, "data": lit(data), **(ops or {})}
    return RECONSTRUCT + NDARRAY_ARGS + op("REDUCE") + tup(*parts.values()) + op("BUILD")


def body(value: bytes, key: str = "prompts") -> bytes:
    return b"\x80\x04" + op("EMPTY_DICT") + lit(key) + value + op("SETITEM") + op("STOP")


def test_the_hand_written_array_is_numpys() -> None:
    assert decode(body(array())) == {"prompts": ["ab", "cde"]}
    frombuffer = glob("numpy._core.numeric", "_frombuffer")
    assert decode(
        body(
            frombuffer
            + tup(lit(b"a\0\0\0"), dtype("U1", (3, "<", None, None, None, 4, 4, 8)), lit((1,)), lit("C"))
            + op("REDUCE")
        )
    ) == {"prompts": ["a"]}


ATTACKS = {
    "a trillion items in 24 bytes": (array(shape=(10**12,)), "10\\d+ items of 12 bytes with 24 bytes"),
    "a gigachar dtype": (
        array(dtype_ops=dtype("U999999999", (3, "<", None, None, None, 3_999_999_996, 4, 8))),
        "2 items of 3999999996 bytes",
    ),
    "a ten-digit dtype": (
        array(dtype_ops=dtype("U1000000000", (3, "<", None, None, None, 4 * 10**9, 4, 8))),
        "dtype other than U",
    ),
    "a negative item size": (array(dtype_ops=dtype("U3", (3, "<", None, None, None, -12, 4, 8))), "dtype state"),
    "a negative count": (array(shape=(-2,)), "shape other than 1-D"),
    "two dimensions": (array(shape=(1, 2)), "shape other than 1-D"),
    "a shape of floats": (array(shape=(2.0,)), "shape other than 1-D"),
    "S state on a U dtype": (array(dtype_ops=dtype("U3", (3, "|", None, None, None, 3, 1, 0))), "dtype state"),
    "an S dtype": (array(dtype_ops=dtype("S12", (3, "|", None, None, None, 12, 1, 0))), "dtype other than U"),
    "a U0 dtype": (
        array(shape=(0,), data=b"", dtype_ops=dtype("U0", (3, "<", None, None, None, 0, 4, 8))),
        "dtype other than U",
    ),
    "ints for the dtype's bools": (array(dtype_ops=dtype(args=lit(("U3", 0, 1)))), "dtype other than U"),
    "an unbuilt dtype": (
        array(dtype_ops=glob("numpy", "dtype") + lit(("U3", False, True)) + op("REDUCE")),
        "dtype is not a U<n>",
    ),
    "fields in the dtype": (array(dtype_ops=dtype("U3", (3, "<", None, ("a",), {"a": 1}, 12, 4, 8))), "dtype state"),
    "a Fortran flag": (array(ops={"fortran": lit(True)}), "C-ordered"),
    "state version 2": (array(ops={"version": lit(2)}), "C-ordered"),
    "a str for the data": (array(data="ab"), "data is not bytes"),
    "a list for the data (an object array)": (array(data=["ab", "cde"]), "data is not bytes"),
    "an array in the data (nested)": (array(ops={"data": array()}), "data is not bytes"),
    "a code point past U+10FFFF": (array(shape=(1,), data=b"\x00\x00\x11\x00" * 3), "not UCS-4"),
    "other _reconstruct args": (
        RECONSTRUCT + tup(glob("numpy", "ndarray"), lit((5,)), lit(b"b")) + op("REDUCE"),
        "_reconstruct call",
    ),
    "_reconstruct of a dtype": (
        RECONSTRUCT + tup(glob("numpy", "dtype"), lit((0,)), lit(b"b")) + op("REDUCE"),
        "_reconstruct call",
    ),
    "_frombuffer in F order": (
        glob("numpy.core.numeric", "_frombuffer")
        + tup(lit(b"a\0\0\0"), dtype("U1", (3, "<", None, None, None, 4, 4, 8)), lit((1,)), lit("F"))
        + op("REDUCE"),
        "C-ordered",
    ),
    "an array never built": (RECONSTRUCT + NDARRAY_ARGS + op("REDUCE"), "array without its state"),
    "a dtype as a value": (dtype(), "object where plain data belongs"),
    "a global as a value": (glob("numpy", "ndarray"), "object where plain data belongs"),
    "the dtype called as a function on a list": (
        glob("numpy", "dtype") + lit(["U3"]) + op("REDUCE"),
        "REDUCE .*refused here",
    ),
    "ndarray called": (glob("numpy", "ndarray") + lit((3,)) + op("REDUCE"), "REDUCE .*refused here"),
    "BUILD on a plain list": (lit(["a"]) + lit((1,)) + op("BUILD"), "BUILD .*refused here"),
    "an array built twice": (array() + lit((1,)) + op("BUILD"), "BUILD .*refused here"),
    "numpy.load": (glob("numpy", "load"), "STACK_GLOBAL"),
    "numpy.core.multiarray.scalar": (glob("numpy.core.multiarray", "scalar"), "STACK_GLOBAL"),
    "a global spelt with GLOBAL": (op("GLOBAL") + b"os\nsystem\n", "'os.system'"),
    "a global made of a memo string": (
        text("numpy") + op("MEMOIZE") + op("POP") + op("BINGET") + b"\x00" + text("dtypes") + op("STACK_GLOBAL"),
        "STACK_GLOBAL",
    ),
    "a global made of built strings": (lit(("numpy", "dtype")) + op("STACK_GLOBAL"), "STACK_GLOBAL"),
}


@pytest.mark.parametrize("attack", ATTACKS, ids=list(ATTACKS))
def test_hand_written_attacks_are_400s_within_the_bodys_memory(attack: str) -> None:
    value, refusal = ATTACKS[attack]
    payload = body(value)
    tracemalloc.start()
    try:
        with pytest.raises(BadRequest, match=refusal):
            decode(payload)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024 + 4 * len(payload), peak


def test_memo_tricks_are_refused_before_anything_is_built() -> None:
    made = RECONSTRUCT + NDARRAY_ARGS + op("REDUCE")
    state = tup(lit(1), lit((2,)), dtype(), lit(False), lit(AB_CDE))
    # The array referred to again before its BUILD, then built: the walk counted it empty.
    shared_first = body(made + op("DUP") + op("POP") + state + op("BUILD"))
    with pytest.raises(BadRequest, match=r"BUILD .*refused here"):
        decode(shared_first)
    # A dtype or an array as a dict key or set member.
    with pytest.raises(BadRequest, match="key"):
        decode(b"\x80\x04" + op("EMPTY_DICT") + array() + lit(1) + op("SETITEM") + op("STOP"))
    with pytest.raises(BadRequest, match="member"):
        decode(body(op("EMPTY_SET") + op("MARK") + dtype() + op("ADDITEMS")))


def test_an_array_shared_many_times_counts_each_time() -> None:
    """A memo PUT between REDUCE and BUILD (as numpy writes) then GETs: the walk counts the
    built array's items at each use, so 480 kB of data referred to 20 times is a 413, not 1.2 M
    strings a consumer hashes or prints."""
    items = 60_000
    data = ("ab" * items).encode("utf-32-le")
    built = RECONSTRUCT + NDARRAY_ARGS + op("REDUCE") + op("BINPUT") + b"\x05"
    built += tup(lit(1), lit((items,)), dtype("U2", (3, "<", None, None, None, 8, 4, 8)), lit(False), lit(data)) + op(
        "BUILD"
    )
    once = body(op("EMPTY_LIST") + op("MARK") + built + op("APPENDS"))
    assert decode(once) == {"prompts": [["ab"] * items]}
    twenty = body(op("EMPTY_LIST") + op("MARK") + built + (op("BINGET") + b"\x05") * 19 + op("APPENDS"))
    with pytest.raises(PayloadTooLarge, match="values counted as a tree"):
        decode(twenty)


def test_a_bodys_arrays_hold_as_many_items_as_a_plain_pickle_has_opcodes() -> None:
    """100,000 items in all (a plain pickle's opcode cap: a str each), checked from the shape
    before any is decoded: 400 kB of one-character prompts are not millions of str objects."""
    u1 = dtype("U1", (3, "<", None, None, None, 4, 4, 8))

    def prompts(*counts: int) -> bytes:
        arrays = b"".join(array(shape=(n,), data=b"a\0\0\0" * n, dtype_ops=u1) for n in counts)
        return body(op("EMPTY_LIST") + op("MARK") + arrays + op("APPENDS"))

    assert [len(items) for items in decode(prompts(MAX_PICKLE_OPCODES))["prompts"]] == [MAX_PICKLE_OPCODES]
    for counts in [(MAX_PICKLE_OPCODES + 1,), (60_000, 60_000)]:
        with pytest.raises(PayloadTooLarge, match=f"numpy arrays of over {MAX_PICKLE_OPCODES} items"):
            decode(prompts(*counts))


def test_tuples_shared_through_the_memo_stay_shared_once_the_arrays_are_lists() -> None:
    """Tuples that each hold the one before twice: 18 levels in 300 bytes are 2**18 tuples as a
    tree, but 19 objects as the pickle shares them. Replacing the arrays must not rebuild each
    tuple at each use (27 MB and half a second); a tuple with no array in it is kept as it is."""
    dag = lit(0) + op("TUPLE1") + op("MEMOIZE")
    for level in range(1, 19):
        dag += op("POP") + op("BINGET") + bytes([level - 1]) + op("DUP") + op("TUPLE2") + op("MEMOIZE")
    payload = b"\x80\x04" + op("EMPTY_DICT") + op("MARK") + lit("prompts") + array() + lit("dag") + dag
    payload += op("SETITEMS") + op("STOP")
    with_array = tup(array(), array()) + op("MEMOIZE") + op("DUP") + op("TUPLE2")
    tracemalloc.start()
    try:
        decoded = decode(payload)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024 + 4 * len(payload), peak
    assert decoded["prompts"] == ["ab", "cde"]
    top = decoded["dag"]
    assert top[0] is top[1] and top[0][0] is top[0][1]
    shared = decode(body(with_array))["prompts"]
    assert shared == ((["ab", "cde"], ["ab", "cde"]),) * 2 and shared[0] is shared[1]
