"""The minimal HTTP/1.1 response reader of `mp` (cli/_http.py), on canned bytes."""

from __future__ import annotations

import pytest

from cli._http import ProtocolError, RawResponse, parse_response

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"


@pytest.mark.parametrize(
    ("data", "body"),
    [
        (HEAD + b"Content-Length: 2\r\n\r\n{}", b"{}"),
        (HEAD + b"Content-Length: 2\r\n\r\n{}trailing", b"{}"),
        (HEAD + b'Transfer-Encoding: chunked\r\n\r\n4\r\n{"a"\r\n3;ext=1\r\n:1}\r\n0\r\n\r\n', b'{"a":1}'),
        (HEAD + b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\nX-Trailer: 1\r\n\r\n", b"{}"),
        (b"HTTP/1.1 100 Continue\r\n\r\n" + HEAD + b"Content-Length: 2\r\n\r\n[]", b"[]"),
        (b"HTTP/1.1 204 No Content\r\n\r\n", b""),
    ],
)
def test_complete_answers(data: bytes, body: bytes) -> None:
    got = parse_response(data, eof=False)
    assert isinstance(got, RawResponse)
    assert got.body == body
    assert got.status == (204 if b" 204 " in data else 200)


def test_status_reason_and_lower_cased_headers() -> None:
    got = parse_response(b"HTTP/1.0 404 Not Found\r\nX-Thing:  v \r\nContent-Length: 0\r\n\r\n", eof=False)
    assert got == RawResponse(404, "Not Found", {"x-thing": "v", "content-length": "0"}, b"")


@pytest.mark.parametrize(
    "data",
    [
        HEAD,  # header not finished
        HEAD + b"Content-Length: 10\r\n\r\n{}",
        HEAD + b'Transfer-Encoding: chunked\r\n\r\n4\r\n{"a',
        HEAD + b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n",
        HEAD + b"\r\n{}",  # no length: the body runs to EOF
    ],
)
def test_incomplete_answers_ask_for_more(data: bytes) -> None:
    assert parse_response(data, eof=False) is None


def test_a_body_without_length_ends_at_eof() -> None:
    assert parse_response(HEAD + b"\r\n{}", eof=True) == RawResponse(
        200, "OK", {"content-type": "application/json"}, b"{}"
    )


@pytest.mark.parametrize(
    ("data", "eof"),
    [
        (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", False),
        (b"HTTP/1.1 abc OK\r\n\r\n", False),
        (HEAD + b"Bad header line\r\n\r\n", False),
        (HEAD + b"Content-Length: -1\r\n\r\n", False),
        (HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n", False),
        (HEAD + b"Content-Length: 10\r\n\r\n{}", True),
        (HEAD, True),
    ],
)
def test_malformed_or_truncated_answers_raise(data: bytes, eof: bool) -> None:
    with pytest.raises(ProtocolError):
        parse_response(data, eof=eof)


def test_byte_by_byte_arrival_gives_the_same_answer() -> None:
    data = HEAD + b'Transfer-Encoding: chunked\r\n\r\n4\r\n{"a"\r\n3\r\n:1}\r\n0\r\n\r\n'
    results = [parse_response(data[:n], eof=False) for n in range(1, len(data) + 1)]
    assert all(r is None for r in results[:-1])
    assert results[-1] is not None and results[-1].body == b'{"a":1}'
