"""The framing of an HTTP/1.1 request: where its head ends, its body (by Content-Length or
chunked coding, de-chunked here) and where the next request on the connection starts.

The worker's main loop (``common.server.worker``) reads every request through this before a request
thread sees it, so a slow client holds a socket, never a thread, and no thread ever reads from
a socket. What is framed here is what the application gets: gunicorn's parser only parses the
head it is handed (``FramedRequest``), never the body. So this module refuses everything it
does not frame exactly as gunicorn's parser (``gunicorn.http``) would: anything but one
``Content-Length`` of digits or one ``Transfer-Encoding: chunked``, malformed lines, bare LFs,
chunk extensions outside RFC 9112's grammar. ``tests/test_fuzz_framing.py`` checks the two
against each other.

Each step costs time and memory linear in the bytes it is given: the head is searched from
where the last search stopped, chunks are taken out of the buffer as they complete.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field

CRLF = b"\r\n"
HEAD_END = b"\r\n\r\n"
# A head (request line and fields) longer than this is refused with 431 before its end is seen:
# it is all a request costs before its token is checked.
MAX_HEAD_BYTES = 64 * 1024
# gunicorn's own default limits, refused here with its statuses.
MAX_REQUEST_LINE = 4094
MAX_FIELDS = 100
MAX_FIELD_BYTES = 8190
# Content-Length values of more digits are refused before they are converted (int() of 4,300
# digits raises, and takes quadratic time up to there).
MAX_LENGTH_DIGITS = 18
# A chunk-size line (size and extensions) longer than this is refused.
MAX_CHUNK_LINE = 4096
# Each chunk costs a step of the main loop, whatever its size: a body of more chunks than this
# is refused (413), which bounds the CPU a chunked body costs at one such step per chunk.
MAX_CHUNKS = 65536

# RFC 9110 5.6.2 token, 5.6.4 quoted-string, 5.5 field-value; RFC 9112 7.1.1 chunk-ext.
_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_QUOTED = rb'"(?:[\t !#-\[\]-~\x80-\xff]|\\[\t -~\x80-\xff])*"'
TOKEN = re.compile(_TOKEN)
NOT_FIELD_VALUE = re.compile(rb"[^\t -~\x80-\xff]")
# gunicorn's methods: a token of 3 to 20 characters, no lowercase letter and no "#".
REQUEST_LINE = re.compile(rb"([!$%&'*+\-.^_`|~0-9A-Z]{3,20}) ([!-~]+) HTTP/([0-9])\.([0-9])")
CHUNK_LINE = re.compile(
    rb"([0-9A-Fa-f]+)((?:[ \t]*;[ \t]*" + _TOKEN + rb"(?:[ \t]*=[ \t]*(?:" + _TOKEN + rb"|" + _QUOTED + rb"))?)*)"
)
BARE_LF = re.compile(rb"(?<!\r)\n")
# Fields that may appear once in a section (the framing's, and those gunicorn refuses repeated).
SINGLETON_FIELDS = (b"host", b"content-type", b"content-length", b"transfer-encoding", b"expect")
# Trailer fields that would change the framing, routing or authentication (RFC 9110 6.5.1).
FORBIDDEN_TRAILERS = frozenset((b"content-length", b"transfer-encoding", b"host", b"trailer", b"authorization", b"te"))


def field_line(line: bytes) -> tuple[bytes, bytes]:
    """A field line's lowercased name and its value (RFC 9110 5.5, 5.6.2), or ``Refused``."""
    name, colon, value = line.partition(b":")
    value = value.strip(b" \t")
    if not colon or not TOKEN.fullmatch(name) or NOT_FIELD_VALUE.search(value):
        raise Refused(400, "malformed header field line")
    return name.lower(), value


def field_section(lines: list[bytes]) -> dict[bytes, list[bytes]]:
    """The values of each field of a head or trailer section, by lowercased name, refused as
    gunicorn refuses them: over its limits, underscored names, repeated singletons."""
    if len(lines) > MAX_FIELDS or any(len(line) + len(CRLF) > MAX_FIELD_BYTES for line in lines):
        raise Refused(431, f"more than {MAX_FIELDS} header fields or one over {MAX_FIELD_BYTES} bytes")
    fields: dict[bytes, list[bytes]] = {}
    for line in lines:
        name, value = field_line(line)
        if b"_" in name:  # gunicorn refuses these: HTTP_X_Y could be either X-Y or X_Y
            raise Refused(400, "underscore in a header field name")
        fields.setdefault(name, []).append(value)
    for singleton in SINGLETON_FIELDS:
        if len(fields.get(singleton, ())) > 1:
            raise Refused(400, f"repeated {singleton.decode()} field")
    return fields


class Refused(Exception):
    """The request cannot be framed or is over a limit: answer ``status`` and close;
    ``retry_later`` when the worker's load refused it (``ScorerError.retry_later``)."""

    def __init__(self, status: int, message: str, retry_later: bool = False) -> None:
        super().__init__(message)
        self.status, self.message, self.retry_later = status, message, retry_later


@dataclass(frozen=True)
class Head:
    """What the worker needs of a request's head before its body is read."""

    raw: bytes  # request line and fields, up to and including the blank line
    method: str
    version: tuple[int, int]
    content_type: str | None
    authorization: str | None  # repeated fields joined with "," as gunicorn does
    expects_continue: bool
    content_length: int | None  # None when chunked
    chunked: bool

    @property
    def has_body(self) -> bool:
        return self.chunked or bool(self.content_length)


class _Step(enum.Enum):
    HEAD = "head"
    LENGTH = "body of known length"
    CHUNK_LINE = "chunk-size line"
    CHUNK_DATA = "chunk data"
    CHUNK_END = "CRLF after chunk data"
    TRAILERS = "trailer section"
    DONE = "done"


@dataclass
class RequestFraming:
    """One request as its bytes arrive: ``receive`` them, then ``read_head`` until it returns the
    head, then ``read_body`` until it returns True; ``Refused`` when the request cannot be served."""

    max_body: int
    head: Head | None = None
    body: bytearray = field(default_factory=bytearray)
    _raw: bytearray = field(default_factory=bytearray)  # received and not yet consumed
    _searched: int = 0  # where the next search for a terminator starts in _raw
    _step: _Step = _Step.HEAD
    _left: int = 0  # bytes of the current chunk (or of the body) still due
    _chunks: int = 0

    @property
    def buffered(self) -> int:
        return len(self._raw)

    @property
    def complete(self) -> bool:
        return self._step is _Step.DONE

    def wants(self, most: int) -> int:
        """How many bytes to receive next: no more than the head limit allows before the head."""
        if self._step is _Step.HEAD:
            return max(1, min(most, MAX_HEAD_BYTES + 1 - len(self._raw)))
        return most

    def receive(self, data: bytes) -> None:
        self._raw += data

    def rest(self) -> bytes:
        """The bytes after a complete request: the start of the next one (pipelining)."""
        return bytes(self._raw)

    def step(self) -> str:
        return self._step.value

    # -- the head ----------------------------------------------------------------------------

    def read_head(self) -> Head | None:
        if self.head is not None:
            return self.head
        raw = self._raw
        start = 2 if raw[:2] == CRLF else 0  # RFC 9112 2.2: one empty line before the request
        found = raw.find(HEAD_END, max(start, self._searched - 3))
        if BARE_LF.search(raw, max(0, self._searched - 1), len(raw) if found < 0 else found + len(HEAD_END)):
            raise Refused(400, "bare LF in the request head; lines end with CRLF")
        self._searched = len(raw)
        if found < 0 or found + len(HEAD_END) > MAX_HEAD_BYTES:
            if len(raw) > MAX_HEAD_BYTES:
                raise Refused(431, f"request head over {MAX_HEAD_BYTES} bytes")
            return None
        end = found + len(HEAD_END)
        self.head = self._parse_head(bytes(raw[start:end]))
        del raw[:end]
        self._searched = 0
        self._step = _Step.CHUNK_LINE if self.head.chunked else _Step.LENGTH
        self._left = self.head.content_length or 0
        return self.head

    def _parse_head(self, raw: bytes) -> Head:
        request_line, *lines = raw[: -len(HEAD_END)].split(CRLF)
        if len(request_line) > MAX_REQUEST_LINE:
            raise Refused(414, f"request line over {MAX_REQUEST_LINE} bytes")
        matched = REQUEST_LINE.fullmatch(request_line)
        if matched is None:
            raise Refused(400, "malformed request line")
        method, major, minor = matched[1].decode(), int(matched[3]), int(matched[4])
        if (major, minor) not in ((1, 0), (1, 1)):
            raise Refused(505, f"HTTP/{major}.{minor} is not supported")
        fields = field_section(lines)
        (content_type,) = fields.get(b"content-type", [None])
        (expect,) = fields.get(b"expect", [None])
        if expect is not None and expect.lower() != b"100-continue":
            raise Refused(417, "the only expectation understood is 100-continue")
        authorization = fields.get(b"authorization")
        content_length, chunked = self._body_framing(fields, (major, minor))
        return Head(
            raw=raw,
            method=method,
            version=(major, minor),
            content_type=content_type.decode("latin-1") if content_type is not None else None,
            authorization=b",".join(authorization).decode("latin-1") if authorization else None,
            expects_continue=expect is not None and (major, minor) >= (1, 1),
            content_length=content_length,
            chunked=chunked,
        )

    def _body_framing(self, fields: dict[bytes, list[bytes]], version: tuple[int, int]) -> tuple[int | None, bool]:
        """(Content-Length, chunked) as gunicorn would frame them, or ``Refused``."""
        (length,) = fields.get(b"content-length", [None])
        (coding,) = fields.get(b"transfer-encoding", [None])
        if coding is not None:
            if length is not None:
                raise Refused(400, "both Content-Length and Transfer-Encoding")
            if version < (1, 1):
                raise Refused(400, "Transfer-Encoding in an HTTP/1.0 request")
            codings = [part.strip(b" \t").lower() for part in coding.split(b",")]
            if codings == [b"chunked"]:
                return None, True
            if set(codings) <= {b"chunked", b""}:
                raise Refused(400, "malformed Transfer-Encoding")
            raise Refused(501, "the only transfer coding accepted is chunked")
        if length is None:
            return 0, False
        if not length.isdigit() or len(length) > MAX_LENGTH_DIGITS:
            raise Refused(400, "Content-Length is not a number of at most 18 digits")
        if int(length) > self.max_body:
            raise Refused(413, f"body of {int(length)} bytes; the limit is {self.max_body}")
        return int(length), False

    # -- the body ----------------------------------------------------------------------------

    def read_body(self) -> bool:
        """Take what has arrived of the body; True once the request is whole."""
        assert self.head is not None, "read_head() first"
        while self._step is not _Step.DONE:
            if not self._advance():
                return False
        return True

    def _advance(self) -> bool:
        """One step of the body; False when it needs more bytes."""
        raw = self._raw
        if self._step in (_Step.LENGTH, _Step.CHUNK_DATA):
            taken = min(self._left, len(raw))
            self.body += raw[:taken]
            del raw[:taken]
            self._left -= taken
            if self._left:
                return False
            self._step = _Step.DONE if self._step is _Step.LENGTH else _Step.CHUNK_END
            return True
        if self._step is _Step.CHUNK_END:
            if len(raw) < 2:
                return False
            if raw[:2] != CRLF:
                raise Refused(400, "chunk data not followed by CRLF")
            del raw[:2]
            self._step = _Step.CHUNK_LINE
            return True
        if self._step is _Step.CHUNK_LINE:
            return self._chunk_line()
        return self._trailers()

    def _chunk_line(self) -> bool:
        raw = self._raw
        end = raw.find(CRLF, max(0, self._searched - 1))
        if end < 0 or end > MAX_CHUNK_LINE:
            self._searched = len(raw)
            if len(raw) > MAX_CHUNK_LINE:
                raise Refused(400, f"chunk-size line over {MAX_CHUNK_LINE} bytes")
            return False
        matched = CHUNK_LINE.fullmatch(raw, 0, end)
        if matched is None:
            raise Refused(400, "malformed chunk-size line")
        digits = matched[1].lstrip(b"0")
        size = int(digits or b"0", 16) if len(digits) <= 16 else self.max_body + 1
        if len(self.body) + size > self.max_body:
            raise Refused(413, f"chunked body over the limit of {self.max_body} bytes")
        self._chunks += 1
        if self._chunks > MAX_CHUNKS:
            raise Refused(413, f"chunked body of more than {MAX_CHUNKS} chunks")
        del raw[: end + len(CRLF)]
        self._searched = 0
        self._left = size
        self._step = _Step.CHUNK_DATA if size else _Step.TRAILERS
        return True

    def _trailers(self) -> bool:
        raw = self._raw
        if raw[:2] == CRLF:
            del raw[:2]
            self._step = _Step.DONE
            return True
        end = raw.find(HEAD_END, max(0, self._searched - 3))
        if BARE_LF.search(raw, max(0, self._searched - 1), len(raw) if end < 0 else end + len(HEAD_END)):
            raise Refused(400, "bare LF in the trailer section")
        self._searched = len(raw)
        if end < 0 or end > MAX_HEAD_BYTES:
            if len(raw) > MAX_HEAD_BYTES:
                raise Refused(431, f"trailer section over {MAX_HEAD_BYTES} bytes")
            return False
        forbidden = FORBIDDEN_TRAILERS.intersection(field_section(bytes(raw[:end]).split(CRLF)))
        if forbidden:
            raise Refused(400, f"forbidden trailer field {min(forbidden).decode()}")
        del raw[: end + len(HEAD_END)]
        self._step = _Step.DONE
        return True
