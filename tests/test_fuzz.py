# Over 400 lines: the pickle opcode and image strategies share one running OCR service.
"""Fuzzing of request decoding against the running OCR service: any bytes, any nesting of plain
data, wrong types, huge declared sizes; pickles written opcode by opcode (every opcode of
pickletools' table, the memo, shared substructures, deep and wide shapes) and images of extreme
sizes in every format Pillow writes. Every answer is a score per image or a clear 4xx, from the
worker that was there before: no 500, no hang, no worker death; a 4xx within 5 s, a 200 within
5 s per image read.

Bounded in the suite (each property's own count, a few hundred requests in all); for a long
run, SCORER_FUZZ_EXAMPLES sets every property's count:
    SCORER_FUZZ_EXAMPLES=5000 .venv/bin/python -m pytest tests/test_fuzz.py
What a long run finds becomes a fixed case here (``test_found_by_fuzzing``).
"""

from __future__ import annotations

import base64
import io
import json
import pickle
import pickletools
import socket
import struct
import zlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from testing.fuzz import Target, check, fuzz

# Each request is answered within a time bound (testing.fuzz.check): scaled, and marked so.
pytestmark = pytest.mark.timing

FUZZ = fuzz(40)


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
    check(fuzzed, b"\x80\x04" + b"N" * 300_000 + b".")  # more opcodes than any request needs


def raw_request(target: Target, head: bytes, body: bytes = b"") -> bytes:
    """Send a hand-written request, close our side, and read the whole answer."""
    host, port = target.url.removeprefix("http://").split(":")
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


# --- Pickles written opcode by opcode -------------------------------------------------------

OPCODES = {op.name: op for op in pickletools.opcodes}
CODE = {name: op.code.encode("latin-1") for name, op in OPCODES.items()}
# Names a hostile GLOBAL/INST/STACK_GLOBAL would load.
GLOBALS = [("os", "system"), ("posix", "system"), ("builtins", "eval"), ("subprocess", "Popen"), ("io", "BytesIO")]
GLOBALS += [("copyreg", "_reconstructor"), ("collections", "OrderedDict"), ("builtins", "set"), ("__main__", "x")]
texts = st.text(st.characters(blacklist_characters="\n\r", blacklist_categories=["Cs"]), max_size=12)
ints = st.integers(-(2**70), 2**70) | st.sampled_from(
    [0, 1, -1, 255, 256, 65535, 2**31 - 1, -(2**31), 2**61 - 1, 2**61]
)


def _sized(fmt: str, payload: bytes) -> bytes:
    return struct.pack(fmt, len(payload)) + payload


@st.composite
def opcode_argument(draw, name: str) -> bytes:
    """A well-formed argument for opcode ``name``, by the kind pickletools' table gives it."""
    kind = OPCODES[name].arg.name if OPCODES[name].arg else None
    small = st.integers(0, 6)  # memo indexes, ext codes and lengths that hit
    if kind is None:
        return b""
    if kind == "decimalnl_short":
        return b"%d\n" % draw(small if name in ("GET", "PUT") else ints)
    if kind == "decimalnl_long":
        return b"%dL\n" % draw(ints)
    if kind in ("uint1", "uint2", "int4", "uint4", "uint8"):
        fmt = {"uint1": "<B", "uint2": "<H", "int4": "<i", "uint4": "<I", "uint8": "<Q"}[kind]
        bits = struct.calcsize(fmt) * 8
        low, high = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if fmt == "<i" else (0, 2**bits - 1)
        if name == "PROTO":
            return bytes([draw(st.integers(0, 6))])
        if name == "FRAME":
            return struct.pack(fmt, draw(st.integers(0, 64)))
        return struct.pack(fmt, draw(small | st.integers(low, high)))
    if kind in ("long1", "long4"):
        return _sized("<B" if kind == "long1" else "<i", pickle.encode_long(draw(ints)))
    if kind == "stringnl":
        return b"'" + draw(st.text("abcXYZ012 ", max_size=8)).encode() + b"'\n"
    if kind in ("string1", "bytes1", "string4", "bytes4", "bytes8", "bytearray8"):
        fmt = {"1": "<B", "4": "<I", "8": "<Q"}[kind[-1]]
        return _sized(fmt, draw(st.binary(max_size=16)))
    if kind == "unicodestringnl":
        return draw(texts).encode("raw-unicode-escape").replace(b"\n", b"") + b"\n"
    if kind.startswith("unicodestring"):
        return _sized({"1": "<B", "4": "<I", "8": "<Q"}[kind[-1]], draw(texts).encode("utf-8", "surrogatepass"))
    if kind == "floatnl":
        return repr(draw(st.floats())).encode() + b"\n"
    if kind == "float8":
        return struct.pack(">d", draw(st.floats()))
    if kind == "stringnl_noescape_pair":
        module, attribute = draw(st.sampled_from(GLOBALS))
        return f"{module}\n{attribute}\n".encode()
    if kind == "stringnl_noescape":
        return b"1\n"
    raise AssertionError(f"no argument generator for {kind}")


SCALAR_OPCODES = [name for name, op in OPCODES.items() if not op.stack_before and len(op.stack_after) == 1]
SCALAR_OPCODES = [name for name in SCALAR_OPCODES if not name.startswith(("EMPTY_", "GET", "BINGET", "LONG_BINGET"))]
PUTS = ["PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"]
GETS = ["GET", "BINGET", "LONG_BINGET"]


class Program:
    """A pickle being written: its bytes and the memo indexes it has stored so far."""

    def __init__(self) -> None:
        self.memo: list[int] = []

    def put(self, draw) -> bytes:
        name = draw(st.sampled_from(PUTS))
        index = len(self.memo) if name == "MEMOIZE" else draw(st.integers(0, 300))
        if name == "BINPUT":
            index %= 256
        self.memo.append(index)
        return CODE[name] + (b"" if name == "MEMOIZE" else _index_argument(name, index))

    def get(self, draw) -> bytes:
        index = draw(st.sampled_from(self.memo))
        name = draw(st.sampled_from(GETS if index < 256 else ["GET", "LONG_BINGET"]))
        return CODE[name] + _index_argument(name, index)


def _index_argument(name: str, index: int) -> bytes:
    if name in ("PUT", "GET"):
        return b"%d\n" % index
    return struct.pack("<B" if name.startswith("BIN") else "<I", index)


@st.composite
def value_opcodes(draw, program: Program, depth: int = 0) -> bytes:
    """Opcodes that push one value (when the draws keep to plain data): scalars; containers built
    every way the protocol allows; memo PUTs and GETs (shared substructures); deep, wide and DAG
    shapes; and, now and then, any opcode at all with its argument."""
    kinds = ["scalar", "scalar", "container", "deep", "wide", "dag", "hostile"]
    if program.memo:
        kinds += ["get", "get", "reuse_then_change"]
    kind = draw(st.sampled_from(kinds if depth < 3 else ["scalar", "get"] if program.memo else ["scalar"]))
    if kind == "scalar":
        name = draw(st.sampled_from(SCALAR_OPCODES))
        body = CODE[name] + draw(opcode_argument(name))
    elif kind == "get":
        body = program.get(draw)
    elif kind == "container":
        items = [draw(value_opcodes(program, depth + 1)) for _ in range(draw(st.integers(0, 4)))]
        body = _container(draw, items)
    elif kind == "deep":  # nested as deep as a limit, or far past it: tuples, lists, frozensets
        levels = draw(st.sampled_from([63, 64, 65, 1000, 100_000]) | st.integers(1, 70))
        closing = draw(st.sampled_from([b"l", b"t", b"\x91"]))
        body = draw(st.sampled_from([b"N" + b"\x85" * levels, b"(" * levels + b"N" + closing * levels]))
    elif kind == "wide":
        count = draw(st.sampled_from([1000, 100_000, 250_001]) | st.integers(0, 50))
        body = b"(" + b"K\x01" * count + draw(st.sampled_from([b"l", b"t", b"\x91"]))
    elif kind == "dag":  # each level holds the previous one twice, through the memo
        body = b"N" + program.put(draw)
        for _ in range(draw(st.integers(1, 45))):
            get = CODE["LONG_BINGET"] + struct.pack("<I", program.memo[-1])
            body += get + get + b"\x86" + program.put(draw)
    elif kind == "reuse_then_change":  # a container used twice, then grown
        body = b"]" + program.put(draw)
        body += b"]" + b"(" + program.get(draw) + program.get(draw) + b"e0" + program.get(draw) + b"(NNe"
    else:
        name = draw(st.sampled_from(sorted(OPCODES)))
        body = b"N" + CODE[name] + draw(opcode_argument(name))
    if draw(st.integers(0, 4)) == 0:
        body += program.put(draw)
    return body


def _container(draw, items: list[bytes]) -> bytes:
    """Push a list, tuple, dict, set or frozenset of ``items``, in one of the ways pickle allows."""
    kind = draw(st.sampled_from(["list", "tuple", "dict", "set", "frozenset"]))
    joined = b"".join(items)
    if kind == "list":
        return draw(
            st.sampled_from([b"(" + joined + b"l", b"](" + joined + b"e", b"]" + b"".join(i + b"a" for i in items)])
        )
    if kind == "tuple":
        if len(items) <= 3 and draw(st.booleans()):
            return joined + [b")", b"\x85", b"\x86", b"\x87"][len(items)]
        return b"(" + joined + b"t"
    if kind == "dict":
        pairs = items + [b"N"] * (len(items) % 2)
        joined = b"".join(pairs)
        return draw(
            st.sampled_from(
                [
                    b"(" + joined + b"d",
                    b"}(" + joined + b"u",
                    b"}" + b"".join(pairs[i] + pairs[i + 1] + b"s" for i in range(0, len(pairs), 2)),
                ]
            )
        )
    if kind == "set":
        return b"\x8f(" + joined + b"\x90"
    return b"(" + joined + b"\x91"


@st.composite
def opcode_pickles(draw) -> bytes:
    """A whole pickle written opcode by opcode: a value alone, or a value at one site of an
    otherwise valid request (an image, a prompt, the metadata, an OCR option, a dict key)."""
    program = Program()
    value = draw(value_opcodes(program))
    noise = b"".join(draw(st.lists(st.sampled_from([b"0", b"2", b"(", b"1", b"(0"]), max_size=2)))
    image = b"B" + _sized("<I", IMAGES[1])  # BINBYTES
    images, prompts = b"](" + image + b"e", b'](\x8c\x03"a"e'
    site = draw(st.sampled_from(["alone", "image", "prompt", "metadata", "ocr", "option", "key"]))
    fields = {
        "image": (b"](" + value + b"e", prompts, b"}"),
        "prompt": (images, b"](" + value + b"e", b"}"),
        "metadata": (images, prompts, value),
        "ocr": (images, prompts, b"}\x8c\x03ocr" + value + b"s"),
        "option": (images, prompts, b"}\x8c\x03ocr}\x8c\x06target" + value + b"ss"),
        "key": (images, prompts, b"}\x8c\x03ocr}" + value + b"\x88ss"),
    }
    proto = b"\x80" + bytes([draw(st.integers(2, 5))])
    if site == "alone":
        return proto + value + noise + b"."
    images, prompts, metadata = fields[site]
    return (
        proto
        + b"}(\x8c\x06images"
        + images
        + b"\x8c\x07prompts"
        + prompts
        + b"\x8c\x08metadata"
        + metadata
        + b"u"
        + noise
        + b"."
    )


@fuzz(200)
@given(body=opcode_pickles())
def test_opcode_level_pickles(fuzzed, body: bytes) -> None:
    check(fuzzed, body)


# --- Images of extreme sizes, in every format Pillow writes -----------------------------------

Image.init()
# Formats Pillow can write here (the server reads JPEG, PNG and WebP; the others must be a 422).
# Left out: containers and stubs (PDF, EPS, BUFR, GRIB, HDF5, WMF, PALM, XBM, SPIDER, MPO) and IM,
# deprecated in Pillow.
FORMATS = sorted(set(Image.SAVE) - {"PDF", "EPS", "BUFR", "GRIB", "HDF5", "WMF", "PALM", "XBM", "SPIDER", "MPO", "IM"})
MODES = ["1", "L", "LA", "P", "RGB", "RGBA", "CMYK", "I;16", "I", "F"]
SIDES = st.sampled_from([1, 2, 3, 7, 29, 30, 31, 32, 33, 61, 64, 255, 256, 735, 736, 737, 1999, 2000, 2001, 2048, 2049])
SIDES |= st.integers(1, 2100)


@st.composite
def encoded_images(draw) -> bytes:
    """An image of extreme size, mode and format (animated, progressive, interlaced, or cut short)."""
    width, height = draw(SIDES), draw(SIDES)
    mode, fmt = draw(st.sampled_from(MODES)), draw(st.sampled_from(FORMATS))
    if width * height <= 4096:
        image = Image.frombytes("L", (width, height), draw(st.binary(min_size=width * height, max_size=width * height)))
        image = image.convert(mode) if mode not in ("I;16",) else image
    else:
        image = Image.new(mode, (width, height), draw(st.integers(0, 255)))
    options = draw(
        st.sampled_from(
            [{}, {"progressive": True}, {"interlace": 1}, {"lossless": True}, {"quality": 1}, {"save_all": True}]
        )
    )
    if options.get("save_all"):
        options["append_images"] = [image.copy()]
    out = io.BytesIO()
    try:
        image.save(out, fmt, **options)
    except (OSError, ValueError, KeyError, TypeError):  # a mode this format cannot hold
        out = io.BytesIO()
        image.convert("RGB").save(out, "PNG")
    data = out.getvalue()
    if draw(st.integers(0, 5)) == 0:
        data = data[: draw(st.integers(0, len(data)))]
    return data


@fuzz(60)
@given(images=st.lists(encoded_images(), min_size=1, max_size=3), copies=st.integers(1, 6))
def test_images_of_extreme_sizes_and_formats(fuzzed, images: list[bytes], copies: int) -> None:
    images = images * copies  # the same objects again: sent once, referenced through the memo
    check(fuzzed, pickle.dumps({"images": images, "prompts": ['"a"'] * len(images)}))


# --- What fuzzing found, kept as fixed cases ---------------------------------------------------

ANIMATED_WEBP = (
    b"RIFF|\x00\x00\x00WEBPVP8X\n\x00\x00\x00\x12\x00\x00\x00\xff\x00\x00\x83\x00\x00ANIM\x06\x00\x00\x00\x00\x00\x00"
    b"\x00\x00\x00ANMFP\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02ALPH\x02\x00\x00"
    b"\x00\x00\x00VP8 .\x00\x00\x000\x01\x00\x9d\x01*\x01\x00\x01\x00\x01@&%\xa0\x00\x03p\x00\xfe\xfaE\xcb\xff\xd6"
    b"\xaf\xad\xbfh\xd2\xaf\xff\xfb\x07\x7f\xff\xa5c\xff\xf4\xac~\xbd\x00\x00\x00"
)
FOUND = {
    # 100,000 MARKs before the first LIST: the walk took a second before nesting stopped it.
    "marks nested 100,000 deep": b"\x80\x04" + b"(" * 100_000 + b"N" + b"l" * 100_000 + b".",
    # STOP under a MARK: the walk passed it to the unpickler, which refused it (now the walk does).
    "stop under a mark": b"\x80\x04}(.",
    # A 256x132 animated WebP 4 times: read at 1440x736, a 200 in 13 s on a loaded CPU; legitimate
    # work, hence the fuzzer's budget per image read.
    "animated webp 4 times": pickle.dumps({"images": [ANIMATED_WEBP] * 4, "prompts": ['"a"'] * 4}),
}


@pytest.mark.parametrize("name", list(FOUND))
def test_found_by_fuzzing(fuzzed, name: str) -> None:
    check(fuzzed, FOUND[name])
