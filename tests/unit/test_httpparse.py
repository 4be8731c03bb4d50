"""``RequestParser`` without sockets: Go's answer to each malformed head, byte for byte (as
Go's net/http sends it), the heads Go serves, bodies framed by length and by chunks, and the
rule every input obeys — requests, then at most one ``Refusal`` — however it is cut."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pynsqd.httpparse import (
    GO_BAD_REQUEST,
    GO_HEAD_TOO_LARGE,
    GO_INVALID_HEADER_NAME,
    GO_MALFORMED_HOST,
    GO_MISSING_HOST,
    GO_UNSUPPORTED_TE,
    GO_VERSION_NOT_SUPPORTED,
    HEAD_LIMIT,
    MAX_HEADER_FIELDS,
    Refusal,
    Request,
    RequestParser,
)

H = b"Host: x\r\n"

# (what a client sends, Go's answer: the raw bytes net/http writes before it closes)
REFUSED = [
    (b"GARBAGE\r\n\r\n", GO_BAD_REQUEST),
    (b"\r\nGET /ping HTTP/1.1\r\n" + H + b"\r\n", GO_BAD_REQUEST),  # an empty request line
    (b"GET /ping\r\n" + H + b"\r\n", GO_BAD_REQUEST),
    (b"GET  /ping HTTP/1.1\r\n" + H + b"\r\n", GO_BAD_REQUEST),
    (b"GET\t/ping HTTP/1.1\r\n" + H + b"\r\n", GO_BAD_REQUEST),
    (b"GET /ping HTTP/1.1 \r\n" + H + b"\r\n", GO_BAD_REQUEST),
    (b"GET /pi ng HTTP/1.1\r\n" + H + b"\r\n", GO_BAD_REQUEST),
    (b"G(T /ping HTTP/1.1\r\n" + H + b"\r\n", GO_BAD_REQUEST),
    (b"GET /ping http/1.1\r\n" + H + b"\r\n", GO_BAD_REQUEST),
    (b"GET /ping HTTP/1.10\r\n" + H + b"\r\n", GO_BAD_REQUEST),
    (b"GET /ping HTTP/x.y\r\n" + H + b"\r\n", GO_BAD_REQUEST),
    (b"GET /ping HTTP/1.1\rX\r\n" + H + b"\r\n", GO_BAD_REQUEST),
    (b"GET ping HTTP/1.1\r\n" + H + b"\r\n", GO_BAD_REQUEST),
    (b"GET :x HTTP/1.1\r\n" + H + b"\r\n", GO_BAD_REQUEST),
    (b"GET /pi%zzng HTTP/1.1\r\n" + H + b"\r\n", GO_BAD_REQUEST),
    (b"GET /pi\x01ng HTTP/1.1\r\n" + H + b"\r\n", GO_BAD_REQUEST),
    (b"GET http://h:x/ping HTTP/1.1\r\n" + H + b"\r\n", GO_BAD_REQUEST),
    (b"GET http://h{/ping HTTP/1.1\r\n" + H + b"\r\n", GO_BAD_REQUEST),
    (b"GET /ping HTTP/1.1\r\n Host: x\r\n\r\n", GO_BAD_REQUEST),  # the first field continues nothing
    (b"GET /ping HTTP/1.1\r\n" + H + b"Foo\r\n\r\n", GO_BAD_REQUEST),
    (b"GET /ping HTTP/1.1\r\n" + H + b": v\r\n\r\n", GO_BAD_REQUEST),
    (b"GET /ping HTTP/1.1\r\n" + H + b"Fo(o: b\r\n\r\n", GO_BAD_REQUEST),
    (b"GET /ping HTTP/1.1\r\n" + H + b"Foo\t: b\r\n\r\n", GO_BAD_REQUEST),
    (b"GET /ping HTTP/1.1\r\n" + H + b"Foo: a\x01b\r\n\r\n", GO_BAD_REQUEST),
    (b"GET /ping HTTP/1.1\r\n" + H + b"Foo: a\x7fb\r\n\r\n", GO_BAD_REQUEST),
    (b"GET /ping HTTP/1.1\r\n" + H + b"Foo: a\rb\r\n\r\n", GO_BAD_REQUEST),
    (b"GET /ping HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", GO_BAD_REQUEST),
    (b"POST /ping HTTP/1.1\r\n" + H + b"Content-Length: nope\r\n\r\n", GO_BAD_REQUEST),
    (b"POST /ping HTTP/1.1\r\n" + H + b"Content-Length: -1\r\n\r\n", GO_BAD_REQUEST),
    (b"POST /ping HTTP/1.1\r\n" + H + b"Content-Length: +1\r\n\r\nx", GO_BAD_REQUEST),
    (b"POST /ping HTTP/1.1\r\n" + H + b"Content-Length: 99999999999999999999\r\n\r\n", GO_BAD_REQUEST),
    (b"POST /ping HTTP/1.1\r\n" + H + b"Content-Length: 1\r\nContent-Length: 2\r\n\r\nxx", GO_BAD_REQUEST),
    (b"POST /ping HTTP/1.1\r\n" + H + b"Transfer-Encoding: gzip\r\n\r\n", GO_UNSUPPORTED_TE),
    (b"POST /ping HTTP/1.1\r\n" + H + b"Transfer-Encoding: gzip, chunked\r\n\r\n", GO_UNSUPPORTED_TE),
    (b"POST /ping HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
     GO_UNSUPPORTED_TE),
    (b"GET /ping HTTP/2.0\r\n" + H + b"\r\n", GO_VERSION_NOT_SUPPORTED),
    (b"GET /ping HTTP/0.9\r\n" + H + b"\r\n", GO_VERSION_NOT_SUPPORTED),
    (b"GET /ping HTTP/9.9\r\n\r\n", GO_VERSION_NOT_SUPPORTED),
    (b"PRI / HTTP/2.0\r\n\r\n", GO_VERSION_NOT_SUPPORTED),
    (b"GET /ping HTTP/2.0\r\nContent-Length: x\r\n\r\n", GO_BAD_REQUEST),  # the head is read first
    (b"GET /ping HTTP/1.1\r\n\r\n", GO_MISSING_HOST),
    (b"GET /ping HTTP/1.1\r\nHost: a b\r\n\r\n", GO_MALFORMED_HOST),
    (b"GET /ping HTTP/1.0\r\nHost: a\"b\r\n\r\n", GO_MALFORMED_HOST),
    (b"GET /ping HTTP/1.1\r\n" + H + b"Fo o: b\r\n\r\n", GO_INVALID_HEADER_NAME),
    (b"GET /ping HTTP/1.1\r\n" + H + b"Foo : b\r\n\r\n", GO_INVALID_HEADER_NAME),
    (b"GET /ping HTTP/1.1\r\nHost : x\r\n\r\n", GO_MISSING_HOST),  # a spaced name is no Host
]

# (what a client sends, the requests Go serves: method, target, version, body)
SERVED = [
    (b"GET /ping HTTP/1.1\r\n" + H + b"\r\n", [(b"GET", b"/ping", "1.1", b"")]),
    (b"GET /ping HTTP/1.2\r\n" + H + b"\r\n", [(b"GET", b"/ping", "1.2", b"")]),
    (b"GET /ping HTTP/1.9\r\n" + H + b"\r\n", [(b"GET", b"/ping", "1.9", b"")]),
    (b"GET /ping HTTP/1.0\r\n\r\n", [(b"GET", b"/ping", "1.0", b"")]),
    (b"FOO /ping HTTP/1.1\r\n" + H + b"\r\n", [(b"FOO", b"/ping", "1.1", b"")]),
    (b"get /ping HTTP/1.1\r\n" + H + b"\r\n", [(b"get", b"/ping", "1.1", b"")]),
    (b"GET /ping HTTP/1.1\nHost: x\n\n", [(b"GET", b"/ping", "1.1", b"")]),
    (b"GET /ping HTTP/1.1\r\n" + H + b"Foo: a\r\n b\r\n\r\n", [(b"GET", b"/ping", "1.1", b"")]),
    (b"GET /ping HTTP/1.1\r\n" + H + b"Foo: a\xffb\r\n\r\n", [(b"GET", b"/ping", "1.1", b"")]),
    (b"GET /pi\xffng HTTP/1.1\r\n" + H + b"\r\n", [(b"GET", b"/pi\xffng", "1.1", b"")]),
    (b"GET /ping?%zz HTTP/1.1\r\n" + H + b"\r\n", [(b"GET", b"/ping?%zz", "1.1", b"")]),
    (b"GET /ping#frag HTTP/1.1\r\n" + H + b"\r\n", [(b"GET", b"/ping#frag", "1.1", b"")]),
    (b"GET * HTTP/1.1\r\n" + H + b"\r\n", [(b"GET", b"*", "1.1", b"")]),
    (b"GET http://h HTTP/1.1\r\n" + H + b"\r\n", [(b"GET", b"http://h", "1.1", b"")]),
    (b"GET http://u:p@[::1]:80/p%41 HTTP/1.1\r\n" + H + b"\r\n", [(b"GET", b"http://u:p@[::1]:80/p%41", "1.1", b"")]),
    (b"CONNECT h:443 HTTP/1.1\r\n\r\n", [(b"CONNECT", b"h:443", "1.1", b"")]),
    (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", [(b"PRI", b"*", "2.0", b"")]),
    (b"GET /ping HTTP/1.1\r\nHost:\r\n\r\n", [(b"GET", b"/ping", "1.1", b"")]),
    (b"GET /ping HTTP/1.1\r\nHost: [::1]:80\r\n\r\n", [(b"GET", b"/ping", "1.1", b"")]),
    (b"POST /p HTTP/1.1\r\n" + H + b"Content-Length:  01 \r\n\r\nx", [(b"POST", b"/p", "1.1", b"x")]),
    (b"POST /p HTTP/1.1\r\n" + H + b"Content-Length:\r\n\r\n", [(b"POST", b"/p", "1.1", b"")]),
    (b"POST /p HTTP/1.1\r\n" + H + b"Content-Length: 1\r\nContent-Length: 1\r\n\r\nx", [(b"POST", b"/p", "1.1", b"x")]),
    (b"POST /p HTTP/1.1\r\n" + H + b"Transfer-Encoding: Chunked\r\nContent-Length: 5\r\n\r\n"
     b"2;ext=1\r\nab\r\n1 \t\r\nc\r\n0\r\nTrailer: t\r\n\r\n", [(b"POST", b"/p", "1.1", b"abc")]),
    (b"POST /p HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\nSpaced Name: x\r\n\r\n"
     b"GET /q HTTP/1.1\r\n" + H + b"\r\n", [(b"POST", b"/p", "1.1", b"a"), (b"GET", b"/q", "1.1", b"")]),
    (b"POST /p HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", [(b"POST", b"/p", "1.0", b"")]),  # 1.0: ignored
    (b"POST /p HTTP/1.1\r\n" + H + b"Content-Length: 1\r\n\r\nx\r\nGET /q HTTP/1.1\r\n" + H + b"\r\n",
     [(b"POST", b"/p", "1.1", b"x"), (b"GET", b"/q", "1.1", b"")]),  # CRLF after a POST is skipped
    (b"POST /p HTTP/1.1\r\n" + H + b"Expect:\r\nContent-Length: 1\r\n\r\nx", [(b"POST", b"/p", "1.1", b"x")]),
]


class Collect:
    """A parser's output: the requests, then the refusal, if any."""

    def __init__(self, limit: int = 1 << 20) -> None:
        self.limit = limit
        self.requests: list[Request] = []
        self.heads = 0
        self.refusal: Refusal | None = None
        self.parser = RequestParser(self.on_head, self.requests.append)

    def on_head(self, req: Request) -> bool:
        req.limit = self.limit
        self.heads += 1
        return True

    def feed(self, *pieces: bytes, eof: bool = False) -> Collect:
        try:
            for piece in pieces:
                self.parser.feed(piece)
            if eof:
                self.parser.feed_eof()
        except Refusal as exc:
            self.refusal = exc
        return self

    def served(self) -> list[tuple[bytes, bytes, str, bytes | None]]:
        return [(r.method, r.target, r.version, r.body) for r in self.requests]


def three_ways(data: bytes) -> list[Collect]:
    """Whole, one byte at a time, and whole with a pipelined request behind it."""
    return [Collect().feed(data), Collect().feed(*(data[i:i + 1] for i in range(len(data)))),
            Collect().feed(data + b"GET /next HTTP/1.1\r\nHost: x\r\n\r\n")]


@pytest.mark.parametrize(("data", "answer"), REFUSED)
def test_gos_answer_to_each_malformed_head(data: bytes, answer: bytes) -> None:
    for out in three_ways(data):
        assert out.refusal is not None and out.refusal.answer == answer, data
        assert not out.requests and not out.refusal.linger
        out.parser.feed(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        assert not out.requests  # a refused connection reads nothing more


@pytest.mark.parametrize(("data", "served"), SERVED)
def test_the_heads_go_serves(data: bytes, served: list[tuple[bytes, bytes, str, bytes]]) -> None:
    whole, bytewise, pipelined = three_ways(data)
    for out in (whole, bytewise):
        assert out.refusal is None and out.served() == served, data
    assert pipelined.served()[:len(served)] == served


def test_keep_alive_host_and_expect_as_go_reads_them() -> None:
    def one(data: bytes) -> Request:
        out = Collect().feed(data)
        assert out.refusal is None and len(out.requests) == 1
        return out.requests[0]
    assert one(b"GET / HTTP/1.1\r\n" + H + b"\r\n").keep_alive
    assert not one(b"GET / HTTP/1.1\r\n" + H + b"Connection: Upgrade, Close\r\n\r\n").keep_alive
    assert not one(b"GET / HTTP/1.0\r\n\r\n").keep_alive
    assert one(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").keep_alive
    assert not one(b"PRI * HTTP/2.0\r\n\r\n").keep_alive
    req = one(b"GET / HTTP/1.2\r\n" + H + b"\r\n")
    assert req.http11 and req.keep_alive
    assert not one(b"GET / HTTP/1.0\r\n\r\n").http11
    req = one(b"POST / HTTP/1.1\r\n" + H + b"Expect: 100-Continue\r\nContent-Length: 1\r\n\r\nx")
    assert req.expect_continue and not req.expect_failed
    assert not one(b"POST / HTTP/1.1\r\n" + H + b"Expect: 100-continue\r\nContent-Length: 0\r\n\r\n").expect_continue
    assert not one(b"POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\nx").expect_continue
    out = Collect().feed(b"POST / HTTP/1.1\r\n" + H + b"Expect: foo\r\nContent-Length: 1\r\n\r\nx")
    assert out.requests[0].expect_failed and not out.requests[0].keep_alive and out.parser.stopped
    assert one(b"GET / HTTP/1.1\r\n" + H + b"Foo: a\r\n  b \r\n\tc\r\n\r\n").header(b"foo") == b"a b c"


def test_a_head_is_bounded_by_gos_limit() -> None:
    def head(size: int) -> bytes:
        start = b"GET / HTTP/1.1\r\nHost: x\r\nX-Pad: "
        return start + b"a" * (size - len(start) - 4) + b"\r\n\r\n"
    assert Collect().feed(head(HEAD_LIMIT)).served() == [(b"GET", b"/", "1.1", b"")]
    for data in (head(HEAD_LIMIT + 1), b"GET /" + b"a" * HEAD_LIMIT,
                 b"GET / HTTP/1.1\r\n" + b"a:\r\n" * MAX_HEADER_FIELDS + H + b"\r\n"):
        for out in (Collect().feed(data), Collect().feed(*(data[i:i + 65536] for i in range(0, len(data), 65536)))):
            assert out.refusal is not None and out.refusal.answer == GO_HEAD_TOO_LARGE and out.refusal.linger
    out = Collect()
    out.feed(b"GET / HTTP/1.1\r\nX-Big: ")
    for _ in range(HEAD_LIMIT // 65536):
        out.feed(b"a" * 65536)
        assert out.refusal is None
    out.feed(b"a" * 65536)
    assert out.refusal is not None and out.refusal.answer == GO_HEAD_TOO_LARGE


def test_the_end_of_input() -> None:
    assert Collect().feed(b"", eof=True).refusal is None  # nothing sent: nothing to answer
    for partial in (b"GET /ping HT", b"GET /ping HTTP/1.1", b"GET /ping HTTP/1.1\r\nHost: x\r\n"):
        out = Collect().feed(partial, eof=True)
        assert out.refusal is not None and out.refusal.answer == GO_BAD_REQUEST
    out = Collect().feed(b"POST /p HTTP/1.1\r\n" + H + b"Content-Length: 10\r\n\r\nabc", eof=True)
    assert out.refusal is None and out.served() == [(b"POST", b"/p", "1.1", b"abc")]
    assert out.requests[0].broken and not out.requests[0].keep_alive


@pytest.mark.parametrize("body", [
    b"zz\r\nab\r\n0\r\n\r\n",  # a size that is no hex number
    b"2\r\nabX\r\n0\r\n\r\n",  # no CRLF after the data
    b"1" * 17 + b"\r\n",  # more than 16 digits
    b"2" + b" " * 5000 + b"\r\n",  # a size line past 4 KiB
    b"1;" + b"e" * 4000 + b"\r\nx\r\n" + (b"1;" + b"e" * 4000 + b"\r\nx\r\n") * 4,  # framing, little data
    b"0\r\nBad(: x\r\n\r\n",  # a trailer that is no field
])
def test_a_chunked_body_that_cannot_be_read_gives_a_broken_request(body: bytes) -> None:
    head = b"POST /p HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\n\r\n"
    out = Collect().feed(head + body + b"GET /next HTTP/1.1\r\n" + H + b"\r\n")
    assert out.refusal is None and len(out.requests) == 1, body[:40]
    assert out.requests[0].broken and out.parser.stopped


def test_a_body_past_its_limit_is_counted_not_kept() -> None:
    out = Collect(limit=3).feed(b"POST /p HTTP/1.1\r\n" + H + b"Content-Length: 5\r\n\r\nabcde"
                                + b"POST /p HTTP/1.1\r\n" + H + b"Content-Length: 2\r\n\r\nfg")
    assert [(r.size, r.body) for r in out.requests] == [(5, None), (2, b"fg")]


def test_on_head_may_decline_the_body() -> None:
    requests: list[Request] = []
    parser = RequestParser(lambda req: False, requests.append)
    parser.feed(b"POST /p HTTP/1.1\r\n" + H + b"Content-Length: 5\r\n\r\nabcdeGET / HTTP/1.1\r\n" + H + b"\r\n")
    assert [r.size for r in requests] == [0] and parser.stopped


_PIECES = st.one_of(
    st.sampled_from([
        b"GET /ping HTTP/1.1\r\n", b"POST /pub?topic=t HTTP/1.1\r\n", b"GET / HTTP/1.0\r\n", b"PRI * HTTP/2.0\r\n",
        b"Host: x\r\n", b"Content-Length: 3\r\n", b"Transfer-Encoding: chunked\r\n", b"Expect: 100-continue\r\n",
        b"Connection: close\r\n", b" folded\r\n", b"\r\n", b"\n", b"3\r\nabc\r\n", b"0\r\n\r\n", b"abc",
        b"Expect: x\r\n", b"X: \x00\r\n", b"GET /%zz HTTP/1.1\r\n", b"GET http://[::1]:8/ HTTP/1.1\r\n",
    ]),
    st.binary(max_size=30),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_PIECES, max_size=14).map(b"".join), st.lists(st.integers(0, 400), max_size=6), st.booleans())
def test_any_input_gives_requests_then_at_most_a_refusal_however_it_is_cut(
        data: bytes, cuts: list[int], eof: bool) -> None:
    whole = Collect().feed(data, eof=eof)
    points = sorted(c for c in cuts if c <= len(data))
    cut = Collect().feed(*(data[a:b] for a, b in zip([0, *points], [*points, len(data)])), eof=eof)
    assert cut.served() == whole.served()
    assert (cut.refusal and cut.refusal.answer) == (whole.refusal and whole.refusal.answer)
    if whole.refusal is not None:
        assert whole.refusal.answer.startswith(b"HTTP/1.1 4") or whole.refusal.answer.startswith(b"HTTP/1.1 50")
