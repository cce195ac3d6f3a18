# Over 400 lines: the request strategies and both parsers' differential run go together.
"""Differential fuzzing of the worker's framing (``common.server.framing``) against gunicorn's own HTTP/1
parser (``gunicorn.http``): requests built field by field (methods, targets, versions, framing
fields with every spelling of their values, chunk sizes, extensions and trailers, bare LFs,
folded and underscored names, pipelined bytes after the request), each framed by both.

A failure is a request both accept and frame differently (another body, or another start for
the next request), one gunicorn frames whole that the framing waits on forever, a framing that
depends on how the bytes were split into reads, or a head the framing accepts that gunicorn's
parser, handed only that head on a request thread, reads past or short of. The framing may
refuse what gunicorn accepts: refusing what it cannot frame exactly is its job.

The same requests also go to a running worker (real gunicorn), one connection each: every one
is answered with a status line and never an internal fault (a 500; on a pickle body, a 503
that says so), by the worker that was there before. And they
go through nginx with the shipped template (deploy/nginx.conf.template) to an upstream that
frames what nginx forwards with ``common.server.framing`` and echoes each body: every request nginx
forwards is framed whole there (nothing nginx sends is refused or split differently), and
where the framing accepts the client's original request, nginx forwarded the same body.

A few hundred cases in the suite; for a long run, SCORER_FUZZ_FRAMING_EXAMPLES sets the count
(a tenth of it against the running worker):
    SCORER_FUZZ_FRAMING_EXAMPLES=100000 .venv/bin/python -m pytest tests/test_fuzz_framing.py
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import socketserver
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import requests as http
from gunicorn.config import Config
from gunicorn.http.parser import RequestParser
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from common.server.framing import Refused, RequestFraming
from common.server.worker import Framed, FramedRequest, FramedUnreader
from testing.nginx import nginx
from testing.server import Server, gunicorn_server

MAX_BODY = 4096
CONFIG = Config()
EXAMPLES = int(os.environ.get("SCORER_FUZZ_FRAMING_EXAMPLES", 300))


def fuzz(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


FUZZ = fuzz(EXAMPLES)


@dataclass(frozen=True)
class Outcome:
    """How a request was framed: refused, waiting for more, or whole with its body and what
    followed it."""

    kind: str  # "refused", "incomplete", "whole"
    body: bytes = b""
    rest: bytes = b""
    detail: str = ""


class WouldBlock(Exception):
    """The socket has nothing more for now (the client has not closed it)."""


def reads_then_blocks(parts: list[bytes]):
    yield from parts
    raise WouldBlock


def by_gunicorn(data: bytes, pieces: list[int]) -> Outcome:
    """gunicorn's parser reading ``data`` in ``pieces`` (the reads of a socket the client keeps
    open: a parser that wants more than was sent is waiting for it)."""
    parser = RequestParser(CONFIG, reads_then_blocks(split(data, pieces)), ("127.0.0.1", 1))
    try:
        request = next(parser)
        body = request.body.read()
    except WouldBlock:
        return Outcome("incomplete")
    except Exception as exc:  # every parse error gunicorn answers with its 4xx
        return Outcome("refused", detail=type(exc).__name__)
    rest = [parser.unreader.take_buffered()]
    with contextlib.suppress(WouldBlock):
        rest.extend(parser.unreader.iter or [])
    return Outcome("whole", body, b"".join(rest))


def by_framing(data: bytes, pieces: list[int]) -> tuple[Outcome, RequestFraming]:
    framing, parts = RequestFraming(MAX_BODY), split(data, pieces)
    try:
        for n, part in enumerate(parts):
            framing.receive(part)
            if framing.read_head() is not None and framing.read_body():
                rest = framing.rest() + b"".join(parts[n + 1 :])  # the next request's, still unread
                return Outcome("whole", bytes(framing.body), rest), framing
    except Refused as refused:
        return Outcome("refused", detail=str(refused.status)), framing
    return Outcome("incomplete"), framing


def split(data: bytes, pieces: list[int]) -> list[bytes]:
    parts, at = [], 0
    for size in pieces:
        if at >= len(data):
            break
        parts.append(data[at : at + size])
        at += size
    if at < len(data):
        parts.append(data[at:])
    return parts


def on_a_thread(framing: RequestFraming) -> Outcome:
    """What a request thread makes of the framed request: gunicorn's parser over the head alone."""
    assert framing.head is not None
    parser = RequestParser(CONFIG, [], ("127.0.0.1", 1))
    parser.mesg_class = FramedRequest
    parser.unreader = FramedUnreader(Framed(framing.head, bytes(framing.body), framing.rest(), 0.0))
    try:
        request = next(parser)
    except Exception as exc:
        return Outcome("refused", detail=f"{type(exc).__name__}: {exc}")
    return Outcome("whole", request.body.read(), b"")


# -- requests, field by field ---------------------------------------------------------------


def mostly(usual: list[bytes], odd: list[bytes]) -> st.SearchStrategy[bytes]:
    """One of ``usual`` most of the time, one of ``odd`` about one time in twenty: a request has
    a dozen such parts, most of them must be right for it to reach its framing."""
    return st.sampled_from(usual * (20 * len(odd) // len(usual) + 1) + odd)


EOL = mostly([b"\r\n"], [b"\n", b"\r", b"\r\r\n", b"\n\r"])
SPACE = mostly([b"", b" "], [b"\t", b"  ", b" \t", b"\x0b", b"\x0c"])
METHODS = mostly([b"POST", b"GET", b"PUT", b"HEAD"], [b"OPTIONS", b"post", b"PO ST", b"P", b"POST#", b""])
TARGETS = mostly([b"/", b"/score"], [b"*", b"http://x/", b"", b"/a b", b"/\x7f", b"/%00", b"//"])
VERSIONS = mostly([b"HTTP/1.1", b"HTTP/1.0"], [b"HTTP/2.0", b"HTTP/0.9", b"http/1.1", b"HTTP/1.1 ", b"HTTP/11"])
DIGITS = st.text("0123456789", min_size=0, max_size=24).map(str.encode)
LENGTHS = st.one_of(
    st.integers(0, 64).map(lambda n: b"%d" % n),
    st.integers(0, 64).map(lambda n: b"000%d" % n),
    DIGITS,
    st.sampled_from([b"-1", b"+5", b"5 5", b"5,5", b"0x10", b"1e2", b" 5", b"\xb2", b"5\x00", b"9" * 4400]),
)
CODINGS = mostly(
    [b"chunked", b"Chunked", b"CHUNKED", b"chunked ", b" chunked", b"\tchunked"],
    [
        b"chunked,",
        b",chunked",
        b"chunked, chunked",
        b"gzip, chunked",
        b"identity, chunked",
        b"chunked, identity",
        b"gzip",
        b"identity",
        b"deflate",
        b"x",
        b"",
        b"chunked;q=1",
        b"chunked\x00",
        b"chunk ed",
    ],
)
NAMES = mostly(
    [
        b"Content-Length",
        b"content-length",
        b"Transfer-Encoding",
        b"transfer-encoding",
        b"Host",
        b"Expect",
        b"Content-Type",
        b"Authorization",
        b"Connection",
        b"X-A",
    ],
    [
        b"Content-Length ",
        b" Content-Length",
        b"Content_Length",
        b"Transfer_Encoding",
        b"Transfer-Encoding ",
        b"X A",
        b"",
        b"X\x00",
        b"\xe9",
        b"CONTENT-LENGTH",
    ],
)


@st.composite
def field_lines(draw) -> bytes:
    name = draw(NAMES)
    lowered = name.strip().lower()
    if lowered.startswith(b"content"):
        value = draw(LENGTHS) if b"length" in lowered else draw(st.sampled_from([b"application/json", b""]))
    elif lowered.startswith(b"transfer"):
        value = draw(CODINGS)
    elif lowered == b"expect":
        value = draw(mostly([b"100-continue", b"100-Continue"], [b"nothing", b""]))
    else:
        value = draw(mostly([b"x", b"", b"a b", b"\x80\xff", b"close", b"keep-alive"], [b"a\x00b", b"a\x7f"]))
    colon = draw(mostly([b":"], [b"", b"::", b" :"]))
    return name + colon + draw(SPACE) + value + draw(SPACE)


@st.composite
def chunk_lines(draw, size: int) -> bytes:
    digits = draw(mostly([b"%x", b"%X", b"0%x", b"000000000000000000%x"], [b"%x ", b" %x", b"-%x", b"0x%x"]))
    extension = draw(mostly([b"", b";a", b";a=b", b' ; a = "q\\"s"'], [b";", b";a=", b";a b", b";\x01", b";a=\r"]))
    return digits % size + extension


@st.composite
def chunked_bodies(draw) -> bytes:
    out = b""
    for _ in range(draw(st.integers(0, 4))):
        size = draw(st.integers(1, 40))
        data = draw(st.binary(min_size=size, max_size=size) | st.binary(min_size=max(0, size - 2), max_size=size + 2))
        out += draw(chunk_lines(size)) + draw(EOL) + data + draw(EOL)
    if draw(st.booleans()) and draw(st.booleans()):  # a size past the limits
        out += draw(st.sampled_from([b"1" * 17, b"f" * 16, b"1001"])) + b"\r\n"
    last = draw(mostly([b"0", b"000", b"0;a=b"], [b"0 ", b""]))
    trailers = b"".join(draw(st.lists(field_lines(), max_size=2).map(lambda lines: [f + b"\r\n" for f in lines])))
    return out + last + draw(EOL) + trailers + draw(EOL)


@st.composite
def requests(draw) -> bytes:
    leading = draw(mostly([b""], [b"\r\n", b"\r\n\r\n", b"\n", b" "]))
    line = draw(METHODS) + draw(mostly([b" "], [b"  ", b"\t"])) + draw(TARGETS) + b" " + draw(VERSIONS)
    fields = draw(st.lists(field_lines(), max_size=5))
    head = leading + line + draw(EOL) + b"".join(field + draw(EOL) for field in fields) + draw(EOL)
    body = draw(st.one_of(chunked_bodies(), st.binary(max_size=80)))
    after = draw(st.sampled_from([b"", b"GET / HTTP/1.1\r\n\r\n", b"0\r\n\r\n", b"\r\n", b"x"]))
    return head + body + after


READS = st.lists(st.integers(1, 64), max_size=8)


def check(data: bytes, reads: list[int]) -> None:
    ours, framing = by_framing(data, reads)
    whole_read, _ = by_framing(data, [len(data)])
    assert ours == whole_read, f"the framing depends on the reads: {ours} vs {whole_read}"
    theirs = by_gunicorn(data, reads)
    if ours.kind == "whole" and theirs.kind == "whole":
        assert (ours.body, ours.rest) == (theirs.body, theirs.rest), f"framed differently: {ours} vs {theirs}"
    if theirs.kind == "whole":
        assert ours.kind != "incomplete", f"gunicorn framed it whole, the framing waits: {theirs}"
    if ours.kind == "whole":
        thread = on_a_thread(framing)
        if theirs.kind == "whole":  # the head gunicorn accepted reads the same on a thread
            assert thread == Outcome("whole", ours.body, b""), thread
        else:  # refused on the thread by gunicorn's own checks, never by a head read astray
            assert thread.kind == "refused" and "framed" not in thread.detail, thread


@FUZZ
@given(data=requests(), reads=READS)
def test_the_framing_agrees_with_gunicorns_parser(data: bytes, reads: list[int]) -> None:
    check(data, reads)


@FUZZ
@given(data=st.binary(max_size=200), reads=READS)
def test_any_bytes_are_framed_as_gunicorn_frames_them_or_refused(data: bytes, reads: list[int]) -> None:
    check(b"POST / HTTP/1.1\r\n" + data, reads)


@pytest.fixture(scope="module")
def worker(tmp_path_factory) -> Iterator[Server]:
    env = {"SCORER_MAX_BODY_BYTES": str(MAX_BODY), "SCORER_HEAD_TIMEOUT_S": "5", "SCORER_BODY_TIMEOUT_S": "5"}
    with gunicorn_server("ocr", env, require_ready=False, log_dir=tmp_path_factory.mktemp("logs")) as server:
        yield server


STATUS_LINE = re.compile(rb"HTTP/1\.[01] ([1-5][0-9][0-9]) ")


@fuzz(max(100, EXAMPLES // 10))
@given(data=requests())
def test_the_running_worker_answers_every_request(worker, data: bytes) -> None:
    pid = http.get(worker.url + "/health", timeout=10).json()["pid"]
    with socket.create_connection(("127.0.0.1", worker.port), timeout=20) as sock:
        with contextlib.suppress(OSError):  # the worker may refuse and close before all is sent
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                answer += chunk
    statuses = [int(status) for status in STATUS_LINE.findall(answer)]
    assert answer.startswith(b"HTTP/1.") and statuses, answer[:200]
    assert all(status < 500 or status in (501, 503, 505) for status in statuses), answer[:500]
    assert b"internal error" not in answer, answer[:500]  # a fault: a 503 on a pickle body
    assert http.get(worker.url + "/health", timeout=10).json()["pid"] == pid


class EchoUpstream(socketserver.ThreadingTCPServer):
    """Frames what nginx forwards with ``common.server.framing``; answers each request with its body.
    A refusal of what gunicorn's parser would take is recorded as a disagreement."""

    daemon_threads = True
    disagreements: list[str]

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            rest = b""
            while True:
                framing, seen = RequestFraming(1 << 24), bytearray(rest)
                framing.receive(rest)
                try:
                    while framing.read_head() is None or not framing.read_body():
                        data = self.request.recv(65536)
                        if not data:
                            return
                        seen += data
                        framing.receive(data)
                except Refused as refused:
                    if by_gunicorn(bytes(seen), [len(seen)]).kind != "refused":
                        self.server.disagreements.append(f"{refused.status} {refused.message}: {bytes(seen)!r}")
                    return
                except OSError:
                    return
                body, rest = bytes(framing.body), framing.rest()
                self.request.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)


@pytest.fixture(scope="module")
def through_nginx(tmp_path_factory) -> Iterator[tuple[str, EchoUpstream]]:
    upstream = EchoUpstream(("127.0.0.1", 0), EchoUpstream.Handler)
    upstream.disagreements = []
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    node = f"127.0.0.1:{upstream.server_address[1]}"
    try:
        with nginx([node], tmp_path_factory.mktemp("nginx")) as balancer:
            yield balancer.url, upstream
    finally:
        upstream.shutdown()
        upstream.server_close()


def responses(data: bytes) -> list[tuple[int, bytes]]:
    """(status, body) of each final response in ``data`` (nginx's: with Content-Length)."""
    out = []
    while (end := data.find(b"\r\n\r\n")) >= 0:
        head, data = data[:end], data[end + 4 :]
        status = int(head[9:12])
        if status < 200:  # 100 Continue: no body, and not the request's answer
            continue
        length = re.search(rb"\r\ncontent-length: *([0-9]+)", head, re.IGNORECASE)
        size = int(length[1]) if length else len(data)
        out.append((status, data[:size]))
        data = data[size:]
    return out


def framed_bodies(data: bytes) -> list[bytes]:
    """The bodies of the requests in ``data`` that the framing frames whole, in order, up to the
    first it refuses or waits on."""
    bodies = []
    while True:
        outcome, _ = by_framing(data, [len(data)])
        if outcome.kind != "whole":
            return bodies
        bodies.append(outcome.body)
        data = outcome.rest


@fuzz(max(100, EXAMPLES // 10))
@given(data=requests())
def test_nginx_and_the_framing_agree(through_nginx, data: bytes) -> None:
    assume(not data.lstrip(b"\r\n").startswith(b"HEAD"))  # the echo of a HEAD has no body to compare
    if b"\nhost:" not in data.lower():  # nginx refuses HTTP/1.1 without a Host
        data = data.replace(b"\r\n", b"\r\nHost: scorer\r\n", 1)
    url, upstream = through_nginx
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=20) as sock:
        with contextlib.suppress(OSError):
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                answer += chunk
    assert not upstream.disagreements, upstream.disagreements
    ours = framed_bodies(data)
    for n, (status, body) in enumerate(responses(answer)):
        if status == 200 and n < len(ours):
            assert body == ours[n], f"request {n}: nginx forwarded {body!r}, the framing reads {ours[n]!r}"


# Cases fuzzing found (in the framing as first written), kept as fixed cases.
FOUND = {
    "a last chunk of zeros": b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n000\r\n\r\n",
    "a bare LF in the body read with the head": b"POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\na\nb",
    "a repeated Content-Type trailer": b"POST / HTTP/1.1\r\nHost:x\r\nTransfer-Encoding:chunked\r\n\r\n0\r\n"
    b"Content-Type:application/json\r\nContent-Type:application/json\r\n\r\n",
}


def test_found_by_fuzzing() -> None:
    for data in FOUND.values():
        check(data, [])
