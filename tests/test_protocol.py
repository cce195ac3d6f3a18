"""The wire formats: the restricted unpickler builds plain data only."""

from __future__ import annotations

import json
import os
import pickle

import pytest

from common.errors import BadRequest
from common.protocol import decode_body, encode_body, wire_format


class CreatesFile:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_plain_data_round_trips() -> None:
    payload = {"images": [b"\xff\xd8"], "prompts": ["a"], "metadata": {"k": (1, 2.5, None, True)}}
    assert decode_body(pickle.dumps(payload), "pickle") == payload
    # Protocol 3 (Python 3's first) and later carry bytes natively; 0-2 need a global for them.
    for protocol in range(3, pickle.HIGHEST_PROTOCOL + 1):
        assert decode_body(pickle.dumps(payload, protocol=protocol), "pickle") == payload


def test_pickle_naming_a_callable_is_refused_and_nothing_runs(tmp_path) -> None:
    target = tmp_path / "pwned"
    with pytest.raises(BadRequest, match=r"posix\.system|os\.system"):
        decode_body(pickle.dumps({"images": [CreatesFile(str(target))]}), "pickle")
    assert not target.exists()


@pytest.mark.parametrize("obj", [{1, 2}, complex(1, 2), bytearray(b"x"), range(3)])
def test_other_classes_are_refused(obj) -> None:
    body = pickle.dumps({"x": obj})
    try:
        decoded = decode_body(body, "pickle")
    except BadRequest:
        return
    # sets/bytearray have their own opcodes: built as plain data, they carry no code.
    assert isinstance(decoded["x"], (set, frozenset, bytearray))


@pytest.mark.parametrize(
    "body", [b"garbage", b"\x80\x05", pickle.dumps([1, 2]), pickle.dumps("str"), b"\x80\x04\x95\xff\xff\xff\xff"]
)
def test_malformed_pickles_are_bad_requests(body: bytes) -> None:
    with pytest.raises(BadRequest):
        decode_body(body, "pickle")


def test_json_twin() -> None:
    assert decode_body(json.dumps({"images": []}).encode(), "json") == {"images": []}
    with pytest.raises(BadRequest):
        decode_body(b"{not json", "json")
    with pytest.raises(BadRequest):
        decode_body(b"[1]", "json")
    with pytest.raises(BadRequest):
        decode_body(b"", "json")


def test_format_follows_content_type_and_nan_stays_json() -> None:
    assert wire_format("application/json; charset=utf-8") == "json"
    assert wire_format(None) == wire_format("application/x-www-form-urlencoded") == "pickle"
    body, mimetype = encode_body({"scores": [float("nan")]}, "json")
    assert body == b'{"scores": [NaN]}' and mimetype == "application/json"
