"""Every HTTP listener (nsqd's shards, nsqlookupd, nsqadmin; HTTPS too) reads requests as Go's
net/http does and refuses what it refuses with its bytes: 431 past 1 MiB (+ Go's 4 KiB of
slack) of request line and headers or past ``MAX_HEADER_FIELDS`` header fields, 505 for a
major version other than 1, 400 (with Go's reason where Go gives one) for a malformed request
line or field, 501 for a transfer coding other than chunked, 417 for an unknown expectation;
HTTP/1.2 is served as 1.1 and any token is a method. Reading an oversize head does not hold
it in memory. Raw sockets, real daemons."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import psutil
import pytest

from pynsqd.httpparse import (
    GO_BAD_REQUEST,
    GO_INVALID_HEADER_NAME,
    GO_MALFORMED_HOST,
    GO_MISSING_HOST,
    GO_UNSUPPORTED_TE,
    HEAD_LIMIT,
    MAX_HEADER_FIELDS,
)
from pynsqd.httpparse import GO_HEAD_TOO_LARGE as HEAD_TOO_LARGE
from pynsqd.httpparse import GO_VERSION_NOT_SUPPORTED as VERSION_NOT_SUPPORTED
from testbed.certs import Certs
from testbed.harness import Daemon, remove_segments, scaled, wait_for
from tests.support.lookupd_helpers import BASE_ARGS

pytestmark = pytest.mark.fast

DAEMONS = ("nsqd", "nsqlookupd", "nsqadmin")


@pytest.fixture(scope="module")
def daemons(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Daemon]]:
    data = Path(tmp_path_factory.mktemp("limits"))
    started: list[Daemon] = []
    try:
        nsqd = Daemon("pynsqd.supervisor", ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                                            f"--data-path={data}", "--shards=2"])
        started.append(nsqd.start())
        lookupd = Daemon("pynsqd.lookupd", BASE_ARGS)
        started.append(lookupd.start())
        host, port = lookupd.http
        admin = Daemon("pynsqd.admin", ["--http-address=127.0.0.1:0", f"--lookupd-http-address={host}:{port}"],
                       listeners=("HTTP",))
        started.append(admin.start())
        yield {"nsqd": nsqd, "nsqlookupd": lookupd, "nsqadmin": admin}
    finally:
        for daemon in started:
            daemon.stop()
        remove_segments(started[:1])


def exchange(address: tuple[str, int], request: bytes | Iterable[bytes], half_close: bool = False) -> bytes:
    """Send ``request`` (from a thread, until the server stops taking it; then the end of
    input with ``half_close``) and read everything the server answers until it closes."""
    chunks = [request] if isinstance(request, bytes) else request
    with socket.create_connection(address, timeout=scaled(20)) as sock:
        def send() -> None:
            try:
                for chunk in chunks:
                    sock.sendall(chunk)
                if half_close:
                    sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass  # the server answered and closed: it reads no more
        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        out = b""
        try:
            while data := sock.recv(65536):
                out += data
        except ConnectionResetError:
            pass  # closed with bytes unread, as Go closes
        with contextlib.suppress(OSError):  # (not connected after a reset)
            sock.shutdown(socket.SHUT_RDWR)
        sender.join(scaled(20))
        assert not sender.is_alive()
    return out


def ping(size: int, extra: bytes = b"") -> bytes:
    """A ``GET /ping`` head of exactly ``size`` bytes (padded by one header line)."""
    head = b"GET /ping HTTP/1.1\r\nHost: x\r\n" + extra + b"X-Pad: "
    return head + b"a" * (size - len(head) - 4) + b"\r\n\r\n"


def status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


@pytest.mark.parametrize("name", DAEMONS)
def test_a_head_up_to_gos_limit_is_served_one_byte_more_is_431(daemons: dict[str, Daemon], name: str) -> None:
    daemon = daemons[name]
    answer = exchange(daemon.http, ping(HEAD_LIMIT, b"Connection: close\r\n"))
    assert status(answer) == 200 and answer.endswith(b"OK")
    assert exchange(daemon.http, ping(HEAD_LIMIT + 1)) == HEAD_TOO_LARGE


@pytest.mark.parametrize("name", DAEMONS)
def test_long_header_many_headers_and_long_uri_are_431(daemons: dict[str, Daemon], name: str) -> None:
    daemon = daemons[name]
    assert exchange(daemon.http, ping(2 << 20)) == HEAD_TOO_LARGE  # one 2 MiB header line
    lines = b"GET /ping HTTP/1.1\r\nHost: x\r\n" + b"X-A: b\r\n" * 200_000 + b"\r\n"
    assert exchange(daemon.http, lines) == HEAD_TOO_LARGE
    uri = b"GET /ping?x=" + b"a" * (2 << 20) + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    assert exchange(daemon.http, uri) == HEAD_TOO_LARGE  # Go's answer to a long URI too
    few = b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + b"a:\r\n" * 1000 + b"\r\n"
    assert status(exchange(daemon.http, few)) == 200
    tiny = b"GET /ping HTTP/1.1\r\nHost: x\r\n" + b"a:\r\n" * MAX_HEADER_FIELDS + b"\r\n"
    assert exchange(daemon.http, tiny) == HEAD_TOO_LARGE


@pytest.mark.parametrize("name", DAEMONS)
def test_http_versions_other_than_1_x_are_505(daemons: dict[str, Daemon], name: str) -> None:
    daemon = daemons[name]
    for version in (b"HTTP/9.9", b"HTTP/2.0", b"HTTP/0.9"):
        request = b"GET /ping " + version + b"\r\nHost: x\r\n\r\n"
        assert exchange(daemon.http, request) == VERSION_NOT_SUPPORTED, version
    ok = exchange(daemon.http, b"GET /ping HTTP/1.0\r\n\r\n")
    assert status(ok) == 200


# (a request, the bytes Go's net/http answers it with before it closes the connection)
GO_REFUSALS = [
    (b"GARBAGE\r\n\r\n", GO_BAD_REQUEST),
    (b"GET /ping\r\nHost: x\r\n\r\n", GO_BAD_REQUEST),
    (b"GET  /ping HTTP/1.1\r\nHost: x\r\n\r\n", GO_BAD_REQUEST),
    (b"G(T /ping HTTP/1.1\r\nHost: x\r\n\r\n", GO_BAD_REQUEST),
    (b"GET ping HTTP/1.1\r\nHost: x\r\n\r\n", GO_BAD_REQUEST),
    (b"GET /pi%zzng HTTP/1.1\r\nHost: x\r\n\r\n", GO_BAD_REQUEST),
    (b"GET /ping HTTP/1.10\r\nHost: x\r\n\r\n", GO_BAD_REQUEST),
    (b"GET /ping HTTP/1.1\r\n Host: x\r\n\r\n", GO_BAD_REQUEST),
    (b"GET /ping HTTP/1.1\r\nHost: x\r\nFoo\r\n\r\n", GO_BAD_REQUEST),
    (b"GET /ping HTTP/1.1\r\nHost: x\r\nFo(o: b\r\n\r\n", GO_BAD_REQUEST),
    (b"GET /ping HTTP/1.1\r\nHost: x\r\nFoo: a\x01b\r\n\r\n", GO_BAD_REQUEST),
    (b"GET /ping HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", GO_BAD_REQUEST),
    (b"POST /ping HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n", GO_BAD_REQUEST),
    (b"POST /ping HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxx", GO_BAD_REQUEST),
    (b"POST /ping HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", GO_UNSUPPORTED_TE),
    (b"GET /ping HTTP/1.1\r\n\r\n", GO_MISSING_HOST),
    (b"GET /ping HTTP/1.1\r\nHost: a b\r\n\r\n", GO_MALFORMED_HOST),
    (b"GET /ping HTTP/1.1\r\nHost: x\r\nFoo : b\r\n\r\n", GO_INVALID_HEADER_NAME),
    (b"GET /ping HTTP/2.0\r\nHost: x\r\nContent-Length: x\r\n\r\n", GO_BAD_REQUEST),  # the head first
]


@pytest.mark.parametrize("name", DAEMONS)
def test_malformed_requests_get_gos_answers_byte_for_byte_and_a_close(daemons: dict[str, Daemon],
                                                                      name: str) -> None:
    daemon = daemons[name]
    for request, answer in GO_REFUSALS:
        assert exchange(daemon.http, request) == answer, request
        # after the requests before it were answered, in order
        served = exchange(daemon.http, b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n" + request)
        assert served.startswith(b"HTTP/1.1 200 OK\r\n") and served.endswith(b"\r\n\r\nOK" + answer), request
    # a head cut short by the end of input
    assert exchange(daemon.http, b"GET /ping HTTP/1.1\r\nHost: x\r\n", half_close=True) == GO_BAD_REQUEST


@pytest.mark.parametrize("name", DAEMONS)
def test_what_go_serves_is_served(daemons: dict[str, Daemon], name: str) -> None:
    """HTTP/1.2 to 1.9 as HTTP/1.1; a method of any token reaches the routes (405); an
    unknown expectation is Go's 417; an HTTP/1.0 request is answered in HTTP/1.0."""
    daemon = daemons[name]
    for version in (b"HTTP/1.2", b"HTTP/1.9"):
        answer = exchange(daemon.http, b"GET /ping " + version + b"\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b"\r\n\r\nOK"), version
    answer = exchange(daemon.http, b"FOO /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 405 Method Not Allowed\r\n")
    assert answer.endswith(b'{"message":"METHOD_NOT_ALLOWED"}')
    for version in (b"1.1", b"1.0"):
        answer = exchange(daemon.http, b"POST /ping HTTP/" + version + b"\r\nHost: x\r\nExpect: foo\r\n"
                          b"Content-Length: 1\r\n\r\nx")
        head, _, rest = answer.partition(b"\r\nDate: ")
        assert head == b"HTTP/" + version + b" 417 Expectation Failed\r\nConnection: close", answer
        assert rest.endswith(b" GMT\r\nContent-Length: 0\r\n\r\n"), answer
    answer = exchange(daemon.http, b"GET /ping HTTP/1.0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.0 200 OK\r\n") and b"onnection" not in answer


@pytest.mark.parametrize("name", DAEMONS)
def test_requests_before_a_refused_head_are_answered_first(daemons: dict[str, Daemon], name: str) -> None:
    daemon = daemons[name]
    answer = exchange(daemon.http, b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n" * 2 + ping(2 << 20))
    first, second, rest = answer.split(b"HTTP/1.1 ", 3)[1:]
    assert first.startswith(b"200 OK") and second.startswith(b"200 OK")
    assert b"HTTP/1.1 " + rest == HEAD_TOO_LARGE


def _peaks(daemon: Daemon) -> dict[int, int]:
    """Each process's peak resident memory (VmHWM, bytes), the daemon's and its children's."""
    out = {}
    root = psutil.Process(daemon.pid)
    for proc in [root, *root.children(recursive=True)]:
        with open(f"/proc/{proc.pid}/status") as status_file:
            for line in status_file:
                if line.startswith("VmHWM:"):
                    out[proc.pid] = int(line.split()[1]) * 1024
    return out


@pytest.mark.parametrize("name", DAEMONS)
def test_an_endless_header_is_not_held_in_memory(daemons: dict[str, Daemon], name: str) -> None:
    daemon = daemons[name]
    before = _peaks(daemon)

    def endless() -> Iterator[bytes]:
        yield b"GET /ping HTTP/1.1\r\nHost: x\r\nX-Big: "
        for _ in range(32):
            yield b"a" * (1 << 20)  # 32 MiB of one header line, if the server kept reading
        yield b"\r\n\r\n"
    assert exchange(daemon.http, endless()) == HEAD_TOO_LARGE
    after = _peaks(daemon)
    grown = {pid: after[pid] - before[pid] for pid in before if pid in after}
    assert max(grown.values()) < 8 << 20, grown


def test_https_heads_are_bounded_too(nsqd_factory: Callable[..., Daemon], certs: Certs) -> None:
    nsqd = nsqd_factory(*certs.server_args())
    address = wait_for(lambda: nsqd.addresses.get("HTTPS"), what="the HTTPS listener")
    with socket.create_connection(address, timeout=scaled(20)) as raw, \
            certs.client_context().wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        with contextlib.suppress(OSError):
            tls.sendall(ping(2 << 20))
        out = b""
        with contextlib.suppress(OSError):
            while data := tls.recv(65536):
                out += data
    assert out == HEAD_TOO_LARGE
