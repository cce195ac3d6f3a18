"""When a request has all arrived: the worker hands a request to a thread only then."""

from __future__ import annotations

import pytest

from common.framing import MAX_HEAD_BYTES, Arrival, RequestScan

pytestmark = pytest.mark.unit

HEAD = b"POST / HTTP/1.1\r\nHost: scorer\r\n"


def arrivals(data: bytes, max_body: int = 1 << 20) -> list[Arrival]:
    """The scan's verdict after each byte, as if the request came one byte at a time."""
    scan, buffer, seen = RequestScan(max_body), bytearray(), []
    for byte in data:
        buffer.append(byte)
        seen.append(scan.feed(buffer))
        if seen[-1] is not Arrival.PARTIAL:
            break
    return seen


def test_complete_exactly_when_the_last_byte_of_the_body_arrives() -> None:
    for request in (
        b"GET /health HTTP/1.1\r\nHost: scorer\r\n\r\n",
        HEAD + b"Content-Length: 5\r\n\r\nhello",
        HEAD + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n3;ext=1\r\nabc\r\n0\r\n\r\n",
        HEAD + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nTrailer: x\r\n\r\n",
    ):
        seen = arrivals(request)
        assert seen[-1] is Arrival.COMPLETE and len(seen) == len(request), request
        assert set(seen[:-1]) <= {Arrival.PARTIAL}


@pytest.mark.parametrize(
    "request_bytes",
    [
        HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n",  # not a hex size
        HEAD + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello!!",  # no CRLF after the data
        HEAD + b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",  # both framings
        HEAD + b"Transfer-Encoding: gzip\r\n\r\n",  # a coding gunicorn refuses
        HEAD + b"Content-Length: 5\r\nContent-Length: 6\r\n\r\n",
        HEAD + b"Content-Length: -1\r\n\r\n",
        HEAD + b"Content-Length: 99999999999\r\n\r\n",  # over the body limit: the app says 413 unread
    ],
)
def test_what_cannot_be_framed_goes_to_the_parser_at_once(request_bytes: bytes) -> None:
    assert arrivals(request_bytes)[-1] is Arrival.PARSER


def test_a_head_without_end_goes_to_the_parser_past_the_head_limit() -> None:
    scan = RequestScan(1 << 20)
    assert scan.feed(HEAD + b"X: y\r\n" * 1000) is Arrival.PARTIAL
    assert scan.feed(HEAD + b"X" * MAX_HEAD_BYTES) is Arrival.PARSER


def test_the_head_tells_the_format_and_the_expectation() -> None:
    scan = RequestScan(1 << 20)
    head = HEAD + b"Content-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n"
    assert scan.feed(head) is Arrival.PARTIAL
    assert (scan.content_type, scan.expects_continue) == ("application/json", True)
    assert scan.feed(head + b"{}") is Arrival.COMPLETE
