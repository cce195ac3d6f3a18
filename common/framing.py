"""How much of an HTTP/1.1 request has arrived: the end of its head, then of its body (by
Content-Length or chunked framing).

The worker (``common.worker``) buffers each request until it is whole before a request thread
touches it, so that a slow or idle client holds a socket, never a thread. This module only
decides when the bytes are all there; gunicorn's own parser still parses them. Whatever this
scan cannot frame (conflicting lengths, a bad chunk size, an unknown transfer coding) goes to
that parser at once, which answers it with its 4xx.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

HEAD_END = b"\r\n\r\n"
# A head without its blank line after this many bytes goes to the parser, which refuses it
# by its own limits (request line 4094 bytes, 100 fields of 8190 bytes by default).
MAX_HEAD_BYTES = 1024 * 1024
# A chunk-size line (hex digits and extensions) longer than this is malformed.
MAX_CHUNK_LINE = 8192
HEX_DIGITS = frozenset(b"0123456789abcdefABCDEF")


class Arrival(enum.Enum):
    PARTIAL = "more bytes are due"
    COMPLETE = "the whole request is here"
    PARSER = "not framed here: gunicorn's parser answers it"


@dataclass
class RequestScan:
    """The framing of one request as its bytes arrive; ``feed`` the growing buffer each time."""

    max_body: int
    head_end: int | None = None
    content_type: str | None = None
    expects_continue: bool = False
    body_length: int | None = None  # Content-Length, when the body is not chunked
    chunked: bool = False
    _next_chunk: int = 0  # offset of the next chunk-size line
    _searched: int = 0

    @property
    def head_complete(self) -> bool:
        return self.head_end is not None

    def feed(self, buffer: bytes | bytearray) -> Arrival:
        if self.head_end is None:
            found = buffer.find(HEAD_END, max(0, self._searched - 3))
            self._searched = len(buffer)
            if found < 0:
                return Arrival.PARSER if len(buffer) > MAX_HEAD_BYTES else Arrival.PARTIAL
            self.head_end = found + len(HEAD_END)
            if not self._read_head(bytes(buffer[:found])):
                return Arrival.PARSER
            self._next_chunk = self.head_end
        if self.chunked:
            return self._scan_chunks(buffer)
        assert self.body_length is not None
        return Arrival.COMPLETE if len(buffer) >= self.head_end + self.body_length else Arrival.PARTIAL

    def _read_head(self, head: bytes) -> bool:
        """Note the framing headers; False when the body cannot be framed here."""
        lengths: list[bytes] = []
        codings: list[bytes] = []
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            name, value = name.strip().lower(), value.strip()
            if name == b"content-length":
                lengths.append(value)
            elif name == b"transfer-encoding":
                codings.append(value.lower())
            elif name == b"expect":
                self.expects_continue = value.lower() == b"100-continue"
            elif name == b"content-type":
                self.content_type = value.decode("latin-1")
        if codings:
            self.chunked = True
            return not lengths and codings == [b"chunked"]
        if not lengths:
            self.body_length = 0
            return True
        if len(lengths) > 1 or not lengths[0].isdigit() or int(lengths[0]) > self.max_body:
            return False  # the parser refuses it, or the application answers 413 unread
        self.body_length = int(lengths[0])
        return True

    def _scan_chunks(self, buffer: bytes | bytearray) -> Arrival:
        assert self.head_end is not None
        while True:
            if self._next_chunk - self.head_end > self.max_body:
                return Arrival.PARSER  # over the limit: the application answers 413
            line_end = buffer.find(b"\r\n", self._next_chunk)
            if line_end < 0:
                return Arrival.PARSER if len(buffer) - self._next_chunk > MAX_CHUNK_LINE else Arrival.PARTIAL
            size_field = bytes(buffer[self._next_chunk : line_end]).split(b";", 1)[0].rstrip(b" \t")
            if not size_field or len(size_field) > 16 or not HEX_DIGITS.issuperset(size_field):
                return Arrival.PARSER
            size = int(size_field, 16)
            if size == 0:  # the last chunk, then trailer fields and a blank line
                if buffer[line_end + 2 : line_end + 4] == b"\r\n":
                    return Arrival.COMPLETE
                if buffer.find(HEAD_END, line_end) >= 0:
                    return Arrival.COMPLETE
                return Arrival.PARSER if len(buffer) - line_end > MAX_HEAD_BYTES else Arrival.PARTIAL
            data_end = line_end + 2 + size
            if len(buffer) < data_end + 2:
                return Arrival.PARTIAL
            if buffer[data_end : data_end + 2] != b"\r\n":
                return Arrival.PARSER
            self._next_chunk = data_end + 2
