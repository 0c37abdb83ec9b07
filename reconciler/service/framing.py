"""Strict reading of an HTTP/1.1 request's framing (RFC 9112): its request line, its field
lines, how its body is delimited (Content-Length or chunked) and the chunked body itself.

A server behind a proxy must read a request's length exactly as the proxy does, or a body can
carry a second, smuggled request. Python's http.server is lax where that matters: it parses
field lines with the email parser (which unfolds obsolete line folding, splits lines on a bare
CR and ends the header block at a line without a colon) and the body is left to the handler.
So every line is checked here against the RFC's grammar before http.server sees it, and
anything outside it is refused (``BadRequest``, with its status); nothing is repaired.

``RequestHandler`` (service/http.py) calls ``check_request_line``, ``read_field_block``,
``body_framing`` and ``read_chunked``; each reads at most a bounded number of bytes.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from dataclasses import dataclass

MAX_FIELD_LINE = 8192  # bytes of one field line (name, value and CRLF)
MAX_FIELDS = 100  # field lines in a header block (http.server's own limit)
MAX_HEAD = 64 * 1024  # bytes of a whole header block
MAX_CHUNK_LINE = 1024  # bytes of a chunk-size line with its extensions
MAX_TRAILERS = 32  # trailer field lines after the last chunk
MAX_TRAILER_LINE = 1024

_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_QUOTED = rb'"(?:[\t \x21\x23-\x5b\x5d-\x7e\x80-\xff]|\\[\t \x21-\x7e\x80-\xff])*"'
# method SP request-target SP HTTP-version CRLF; only origin-form targets are served.
_REQUEST_LINE = re.compile(rb"(" + _TOKEN + rb") (/[\x21-\x7e]*) HTTP/1\.[01]\r\n")
# field-name ":" OWS field-value OWS; a value is visible characters, spaces and tabs.
_FIELD_LINE = re.compile(rb"(" + _TOKEN + rb"):[\t \x21-\x7e\x80-\xff]*\r\n")
# chunk-size [ chunk-ext ] CRLF: hex digits only (no 0x, sign, underscore or space), at
# most 16 of them; extensions are well-formed name[=value] pairs, and ignored.
_CHUNK_VALUE = rb"(?:[\t ]*=[\t ]*(?:" + _TOKEN + rb"|" + _QUOTED + rb"))?"
_CHUNK_EXT = rb"(?:[\t ]*;[\t ]*" + _TOKEN + _CHUNK_VALUE + rb")*"
_CHUNK_LINE = re.compile(rb"([0-9A-Fa-f]{1,16})" + _CHUNK_EXT + rb"\r\n")
_CONTENT_LENGTH = re.compile(r"[0-9]{1,18}")


class BadRequest(Exception):
    """A request outside RFC 9112's grammar or this server's bounds: answered ``status``
    and the connection closed."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class BodyTooLarge(Exception):
    pass


@dataclass(frozen=True)
class Framing:
    """How a request's body is delimited: by ``length`` bytes, ``chunked``, or neither
    (no body)."""

    length: int | None = None
    chunked: bool = False

    @property
    def has_body(self) -> bool:
        return self.chunked or bool(self.length)


def check_request_line(line: bytes) -> None:
    """``BadRequest`` unless ``line`` (with its CRLF) is one method, one origin-form target and
    HTTP/1.0 or 1.1, separated by single spaces."""
    if not _REQUEST_LINE.fullmatch(line):
        raise BadRequest(400, "malformed request line")


def _field_line(line: bytes, what: str) -> None:
    if not line.endswith(b"\r\n"):
        raise BadRequest(400, f"{what} not ended by CRLF")
    if line[:1] in (b" ", b"\t"):
        raise BadRequest(400, "obsolete line folding")
    if not _FIELD_LINE.fullmatch(line):
        # A bare CR, a control character, a space before the colon, no colon at all.
        raise BadRequest(400, f"malformed {what}")


def read_field_block(rfile: io.BufferedIOBase) -> bytes:
    """The request's field lines up to and including the empty line, each checked; at most
    MAX_FIELDS lines and MAX_HEAD bytes (431 beyond)."""
    head = bytearray()
    for _ in range(MAX_FIELDS + 1):
        line = rfile.readline(MAX_FIELD_LINE + 1)
        if line == b"\r\n":
            return bytes(head + line)
        if len(line) > MAX_FIELD_LINE:
            raise BadRequest(431, "header field line too long")
        if not line:
            raise BadRequest(400, "request ended inside its header")
        _field_line(line, "header field line")
        head += line
        if len(head) > MAX_HEAD:
            raise BadRequest(431, "header too large")
    raise BadRequest(431, "too many header fields")


def body_framing(method: str, version: str, fields: Sequence[tuple[str, str]]) -> Framing:
    """How the body is delimited, from the request's (name, value) fields (RFC 9112 6).

    Refused: Transfer-Encoding together with Content-Length (the classic smuggling shape:
    a proxy may frame by one and this server by the other), Transfer-Encoding in HTTP/1.0,
    any transfer coding but a single ``chunked`` (501), a Content-Length that is not one run
    of digits, or given twice (even twice the same: no honest client does), and a body on a
    GET or HEAD (which a proxy may not forward as one).
    """
    codings = [v for name, v in fields if name.lower() == "transfer-encoding"]
    lengths = [v.strip(" \t") for name, v in fields if name.lower() == "content-length"]
    if codings and lengths:
        raise BadRequest(400, "Transfer-Encoding and Content-Length both given")
    if codings:
        if version == "HTTP/1.0":
            raise BadRequest(400, "Transfer-Encoding in an HTTP/1.0 request")
        listed = [c.strip(" \t").lower() for value in codings for c in value.split(",")]
        if listed != ["chunked"]:
            raise BadRequest(501, "only Transfer-Encoding: chunked is supported")
        framing = Framing(chunked=True)
    elif lengths:
        if len(lengths) != 1 or not _CONTENT_LENGTH.fullmatch(lengths[0]):
            raise BadRequest(400, "Content-Length must be one decimal number")
        framing = Framing(length=int(lengths[0]))
    else:
        framing = Framing()
    if method in ("GET", "HEAD") and framing.has_body:
        raise BadRequest(400, f"a {method} request carries no body")
    return framing


def read_chunked(rfile: io.BufferedIOBase, limit: int) -> bytes:
    """A chunked request body (RFC 9112 7.1), refused (``BodyTooLarge``) as soon as a chunk's
    declared size would take it over ``limit``: before that chunk is read. ``BadRequest`` when
    it is malformed: a size that is not hex digits, a bad extension, a chunk shorter than
    declared, a line not ended by CRLF, a malformed or excess trailer. Trailer fields are
    checked and dropped (never merged into the header)."""
    body = bytearray()
    while True:
        line = rfile.readline(MAX_CHUNK_LINE)
        found = _CHUNK_LINE.fullmatch(line)
        if found is None:
            raise BadRequest(400, "malformed chunk-size line")
        size = int(found.group(1), 16)
        if len(body) + size > limit:
            raise BodyTooLarge
        if size == 0:
            break
        chunk = rfile.read(size)
        if len(chunk) != size or rfile.read(2) != b"\r\n":
            raise BadRequest(400, "chunk shorter than declared or not ended by CRLF")
        body += chunk
    for _ in range(MAX_TRAILERS):
        line = rfile.readline(MAX_TRAILER_LINE + 1)
        if line == b"\r\n":
            return bytes(body)
        if not line or len(line) > MAX_TRAILER_LINE:
            raise BadRequest(400, "trailer missing its end or too long")
        _field_line(line, "trailer field line")
    raise BadRequest(400, "too many trailer fields")
