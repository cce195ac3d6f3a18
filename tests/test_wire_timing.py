"""What a hostile body costs to refuse, in CPU seconds: each refusal of ``common.sdk.wire`` and
``common.limits.errors`` must come from a walk bounded by the body's size (a DAG hashed as a key, a
repr of 2**60 nodes, ``json.loads`` of 32 MB of ``[],`` took seconds to forever). The bounds
are for a quiet machine, scaled by ``SCORER_TEST_TIME_FACTOR`` (``testing/timing.py``)."""

from __future__ import annotations

import io
import json
import struct
import time

import pytest

from common.limits.errors import QUOTE_CHARS, BadRequest, PayloadTooLarge, describe_error, quote
from common.sdk.wire import MAX_NESTING, MAX_PICKLE_NODES, JsonCap, check_pickle, decode_body
from testing.timing import within

pytestmark = pytest.mark.timing

CAP = JsonCap(1_000_000, "SCORER_MAX_JSON_VALUES")


def dag(depth: int, key: bool) -> bytes:
    """Tuples that each hold the previous one twice (through the memo): 2**depth nodes."""
    body = bytearray(b"\x80\x04" + (b"}" if key else b"") + b"N\x94")  # EMPTY_DICT; None, MEMOIZE
    for level in range(depth):
        get = b"j" + struct.pack("<I", level)  # LONG_BINGET
        body += get + get + b"\x86\x94"  # TUPLE2, MEMOIZE
    return bytes(body + (b"Ns." if key else b"."))  # SETITEM {dag: None}


def test_memo_dag_is_refused_in_milliseconds_as_a_dict_key_or_a_value() -> None:
    """A 430-byte DAG of depth 40 used as a dict key froze the worker: hashing visits 2**40 nodes."""
    for key in (True, False):
        body = dag(40, key)
        assert len(body) < 500
        started = time.process_time()
        with pytest.raises(PayloadTooLarge, match=f"{MAX_PICKLE_NODES} values counted as a tree"):
            check_pickle(body)
        assert time.process_time() - started < within(0.05)
    check_pickle(dag(10, key=False))  # 2**11 nodes: fine


def test_marks_nested_past_the_limit_are_refused_at_once() -> None:
    """Found by fuzzing: 100,000 MARKs before the first LIST kept the walk busy for a second."""
    started = time.process_time()
    with pytest.raises(BadRequest, match=f"MARKs nested over {MAX_NESTING} deep"):
        check_pickle(b"\x80\x04" + b"(" * 100_000 + b"N" + b"l" * 100_000 + b".")
    assert time.process_time() - started < within(0.05)


def test_input_quoted_in_errors_is_bounded_and_shows_no_address() -> None:
    dag: tuple = ()
    for _ in range(60):  # 2**60 nodes: a full repr would never end
        dag = (dag, dag)
    values = (dag, 10**5000, "x" * 10**6, {i: [i] * 1000 for i in range(1000)}, io.BytesIO())
    started = time.process_time()
    for value in values:
        text = quote(value)
        assert len(text) <= QUOTE_CHARS and "0x" not in text, text
    assert time.process_time() - started < within(0.1)
    message = describe_error(OSError("cannot identify image file <_io.BytesIO object at 0x7f3a2c1b9e40>" + "y" * 10**4))
    assert "0x" not in message and len(message) < 300, message


def test_32_mb_of_empty_lists_is_refused_in_linear_time_naming_the_limit() -> None:
    """32 MB of ``[],`` cost +800 MB and 5.7 s in ``json.loads`` with the GIL held."""
    body = b'{"images": [' + b"[]," * (32 * 1024 * 1024 // 3) + b"[]]}"
    started = time.process_time()
    with pytest.raises(PayloadTooLarge, match=r"limit is 1000000 \(SCORER_MAX_JSON_VALUES\)"):
        decode_body(body, "json", CAP)
    assert time.process_time() - started < within(2.0)  # the count alone; json.loads took 5.7 s
    for hidden in (b'"\\\\",', b'"",', b'"\\"",'):  # strings and escapes by the million: counted at once
        started = time.process_time()
        with pytest.raises(PayloadTooLarge, match="SCORER_MAX_JSON_VALUES"):
            decode_body(b"[" + hidden * 8_000_000 + b"0]", "json", CAP)
        assert time.process_time() - started < within(2.0)
    strings = json.dumps({"prompts": ["[,{:" * 1000] * 2000}).encode()  # 8 M punctuation marks, in strings
    assert decode_body(strings, "json", CAP)["prompts"][0] == "[,{:" * 1000
