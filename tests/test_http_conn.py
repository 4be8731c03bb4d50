"""The HTTP connection protocol (``httpconn.py``) of an nsqd shard on the wire, over raw sockets:
pipelining, keep-alive and ``Connection: close``, ``Expect: 100-continue``, bad requests, the
``/pub`` requests of one loop turn stored as one batch."""

from __future__ import annotations

import json
import socket
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pynsqd.httpparse import GO_BAD_REQUEST
from testbed.harness import Daemon, scaled, wait_for

pytestmark = pytest.mark.fast


@pytest.fixture
def conn(nsqd: Daemon) -> Iterator[socket.socket]:
    with socket.create_connection(nsqd.http, timeout=scaled(10)) as sock:
        yield sock


def pub(topic: str, body: bytes, extra: bytes = b"") -> bytes:
    return b"POST /pub?topic=%s HTTP/1.1\r\nHost: x\r\n%sContent-Length: %d\r\n\r\n%s" % (
        topic.encode(), extra, len(body), body)


class Reader:
    """Answers read off one connection, in order."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self.lines: list[bytes] = []  # the last answer's status line and fields
        self.headers: dict[bytes, bytes] = {}

    def _fill(self) -> bool:
        data = self.sock.recv(65536)
        self.buf += data
        return bool(data)

    def answer(self) -> tuple[int, dict[bytes, bytes], bytes]:
        while b"\r\n\r\n" not in self.buf:
            assert self._fill(), "connection closed before an answer"
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        lines = self.lines = head.split(b"\r\n")
        headers = self.headers = {k.lower(): v for k, _, v in (line.partition(b": ") for line in lines[1:])}
        length = int(headers.get(b"content-length", b"0"))
        while len(self.buf) < length:
            assert self._fill(), "connection closed inside a body"
        body, self.buf = self.buf[:length], self.buf[length:]
        return int(lines[0].split()[1]), headers, body

    def closed(self) -> bool:
        return not self.buf and not self._fill()


def test_pipelined_publishes_and_admin_calls_answer_in_order(nsqd: Daemon, conn: socket.socket) -> None:
    conn.sendall(pub("pipe", b"one") + b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n" + pub("pipe", b"")
                 + pub("pipe", b"two") + b"GET /stats?format=json&topic=pipe HTTP/1.1\r\nHost: x\r\n\r\n")
    r = Reader(conn)
    status, headers, body = r.answer()
    assert (status, body) == (200, b"OK")
    assert headers[b"content-type"] == b"text/plain; charset=utf-8"
    assert headers[b"x-nsq-content-type"] == b"nsq; version=1.0"
    assert b"date" in headers
    assert r.answer()[::2] == (200, b"OK")  # /ping
    status, headers, body = r.answer()
    assert (status, json.loads(body)) == (400, {"message": "MSG_EMPTY"})
    assert headers[b"content-type"] == b"application/json; charset=utf-8"
    assert r.answer()[::2] == (200, b"OK")
    status, _, body = r.answer()
    assert status == 200 and json.loads(body)["topics"][0]["message_count"] == 2


def test_connection_close_and_http_1_0_close_after_the_answer(nsqd: Daemon) -> None:
    for request in (pub("closing", b"x", b"Connection: close\r\n"),
                    b"GET /info HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"):
        with socket.create_connection(nsqd.http, timeout=scaled(10)) as sock:
            sock.sendall(request)
            r = Reader(sock)
            status, headers, _ = r.answer()
            assert (status, headers[b"connection"]) == (200, b"close")
            assert r.closed()
    # HTTP/1.0 is answered in HTTP/1.0, as Go does: closed without a Connection field unless
    # the request asked to be kept alive
    for request in (b"POST /pub?topic=closing HTTP/1.0\r\nContent-Length: 1\r\n\r\nx",
                    b"GET /ping HTTP/1.0\r\n\r\n"):
        with socket.create_connection(nsqd.http, timeout=scaled(10)) as sock:
            sock.sendall(request)
            r = Reader(sock)
            assert r.answer()[0] == 200
            assert r.closed()
            assert r.lines[0] == b"HTTP/1.0 200 OK" and b"connection" not in r.headers
    with socket.create_connection(nsqd.http, timeout=scaled(10)) as sock:
        r = Reader(sock)
        for _ in range(2):
            sock.sendall(b"POST /pub?topic=closing HTTP/1.0\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\nx")
            status, headers, body = r.answer()
            assert (r.lines[0], headers[b"connection"], body) == (b"HTTP/1.0 200 OK", b"keep-alive", b"OK")


def test_expect_100_continue(nsqd: Daemon, conn: socket.socket) -> None:
    r = Reader(conn)
    conn.sendall(b"POST /pub?topic=cont HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
    assert r.answer()[0] == 100
    conn.sendall(b"hello")
    assert r.answer()[::2] == (200, b"OK")
    # over --max-msg-size: refused before the body is sent, and the connection closed
    conn.sendall(b"POST /pub?topic=cont HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                 b"Content-Length: 10000000\r\n\r\n")
    status, _, body = r.answer()
    assert (status, json.loads(body)) == (413, {"message": "MSG_TOO_BIG"})
    assert r.closed()


def test_a_malformed_request_gets_gos_400_and_a_close(nsqd: Daemon, conn: socket.socket) -> None:
    conn.sendall(b"POST /pub?topic=bad HTTP/1.1\r\nContent-Length: nope\r\n\r\n")
    r = Reader(conn)
    while r._fill():
        pass
    assert r.buf == GO_BAD_REQUEST


def test_a_too_big_body_without_expect_is_read_and_refused_keeping_the_connection(
        nsqd: Daemon, conn: socket.socket) -> None:
    conn.sendall(pub("big", b"x" * (1024 * 1024 + 1)) + pub("big", b"fits"))
    r = Reader(conn)
    status, _, body = r.answer()
    assert (status, json.loads(body)) == (413, {"message": "MSG_TOO_BIG"})
    assert r.answer()[::2] == (200, b"OK")


def test_head_has_no_body(nsqd: Daemon, conn: socket.socket) -> None:
    conn.sendall(b"HEAD /ping HTTP/1.1\r\nHost: x\r\n\r\n" + b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
    r = Reader(conn)
    while b"\r\n\r\n" not in r.buf:
        assert r._fill()
    head, _, r.buf = r.buf.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK")
    assert r.answer()[::2] == (200, b"OK")  # the HEAD answer had no body before this one


def test_pubs_read_in_one_loop_turn_are_stored_as_one_batch(nsqd_factory: Callable[..., Daemon]) -> None:
    """Keep-alive ``/pub`` connections, one request in flight each: the requests a shard
    reads in one loop turn are stored as one batch per topic (the node's counters), each
    answered ``OK`` once stored, every message once."""
    nsqd = nsqd_factory("--shards=2")
    socks = [socket.create_connection(nsqd.http, timeout=scaled(10)) for _ in range(16)]
    readers = [Reader(sock) for sock in socks]
    sent = 0

    def stats() -> Any:
        with urllib.request.urlopen(nsqd.http_url + "/stats?format=json&topic=grouped&include_shards=true",
                                    timeout=scaled(10)) as resp:
            return json.load(resp)

    def a_round_was_grouped() -> bool:
        nonlocal sent
        for sock in socks:
            sock.sendall(pub("grouped", b"%d" % sent))
            sent += 1
        for r in readers:
            assert r.answer()[::2] == (200, b"OK")
        sup = stats()["supervisor"]
        return bool(sup["http_pub_batches"] < sup["http_pubs"])

    try:
        wait_for(a_round_was_grouped, 30, interval=0, what="two /pub requests in one batch")
        doc = stats()
        assert doc["supervisor"]["http_pubs"] == sent == doc["topics"][0]["message_count"]
    finally:
        for sock in socks:
            sock.close()


PUBLISHES = [  # (request line target, body, status, answer body)
    (b"/pub?topic=plain", b"x", 200, b"OK"),
    (b"/pub?topic=plain&defer=10", b"x", 200, b"OK"),
    (b"/mpub?topic=plain", b"a\nb\n", 200, b"OK"),
    (b"/mpub?topic=plain&binary=true", b"\x00\x00\x00\x01\x00\x00\x00\x01z", 200, b"OK"),
    (b"/mpub?topic=plain&binary=true", b"\x00\x00\x00\x02\x00\x00\x00\x01z", 413, b'{"message":"BAD_MESSAGE"}'),
    (b"/pub", b"x", 400, b'{"message":"MISSING_ARG_TOPIC"}'),
    (b"/pub?topic=bad!", b"x", 400, b'{"message":"INVALID_TOPIC"}'),
    (b"/pub?topic=plain", b"", 400, b'{"message":"MSG_EMPTY"}'),
    (b"/pub?topic=plain&defer=x", b"x", 400, b'{"message":"INVALID_DEFER"}'),
    (b"/pub?topic=plain&a=%zz", b"x", 400, b'{"message":"INVALID_REQUEST"}'),
]


@pytest.mark.parametrize(("target", "body", "status", "answer"), PUBLISHES)
def test_a_plain_publish_is_answered_as_the_parsed_one(nsqd: Daemon, target: bytes, body: bytes, status: int,
                                                        answer: bytes) -> None:
    """A read holding exactly one plain publish skips the parser; with ``Connection:
    keep-alive`` (or pipelined behind another) the same request is parsed. Both get nsqd's
    answer, byte for byte but the date."""
    plain = b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (target, len(body), body)
    parsed = b"POST %s HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\nContent-Length: %d\r\n\r\n%s" % (
        target, len(body), body)
    answers = []
    for request in (plain, parsed, plain + plain):
        with socket.create_connection(nsqd.http, timeout=scaled(10)) as sock:
            r = Reader(sock)
            sock.sendall(request)
            for _ in range(request.count(b"POST ")):
                got_status, headers, got = r.answer()
                headers.pop(b"date")
                answers.append((got_status, headers, got))
    assert answers[0][::2] == (status, answer)
    assert answers[0][1] == {b"content-type": b"text/plain; charset=utf-8" if status == 200
                             else b"application/json; charset=utf-8",
                             b"content-length": b"%d" % len(answer), b"x-nsq-content-type": b"nsq; version=1.0"}
    assert answers == [answers[0]] * 4
