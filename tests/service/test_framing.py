"""Strict request framing (service/framing.py): what RFC 9112 allows is read, everything else
is refused with its status. The same cases over a raw socket to the real service are in
tests/integration/test_webhook_hostile.py."""

from __future__ import annotations

import io

import pytest

from reconciler.service.framing import (
    MAX_FIELDS,
    BadRequest,
    BodyTooLarge,
    Framing,
    body_framing,
    check_request_line,
    read_chunked,
    read_field_block,
)


@pytest.mark.parametrize(
    "line",
    [b"POST /webhook/github HTTP/1.1\r\n", b"GET /metrics?x=1 HTTP/1.0\r\n"],
)
def test_a_plain_request_line_is_read(line: bytes) -> None:
    check_request_line(line)


@pytest.mark.parametrize(
    "line",
    [
        b"POST  /webhook/github HTTP/1.1\r\n",  # two spaces
        b"POST /webhook/github HTTP/1.1\n",  # bare LF
        b"POST /webhook/github HTTP/1.1 \r\n",
        b"POST\t/webhook/github HTTP/1.1\r\n",
        b"GET /\r\n",  # HTTP/0.9
        b"GET http://example.com/ HTTP/1.1\r\n",  # absolute form: a proxy's
        b"GET /a b HTTP/1.1\r\n",
        b"GET /\x00 HTTP/1.1\r\n",
        b"GET / HTTP/2.0\r\n",
    ],
)
def test_a_request_line_outside_the_grammar_is_refused(line: bytes) -> None:
    with pytest.raises(BadRequest) as refused:
        check_request_line(line)
    assert refused.value.status == 400


def test_field_lines_are_read_up_to_the_empty_line() -> None:
    stream = io.BytesIO(b"Host: x\r\nX-A:\tb c \r\nEmpty:\r\n\r\nbody")
    assert read_field_block(stream) == b"Host: x\r\nX-A:\tb c \r\nEmpty:\r\n\r\n"
    assert stream.read() == b"body"


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"Host: x\r\n folded\r\n\r\n", 400),  # obsolete line folding
        (b"Host: x\r\n\tfolded\r\n\r\n", 400),
        (b"X: a\rContent-Length: 5\r\n\r\n", 400),  # bare CR: two lines to the email parser
        (b"Content-Length : 5\r\n\r\n", 400),  # space before the colon
        (b"no colon\r\n\r\n", 400),
        (b": no name\r\n\r\n", 400),
        (b"X(y): 1\r\n\r\n", 400),  # not a token
        (b"X: a\x00b\r\n\r\n", 400),
        (b"X: a\n\r\n", 400),  # bare LF
        (b"X: a\r\n", 400),  # the request ends inside its header
        (b"X: " + b"a" * 9000 + b"\r\n\r\n", 431),
        (b"X: 1\r\n" * (MAX_FIELDS + 1) + b"\r\n", 431),
    ],
)
def test_field_lines_outside_the_grammar_are_refused(head: bytes, status: int) -> None:
    with pytest.raises(BadRequest) as refused:
        read_field_block(io.BytesIO(head))
    assert refused.value.status == status


@pytest.mark.parametrize(
    ("fields", "framing"),
    [
        ([("Content-Length", "26")], Framing(length=26)),
        ([("content-length", " 0 ")], Framing(length=0)),
        ([("Transfer-Encoding", "chunked")], Framing(chunked=True)),
        ([("Transfer-Encoding", "Chunked")], Framing(chunked=True)),  # names are caseless
        ([("Host", "x")], Framing()),
    ],
)
def test_a_body_is_framed_by_one_length_or_chunked(
    fields: list[tuple[str, str]], framing: Framing
) -> None:
    assert body_framing("POST", "HTTP/1.1", fields) == framing


@pytest.mark.parametrize(
    ("method", "version", "fields", "status"),
    [
        ("POST", "HTTP/1.1", [("Content-Length", "5"), ("Transfer-Encoding", "chunked")], 400),
        ("POST", "HTTP/1.1", [("Content-Length", "5"), ("Content-Length", "5")], 400),
        ("POST", "HTTP/1.1", [("Content-Length", "5, 5")], 400),
        ("POST", "HTTP/1.1", [("Content-Length", "5, 6")], 400),
        ("POST", "HTTP/1.1", [("Content-Length", "+5")], 400),
        ("POST", "HTTP/1.1", [("Content-Length", "0x5")], 400),
        ("POST", "HTTP/1.1", [("Content-Length", "5_0")], 400),
        ("POST", "HTTP/1.1", [("Content-Length", "\u00b2")], 400),  # str.isdigit says yes
        ("POST", "HTTP/1.1", [("Content-Length", "")], 400),
        ("POST", "HTTP/1.1", [("Content-Length", "1" * 19)], 400),
        ("POST", "HTTP/1.1", [("Transfer-Encoding", "gzip, chunked")], 501),
        ("POST", "HTTP/1.1", [("Transfer-Encoding", "chunked, chunked")], 501),
        ("POST", "HTTP/1.1", [("Transfer-Encoding", "chunked"), ("Transfer-Encoding", "x")], 501),
        ("POST", "HTTP/1.1", [("Transfer-Encoding", "identity")], 501),
        ("POST", "HTTP/1.1", [("Transfer-Encoding", "chunked;q=1")], 501),
        ("POST", "HTTP/1.0", [("Transfer-Encoding", "chunked")], 400),
        ("GET", "HTTP/1.1", [("Content-Length", "5")], 400),
        ("GET", "HTTP/1.1", [("Transfer-Encoding", "chunked")], 400),
    ],
)
def test_ambiguous_or_unsupported_framing_is_refused(
    method: str, version: str, fields: list[tuple[str, str]], status: int
) -> None:
    with pytest.raises(BadRequest) as refused:
        body_framing(method, version, fields)
    assert refused.value.status == status


def test_a_get_may_say_its_body_is_empty() -> None:
    assert body_framing("GET", "HTTP/1.1", [("Content-Length", "0")]) == Framing(length=0)


def test_chunk_extensions_and_trailers_are_read_and_dropped() -> None:
    body = b'1A ; a ; b = c ;q="x \\" y"\r\n' + b"z" * 26 + b"\r\n000\r\nT: 1\r\nU:\r\n\r\nrest"
    stream = io.BytesIO(body)
    assert read_chunked(stream, 100) == b"z" * 26
    assert stream.read() == b"rest"


@pytest.mark.parametrize(
    "body",
    [
        b"0x5\r\nabcde\r\n0\r\n\r\n",
        b"5_0\r\nabcde\r\n0\r\n\r\n",
        b"+5\r\nabcde\r\n0\r\n\r\n",
        b"-5\r\nabcde\r\n0\r\n\r\n",
        b" 5\r\nabcde\r\n0\r\n\r\n",
        b"5 \r\nabcde\r\n0\r\n\r\n",  # whitespace only before an extension
        b"5;\r\nabcde\r\n0\r\n\r\n",
        b'5;a="x\r\nabcde\r\n0\r\n\r\n',
        b"5;a=b c\r\nabcde\r\n0\r\n\r\n",
        b"5\nabcde\r\n0\r\n\r\n",  # bare LF
        b"0" * 17 + b"5\r\nabcde\r\n0\r\n\r\n",  # more than 16 digits
        b"\r\n",
        b"5\r\nabcdeX\r\n0\r\n\r\n",  # longer than declared
        b"5\r\nab",  # shorter
        b"0\r\n",  # no end of the trailer section
        b"0\r\nno colon\r\n\r\n",
        b"0\r\n folded\r\n\r\n",
        b"0\r\n" + b"T: 1\r\n" * 33 + b"\r\n",
        b"0\r\nT: " + b"x" * 2000 + b"\r\n\r\n",
    ],
)
def test_a_chunked_body_outside_the_grammar_is_refused(body: bytes) -> None:
    with pytest.raises(BadRequest) as refused:
        read_chunked(io.BytesIO(body), 1000)
    assert refused.value.status == 400


def test_a_chunked_body_is_capped_before_the_chunk_is_read() -> None:
    stream = io.BytesIO(b"4\r\nabcd\r\n" + b"F" * 16 + b"\r\n" + b"z" * 10)
    with pytest.raises(BodyTooLarge):
        read_chunked(stream, 1000)
    assert stream.read() == b"z" * 10
