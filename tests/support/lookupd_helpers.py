"""Helpers for the nsqlookupd integration tests: a real daemon, and a raw V1 producer."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from pynsqd.wire.lookup import (
    MAGIC,
    IdentifyInfo,
    ResponseReader,
    decode_identify_response,
    encode_identify,
)
from testbed.harness import Daemon, connect, scaled

BASE_ARGS = ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
             "--broadcast-address=127.0.0.1", "--log-level=debug"]
# What NSQ's nsqlookupd_test.go identifies as.
PRODUCER = IdentifyInfo(broadcast_address="ip.address", tcp_port=5000, http_port=5555,
                        version="fake-version", hostname="ip.address")


def ms(seconds: float) -> str:
    """A duration flag value for ``seconds`` stretched by the test timeout scale."""
    return f"{round(scaled(seconds) * 1000)}ms"


@contextmanager
def lookupd(*args: str) -> Iterator[Daemon]:
    """A started nsqlookupd on free ports; stopped (TERM, then KILL) on exit."""
    daemon = Daemon("pynsqd.lookupd", [*BASE_ARGS, *args])
    try:
        yield daemon.start()
    finally:
        stop(daemon)


def stop(daemon: Daemon) -> int | None:
    """``Daemon.stop`` (TERM, then KILL); returns the exit status."""
    return daemon.stop()


def http(daemon: Daemon) -> httpx.Client:
    return httpx.Client(base_url=daemon.http_url, timeout=scaled(5))


class Producer:
    """A raw lookupd V1 connection, as nsqd would hold one."""

    def __init__(self, daemon: Daemon, magic: bytes = MAGIC) -> None:
        self.sock = connect(daemon.tcp)
        self.reader = ResponseReader()
        self.ready: list[bytes] = []
        if magic:
            self.sock.sendall(magic)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read(self) -> bytes:
        """The next reply ([4B size][data] → data)."""
        while not self.ready:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("lookupd closed the connection")
            self.ready += self.reader.feed(chunk)
        return self.ready.pop(0)

    def command(self, data: bytes) -> bytes:
        self.send(data)
        return self.read()

    def identify(self, info: IdentifyInfo = PRODUCER) -> dict[str, Any]:
        return decode_identify_response(self.command(encode_identify(info)))

    def is_closed_by_peer(self) -> bool:
        """True when the server has closed (EOF or reset) with nothing more to read."""
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def shut_write(p: Producer) -> None:
    p.sock.shutdown(socket.SHUT_WR)
