"""The head of every HTTP request is bounded on every listener (nsqd's shards, nsqlookupd,
nsqadmin), with Go's answers (HTTPS too): 431 past 1 MiB (+ Go's 4 KiB of slack) of request line and
headers or past ``MAX_HEADER_FIELDS`` header fields, 505 for an HTTP version other than
1.x; and reading an oversize head does not hold it in memory. Raw sockets, real daemons."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import psutil
import pytest

from pynsqd.httpkit import HEAD_LIMIT, HEAD_TOO_LARGE, MAX_HEADER_FIELDS, VERSION_NOT_SUPPORTED
from tests.certs import Certs
from tests.harness import Daemon, remove_segments, scaled, wait_for
from tests.lookupd_helpers import BASE_ARGS

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


def exchange(address: tuple[str, int], request: bytes | Iterable[bytes]) -> bytes:
    """Send ``request`` (from a thread, until the server stops taking it) and read everything
    the server answers until it closes."""
    chunks = [request] if isinstance(request, bytes) else request
    with socket.create_connection(address, timeout=scaled(20)) as sock:
        def send() -> None:
            try:
                for chunk in chunks:
                    sock.sendall(chunk)
            except OSError:
                pass  # the server answered and closed: it reads no more
        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        out = b""
        try:
            while data := sock.recv(65536):
                out += data
        except ConnectionResetError:
            pass
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
