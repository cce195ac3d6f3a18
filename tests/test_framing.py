"""The framing of a request in the worker's main loop: when it is whole, its body, what is refused."""

from __future__ import annotations

import time

import pytest

from common.server.framing import MAX_CHUNKS, MAX_HEAD_BYTES, Refused, RequestFraming

pytestmark = pytest.mark.unit

HEAD = b"POST / HTTP/1.1\r\nHost: scorer\r\n"
CHUNKED = HEAD + b"Transfer-Encoding: chunked\r\n\r\n"


def frame(data: bytes, max_body: int = 1 << 20, step: int = 1) -> tuple[RequestFraming, int]:
    """Feed ``data`` ``step`` bytes at a time; the framing and how many bytes made it whole
    (-1: never whole)."""
    framing = RequestFraming(max_body)
    for end in range(step, len(data) + step, step):
        framing.receive(data[end - step : end])
        if framing.read_head() is not None and framing.read_body():
            return framing, min(end, len(data))
    return framing, -1


@pytest.mark.parametrize(
    ("request_bytes", "body"),
    [
        (b"GET /health HTTP/1.1\r\nHost: scorer\r\n\r\n", b""),
        (b"\r\nGET /health HTTP/1.1\r\n\r\n", b""),  # one empty line before the request line
        (HEAD + b"Content-Length: 5\r\n\r\nhello", b"hello"),
        (HEAD + b"Content-Length: 3\r\n\r\na\nb", b"a\nb"),  # a body's bare LF is no head's
        (CHUNKED + b"5\r\nhello\r\n3;ext=1\r\nabc\r\n0\r\n\r\n", b"helloabc"),
        (CHUNKED + b'5 ; a = "q\\"s"\r\nhello\r\n000\r\n\r\n', b"hello"),
        (CHUNKED + b"5\r\nhello\r\n0\r\nX-Trailer: x\r\n\r\n", b"hello"),
    ],
)
def test_whole_exactly_at_the_last_byte_with_its_body(request_bytes: bytes, body: bytes) -> None:
    for step in (1, 7, len(request_bytes)):
        framing, whole_at = frame(request_bytes + b"GET /next", step=step)
        assert whole_at >= len(request_bytes), (request_bytes, step)
        assert framing.complete and bytes(framing.body) == body
        assert len(framing.rest()) == whole_at - len(request_bytes)  # pipelined bytes are kept


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (CHUNKED + b"zz\r\n", 400),  # not a hex size
        (CHUNKED + b"5 \r\nhello\r\n", 400),  # whitespace after a size without extension
        (CHUNKED + b"5;\x01\r\nhello\r\n", 400),  # malformed extension
        (CHUNKED + b"5\r\nhello!!", 400),  # no CRLF after the data
        (CHUNKED + b"5\r\nhello\r\n0\r\nContent-Length: 5\r\n\r\n", 400),  # framing in a trailer
        (CHUNKED + b"0\r\nContent-Type: a\r\nContent-Type: a\r\n\r\n", 400),  # a repeated trailer
        (CHUNKED + b"1" * 17 + b"\r\n", 413),  # a 17-digit chunk size
        (CHUNKED + b"100001\r\n", 413),  # one chunk over the body limit
        (HEAD + b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n", 400),  # both framings
        (HEAD + b"Transfer-Encoding: gzip, chunked\r\n\r\n", 501),
        (HEAD + b"Transfer-Encoding: identity, chunked\r\n\r\n", 501),
        (HEAD + b"Transfer-Encoding: chunked, chunked\r\n\r\n", 400),
        (HEAD + b"Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n", 400),  # split
        (HEAD + b"Transfer-Encoding: gzip\r\n\r\n", 501),
        (b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
        (HEAD + b"Content-Length: 5\r\nContent-Length: 5\r\n\r\n", 400),
        (HEAD + b"Content-Length: -1\r\n\r\n", 400),
        (HEAD + b"Content-Length: 5 5\r\n\r\n", 400),
        (HEAD + b"Content-Length: " + b"9" * 5000 + b"\r\n\r\n", 400),
        (HEAD + b"Content-Length: 99999999999\r\n\r\n", 413),  # over the body limit: refused unread
        (HEAD + b"Content-Length : 5\r\n\r\n", 400),  # whitespace before the colon
        (HEAD + b"Content_Length: 5\r\n\r\n", 400),
        (HEAD + b" Content-Length: 5\r\n\r\n", 400),  # obsolete line folding
        (HEAD + b"X: a\nContent-Length: 5\r\n\r\n", 400),  # a bare LF, refused before the head ends
        (HEAD + b"Expect: 100-continue-please\r\n\r\n", 417),
        (b"POST / HTTP/2.0\r\n\r\n", 505),
        (b"post / HTTP/1.1\r\n\r\n", 400),
        (b"\r\n\r\nPOST / HTTP/1.1\r\n\r\n", 400),
        (HEAD + b"X: " + b"x" * MAX_HEAD_BYTES, 431),
    ],
)
def test_what_cannot_be_framed_exactly_is_refused(request_bytes: bytes, status: int) -> None:
    with pytest.raises(Refused) as refused:
        frame(request_bytes, step=len(request_bytes))
    assert refused.value.status == status
    with pytest.raises(Refused):  # and as soon as the bytes that make it so arrive
        frame(request_bytes, step=1)


def test_the_head_tells_the_format_the_token_and_the_expectation() -> None:
    framing = RequestFraming(1 << 20)
    framing.receive(
        HEAD + b"Content-Type: application/json\r\nExpect: 100-Continue\r\nAuthorization: Bearer a\r\n"
        b"authorization: b\r\nContent-Length: 2\r\n\r\n"
    )
    head = framing.read_head()
    assert head is not None and not framing.read_body()
    assert (head.content_type, head.expects_continue, head.authorization) == ("application/json", True, "Bearer a,b")
    framing.receive(b"{}")
    assert framing.read_body() and bytes(framing.body) == b"{}"


def test_a_head_takes_no_more_than_the_head_limit_before_it_is_refused() -> None:
    framing = RequestFraming(1 << 30)
    assert framing.wants(1 << 20) == MAX_HEAD_BYTES + 1
    framing.receive(HEAD)
    assert framing.wants(1 << 20) == MAX_HEAD_BYTES + 1 - len(HEAD)


def test_chunked_bodies_are_read_in_linear_time() -> None:
    """The cost per byte is the same for 1,000 and 60,000 one-byte chunks (CPU time, a ratio:
    quadratic reading was 60 times slower per byte at the larger size)."""
    per_chunk = []
    for chunks in (1000, 60_000):
        data = CHUNKED + b"1\r\nx\r\n" * chunks + b"0\r\n\r\n"
        started = time.process_time()
        framing, whole_at = frame(data, step=4096)
        per_chunk.append((time.process_time() - started) / chunks)
        assert whole_at == len(data) and len(framing.body) == chunks
    assert per_chunk[1] < 5 * per_chunk[0], per_chunk


def test_a_body_of_too_many_chunks_is_refused() -> None:
    with pytest.raises(Refused) as refused:
        frame(CHUNKED + b"1\r\nx\r\n" * (MAX_CHUNKS + 1), step=1 << 16)
    assert refused.value.status == 413
