"""The wire formats: the restricted unpickler builds plain data only."""

from __future__ import annotations

import json
import os
import pickle
import pickletools
import struct

import pytest

from common.limits.errors import BadRequest, PayloadTooLarge
from common.sdk.wire import (
    MAX_NESTING,
    JsonCap,
    check_json,
    check_pickle,
    decode_body,
    encode_body,
    wire_format,
)
from services.code.settings import CodeSettings

CAP = JsonCap(1_000_000, "SCORER_MAX_JSON_VALUES")

pytestmark = pytest.mark.unit


class CreatesFile:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_plain_data_round_trips() -> None:
    payload = {"images": [b"\xff\xd8"], "prompts": ["a"], "metadata": {"k": (1, 2.5, None, True)}}
    assert decode_body(pickle.dumps(payload), "pickle", CAP) == payload
    # Protocol 3 (Python 3's first) and later carry bytes natively; 0-2 need a global for them.
    for protocol in range(3, pickle.HIGHEST_PROTOCOL + 1):
        assert decode_body(pickle.dumps(payload, protocol=protocol), "pickle", CAP) == payload


def test_pickle_naming_a_callable_is_refused_and_nothing_runs(tmp_path) -> None:
    target = tmp_path / "pwned"
    with pytest.raises(BadRequest, match=r"STACK_GLOBAL .*only plain data"):
        decode_body(pickle.dumps({"images": [CreatesFile(str(target))]}), "pickle", CAP)
    assert not target.exists()


@pytest.mark.parametrize("obj", [{1, 2}, complex(1, 2), bytearray(b"x"), range(3)])
def test_other_classes_are_refused(obj) -> None:
    body = pickle.dumps({"x": obj})
    try:
        decoded = decode_body(body, "pickle", CAP)
    except BadRequest:
        return
    # sets/bytearray have their own opcodes: built as plain data, they carry no code.
    assert isinstance(decoded["x"], (set, frozenset, bytearray))


@pytest.mark.parametrize(
    "body", [b"garbage", b"\x80\x05", pickle.dumps([1, 2]), pickle.dumps("str"), b"\x80\x04\x95\xff\xff\xff\xff"]
)
def test_malformed_pickles_are_bad_requests(body: bytes) -> None:
    with pytest.raises(BadRequest):
        decode_body(body, "pickle", CAP)


def test_json_twin() -> None:
    assert decode_body(json.dumps({"images": []}).encode(), "json", CAP) == {"images": []}
    with pytest.raises(BadRequest):
        decode_body(b"{not json", "json", CAP)
    with pytest.raises(BadRequest):
        decode_body(b"[1]", "json", CAP)
    with pytest.raises(BadRequest):
        decode_body(b"", "json", CAP)


def test_format_follows_content_type_and_nan_stays_json() -> None:
    assert wire_format("application/json; charset=utf-8") == "json"
    assert wire_format(None) == wire_format("application/x-www-form-urlencoded") == "pickle"
    body, mimetype = encode_body({"scores": [float("nan")]}, "json")
    assert body == b'{"scores": [NaN]}' and mimetype == "application/json"


# The arguments the refused opcodes need to parse; the others take none.
REFUSED_ARGS = {"GLOBAL": b"os\nsystem\n", "INST": b"os\nsystem\n", "PERSID": b"x\n", "EXT1": b"\x01"}
REFUSED_ARGS |= {"EXT2": b"\x01\x00", "EXT4": b"\x01\x00\x00\x00"}
REFUSED = sorted(
    op.name
    for op in pickletools.opcodes
    if op.name.endswith(("GLOBAL", "REDUCE", "BUILD", "INST", "OBJ", "NEWOBJ", "NEWOBJ_EX", "PERSID", "BUFFER"))
    or op.name.startswith("EXT")
)
DEEP_TUPLE = b"N" + b"\x85" * 200_000  # TUPLE1 200,000 times: hashing it overflows the C stack


def opcode(name: str) -> bytes:
    return next(op.code.encode("latin-1") for op in pickletools.opcodes if op.name == name)


@pytest.mark.parametrize("name", REFUSED)
def test_every_opcode_outside_the_allow_list_is_refused_wherever_it_is(name: str) -> None:
    """The old pre-check stopped at the first opcode it did not model: after ``NNb`` (BUILD on
    None), a 200,000-deep tuple went unchecked to the unpickler and crashed the worker."""
    body = b"\x80\x05NN" + opcode(name) + REFUSED_ARGS.get(name, b"") + b"0" + DEEP_TUPLE + b"."
    with pytest.raises(BadRequest, match=rf"opcode {name} .*only plain data"):
        check_pickle(body)


def test_the_issue_prefixes_are_refused() -> None:
    for prefix in (b"\x80\x04NNb0", b"\x80\x05\x97\x980"):  # BUILD on None; NEXT_BUFFER, READONLY_BUFFER
        with pytest.raises(BadRequest, match="opcode"):
            check_pickle(prefix + DEEP_TUPLE + b".")
    with pytest.raises(BadRequest, match=f"nested over {MAX_NESTING} deep"):
        check_pickle(b"\x80\x04" + DEEP_TUPLE + b".")


def test_shared_values_count_each_time_but_plain_sharing_passes() -> None:
    image = b"\xff\xd8" * 1000
    row = list(range(100))
    check_pickle(pickle.dumps({"images": [image] * 1000, "rows": [row] * 100}))  # memo GETs of done values
    with pytest.raises(PayloadTooLarge):
        check_pickle(pickle.dumps({"rows": [list(range(1000))] * 1001}))


@pytest.mark.parametrize(
    "body",
    [
        b"\x80\x04]\x94h\x00a.",  # a list appended to itself: a cycle
        # L = [], memoized; outer = [L, L]; then L is taken again and grown: the two uses undercounted
        b"\x80\x04]\x94](h\x00h\x00e0h\x00(NNNe.",
        b"\x80\x04}\x94h\x00h\x00s.",  # a dict set as its own key and value
    ],
)
def test_a_container_reused_and_then_changed_is_refused(body: bytes) -> None:
    with pytest.raises(BadRequest, match="after reusing it"):
        check_pickle(body)


@pytest.mark.parametrize("key", [(1, 2), 1.5, 2**61, frozenset({"a"})])
def test_keys_that_hash_slowly_or_collide_are_refused(key) -> None:
    body = pickle.dumps({key: 1}, protocol=5)
    with pytest.raises(BadRequest, match="key that is not a string"):
        check_pickle(body)


def test_plain_keys_and_sets_pass() -> None:
    data = {"a": 1, b"b": 2, 3: 3, -(2**60): 4, None: 5, True: 6, "s": {"x", 1}, "f": frozenset({b"y"})}
    assert decode_body(pickle.dumps(data, protocol=5), "pickle", CAP) == data
    with pytest.raises(BadRequest, match="set member"):
        check_pickle(pickle.dumps({"s": {(1, 2)}}, protocol=5))


@pytest.mark.parametrize(
    "body",
    [
        b"\x80\x04N(a.",  # APPEND of an item below the MARK
        b"\x80\x04(0t.",  # POP of the MARK, then a TUPLE without one
        b"\x80\x04Nh\x05.",  # GET of an index never PUT
        b"\x80\x04N(Ne.",  # APPENDS onto None
        b"\x80\x04}(Nu.",  # SETITEMS with an odd number of items
        b"\x80\x04N\xff.",  # an unknown opcode
        b"\x80\x04N",  # truncated
        b"\x80\x04}(.",  # STOP with only a MARK above the result (found by fuzzing)
    ],
)
def test_streams_the_walk_cannot_follow_are_refused_not_handed_on(body: bytes) -> None:
    try:
        check_pickle(body)
    except BadRequest:
        return
    with pytest.raises(BadRequest):  # only a stream the unpickler itself refuses may pass the walk
        decode_body(body, "pickle", CAP)


@pytest.mark.parametrize("put", [b"r" + struct.pack("<I", 2**28), b"r" + struct.pack("<I", 2**32 - 1), b"p268435456\n"])
def test_a_memo_index_past_the_stream_is_refused_before_the_unpickler_sizes_its_memo(put: bytes) -> None:
    """``N r <2**28> .``: 9 bytes, and CPython's unpickler zero-filled a 4 GiB memo array."""
    body = b"\x80\x04N" + put + b"."
    with pytest.raises(BadRequest, match=r"memo index .* past the"):
        decode_body(body, "pickle", CAP)
    assert decode_body(pickle.dumps({"a": [b"x"] * 3, "b": "y"}), "pickle", CAP) == {"a": [b"x"] * 3, "b": "y"}


def json_count(value) -> int:
    """Values of decoded JSON, keys included."""
    if isinstance(value, dict):
        return 1 + sum(1 + json_count(item) for item in value.values())
    if isinstance(value, list):
        return 1 + sum(json_count(item) for item in value)
    return 1


@pytest.mark.parametrize(
    "text",
    [
        '{"a": [1, 2, {"b": null}], "c": "x,y:[{"}',
        r'["\\", "\\\"", "\\\\\",[", ""]',
        '[[], {}, [[[]]], {"": {"": []}}]',
        r'{"s": "a\u0022,[,{:\\"}',
        "7",
        '\ufeff{"bom": [1]}',
    ],
)
def test_the_json_value_count_bounds_the_values_json_builds(text: str) -> None:
    """The count is never below what ``json.loads`` builds, nor over twice it, whatever the
    strings hold."""
    body = text.encode("utf-8")
    built = json_count(json.loads(body))
    check_json(body, JsonCap(2 * built, "X"))
    if built > 1:
        with pytest.raises(PayloadTooLarge, match=rf"the limit is {built - 1} \(X\)"):
            check_json(body, JsonCap(built - 1, "X"))


def test_json_other_than_utf8_is_refused() -> None:
    for encoding in ("utf-16", "utf-32", "utf-16-le"):
        with pytest.raises(BadRequest, match="UTF-8"):
            decode_body('{"images": []}'.encode(encoding), "json", CAP)


def test_the_code_verifiers_largest_labels_fit_its_json_cap() -> None:
    """An OpenRLHF request at the code verifier's caps (1,024 samples, 64 M characters): labels as
    JSON strings (OpenRLHF sends its dataset's label column so) are one value each whatever they
    hold; labels as objects may carry long argument lists, one label at the per-text cap's worth
    of small numbers (~1 M values) and more."""
    cap = JsonCap(CodeSettings().max_json_values, "SCORER_CODE_MAX_JSON_VALUES")
    tests = json.dumps({"fn_name": "f", "inputs": [[list(range(6000))] for _ in range(2)], "outputs": [0, 1]})
    body = json.dumps({"query": ["x" * 1000] * 1024, "prompts": ["p"] * 1024, "labels": [tests] * 1024}).encode()
    assert len(body) > 60_000_000
    check_json(body, cap)
    objects = {"inputs": [[list(range(1_000_000))], [list(range(1_000_000))]], "outputs": [0, 1]}
    check_json(json.dumps({"query": ["x"] * 3, "prompts": ["p"] * 3, "labels": [objects, {}, {}]}).encode(), cap)
