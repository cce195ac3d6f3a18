"""Fuzzing of request decoding against the running OCR service: any bytes, any nesting of plain
data, wrong types, huge declared sizes. Every answer is a score per image or a clear 4xx; no
500, no hang, no worker death.

Bounded in the suite (SCORER_FUZZ_EXAMPLES per property, default 60); for a long run:
    SCORER_FUZZ_EXAMPLES=5000 .venv/bin/python -m pytest tests/test_fuzz.py
"""

from __future__ import annotations

import base64
import io
import json
import os
import pickle
import socket
import struct
import zlib
from typing import Any

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from common.client import parse_answer

EXAMPLES = int(os.environ.get("SCORER_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
CLEAR_ERRORS = {400, 413, 415, 422}


def tiny(fmt: str) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (16, 16), (250, 250, 250)).save(out, fmt)
    return out.getvalue()


IMAGES = [tiny("JPEG"), tiny("PNG"), tiny("WEBP")]


def png_header(width: int, height: int) -> bytes:
    """A PNG whose header declares ``width`` x ``height`` and whose pixels are missing."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", len(ihdr)) + chunk + struct.pack(">I", zlib.crc32(chunk))


scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=40)
    | st.binary(max_size=64)
)
plain = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=10) | st.integers() | st.none(), inner, max_size=5)
    ),
    max_leaves=25,
)
image_like = (
    st.sampled_from(IMAGES)
    | st.builds(lambda image, cut: image[:cut], st.sampled_from(IMAGES), st.integers(0, 200))
    | st.builds(png_header, st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1))
    | st.binary(max_size=256)
    | plain
)
prompt_like = st.text(max_size=60) | st.builds(lambda word: f'a sign that says "{word}"', st.text(max_size=12)) | plain
ocr_options = st.dictionaries(
    st.sampled_from(["target", "no_quotes", "case_sensitive", "bogus"]) | st.text(max_size=8) | st.integers(),
    plain,
    max_size=3,
)
requests_shaped = st.fixed_dictionaries(
    {"images": st.lists(image_like, max_size=4) | plain, "prompts": st.lists(prompt_like, max_size=4) | plain},
    optional={"metadata": st.fixed_dictionaries({}, optional={"ocr": ocr_options | plain}) | plain},
)

# A well-formed request whose options and prompts are arbitrary: gets past the shape checks.
options_fuzzed = st.integers(1, 3).flatmap(
    lambda n: st.fixed_dictionaries(
        {
            "images": st.lists(st.sampled_from(IMAGES), min_size=n, max_size=n),
            "prompts": st.lists(prompt_like.filter(lambda p: isinstance(p, str)), min_size=n, max_size=n),
            "metadata": st.fixed_dictionaries({"ocr": ocr_options}) | plain,
        }
    )
)

# Pickle opcodes followed by a length field: (opcode, struct format of the length).
SIZED_OPCODES = [
    (b"T", "<i"),
    (b"U", "<B"),
    (b"B", "<i"),
    (b"C", "<B"),
    (b"X", "<I"),
    (b"\x8c", "<B"),
    (b"\x8d", "<Q"),
    (b"\x8e", "<Q"),
    (b"\x96", "<Q"),
    (b"\x95", "<Q"),
    (b"\x8a", "<B"),
    (b"\x8b", "<i"),
]


@st.composite
def huge_declared_pickles(draw) -> bytes:
    """A pickle whose string/bytes/frame/long length field claims far more than the body holds."""
    opcode, fmt = draw(st.sampled_from(SIZED_OPCODES))
    bits = struct.calcsize(fmt) * 8
    signed = fmt[-1].islower()
    low, high = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    size = draw(st.integers(low, high) | st.just(high))
    return b"\x80\x05" + opcode + struct.pack(fmt, size) + draw(st.binary(max_size=32)) + b"."


DEEP = "<deep>"
NESTING_SITES = {
    "images": {"images": DEEP, "prompts": ["a"]},
    "prompts": {"images": [IMAGES[0]], "prompts": DEEP},
    "metadata": {"images": [IMAGES[0]], "prompts": ["a"], "metadata": DEEP},
    "an ocr option": {"images": [IMAGES[0]], "prompts": ['"a"'], "metadata": {"ocr": {"target": DEEP}}},
}


def deep_pickle(payload: dict[str, Any], depth: int) -> bytes:
    """``payload`` with ``DEEP`` replaced by lists nested ``depth`` deep, spliced in as opcodes
    (pickle.dumps itself would hit the recursion limit)."""
    marker = b"X" + struct.pack("<I", len(DEEP)) + DEEP.encode()  # BINUNICODE of the marker
    body = pickle.dumps(payload, protocol=3)  # protocol 3: no frames, whose lengths would change
    return body.replace(marker, b"]" * depth + b"a" * (depth - 1), 1)


def check(url: str, body: bytes, content_type: str = "application/octet-stream") -> None:
    response = requests.post(url + "/", data=body, headers={"Content-Type": content_type}, timeout=30)
    answer = parse_answer(response.content, response.headers.get("Content-Type", ""))
    if response.status_code == 200:
        assert isinstance(answer["scores"], list) and all(isinstance(s, float) for s in answer["scores"]), answer
        return
    assert response.status_code in CLEAR_ERRORS, (response.status_code, answer, body[:200])
    assert isinstance(answer.get("error"), str) and len(answer["error"]) > 10, answer


@pytest.fixture(scope="module")
def fuzzed(ocr_server):
    """The shared OCR server; after the module, its worker must be the one it started with."""
    workers = ocr_server.worker_pids()
    yield ocr_server.url
    assert ocr_server.worker_pids() == workers, ocr_server.logs()
    assert requests.get(ocr_server.url + "/health", timeout=5).status_code == 200


@FUZZ
@given(body=st.binary(max_size=2048))
def test_any_bytes_as_pickle(fuzzed, body: bytes) -> None:
    check(fuzzed, body)


@FUZZ
@given(body=st.binary(max_size=2048) | plain.map(lambda v: json.dumps(v, default=repr).encode()))
def test_any_bytes_and_any_json_as_json(fuzzed, body: bytes) -> None:
    check(fuzzed, body, "application/json")


@FUZZ
@given(value=plain, protocol=st.integers(0, pickle.HIGHEST_PROTOCOL))
def test_any_plain_data(fuzzed, value: Any, protocol: int) -> None:
    check(fuzzed, pickle.dumps(value, protocol=protocol))


@FUZZ
@given(payload=requests_shaped | options_fuzzed)
def test_request_shaped_payloads_with_wrong_types(fuzzed, payload: dict[str, Any]) -> None:
    check(fuzzed, pickle.dumps(payload))


@FUZZ
@given(body=huge_declared_pickles())
def test_huge_declared_sizes_in_pickles(fuzzed, body: bytes) -> None:
    check(fuzzed, body)


@pytest.mark.parametrize("site", list(NESTING_SITES))
def test_very_deep_nesting(fuzzed, site: str) -> None:
    check(fuzzed, deep_pickle(NESTING_SITES[site], 200_000))
    deep_json = json.dumps(NESTING_SITES[site], default=lambda data: base64.b64encode(data).decode())
    deep_json = deep_json.replace(json.dumps(DEEP), "[" * 200_000 + "]" * 200_000)
    check(fuzzed, deep_json.encode(), "application/json")


def test_deep_tuples_are_refused_before_they_are_hashed(fuzzed) -> None:
    """Hashing a tuple nested 200,000 deep (a dict key) overflows the C stack: a worker crash."""
    for key in (b"N" + b"\x85" * 200_000, b"(" * 200_000 + b"N" + b"t" * 200_000):
        check(fuzzed, b"\x80\x04}" + key + b"Ns.")
    check(fuzzed, b"\x80\x04" + b"N" * 1_100_000 + b".")  # more opcodes than any request needs


def raw_request(url: str, head: bytes, body: bytes = b"") -> bytes:
    """Send a hand-written request, close our side, and read the whole answer."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head + body)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_huge_declared_content_length_is_refused_before_reading(fuzzed) -> None:
    answer = raw_request(fuzzed, b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999999\r\n\r\n", b"x" * 10)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]


def test_body_shorter_than_declared_is_a_clear_400(fuzzed) -> None:
    answer = raw_request(fuzzed, b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n", b"\x80\x05")
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
