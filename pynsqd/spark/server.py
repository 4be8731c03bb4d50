"""How executors get a batch's parts: the driver-side runner serves them over TCP.

Theory of operation
-------------------
The runner keeps every part of every uncommitted batch in memory anyway (its frames are the
received bytes, held until the batch's FIN), so it serves them itself: a ``PartServer``
listens on ``driverPort`` (0: any free port) on all interfaces, and each input partition
carries the address executors reach it on (``driverHost``) and the part's key. An executor's
``read`` connects, sends ``GET <key>\\n`` and receives ``+`` or ``-``, an 8-byte big-endian
length and that many bytes: the part, or an error message. Nothing is written to disk and
nothing needs storage shared by the driver and the executors, so a cluster needs only what
Spark itself needs: executors able to connect to the driver's host.

Keys are ``<runner token>/<seq>-<part>``, the token 128 random bits made when the runner
starts: a part is served only to a task holding its partition (the server listens on all
interfaces), and a restarted runner never serves a key of its predecessor's (a replayed batch
is planned with no parts; nsqd redelivers its messages). A part stays served until its batch
is committed, so a task that Spark retries — on another executor after one died — fetches it
again. Each connection is served by its own thread (``socketserver``), which sends the frames
straight from the received buffers.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import socketserver
import struct
import threading
from collections.abc import Sequence

REPLY = struct.Struct(">cQ")  # b"+" (a part follows) or b"-" (an error message follows), then its length
MAX_KEY = 256
CONNECT_TIMEOUT = 30.0
READ_TIMEOUT = 120.0


class FetchError(Exception):
    """An executor could not get a part from the runner."""


def default_host() -> str:
    """The address executors reach this host on, chosen as Spark chooses ``spark.driver.host``:
    ``SPARK_LOCAL_IP``, else this host's name if it resolves to a non-loopback address, else
    the address of the interface with the default route (no packet is sent), else loopback."""
    local = os.environ.get("SPARK_LOCAL_IP")
    if local:
        return local
    with contextlib.suppress(OSError):
        address = socket.gethostbyname(socket.gethostname())
        if not address.startswith("127."):
            return address
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # TEST-NET-1: only a route lookup, nothing is sent
        return str(probe.getsockname()[0])
    return "127.0.0.1"


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        line = self.rfile.readline(MAX_KEY + 8)
        if not line.startswith(b"GET ") or not line.endswith(b"\n"):
            self._error(b"bad request")
            return
        key = line[4:-1].decode(errors="replace")
        buffers = self.server.parts.get(key)
        if buffers is None:
            self._error(f"no part {key}: its batch was committed, or the runner serving it restarted".encode())
            return
        self.wfile.write(REPLY.pack(b"+", sum(len(b) for b in buffers)))
        for buffer in buffers:
            self.wfile.write(buffer)

    def _error(self, message: bytes) -> None:
        self.wfile.write(REPLY.pack(b"-", len(message)) + message)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    parts: dict[str, Sequence[bytes | memoryview]]


class PartServer:
    """The runner's side: ``add`` a batch's parts, ``drop`` them once the batch is committed."""

    def __init__(self, host: str, port: int = 0) -> None:
        self._server = _Server(("", port), _Handler, bind_and_activate=True)
        self._server.parts = {}  # written by the runner thread, read by handler threads (single dict ops)
        self.address = f"{host or default_host()}:{self._server.server_address[1]}"
        self._token = secrets.token_hex(16)
        self._thread = threading.Thread(target=self._server.serve_forever, name="pynsqd-spark-parts", daemon=True)
        self._thread.start()

    def key(self, name: str) -> str:
        return f"{self._token}/{name}"

    def add(self, key: str, buffers: Sequence[bytes | memoryview]) -> None:
        self._server.parts[key] = buffers

    def drop(self, key: str) -> None:
        self._server.parts.pop(key, None)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def fetch(address: str, key: str) -> bytearray:
    """The part ``key`` from the runner at ``address`` (executor side)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT) as sock:
            sock.settimeout(READ_TIMEOUT)
            sock.sendall(b"GET " + key.encode() + b"\n")
            status, length = REPLY.unpack(_exactly(sock, bytearray(REPLY.size)))
            data = _exactly(sock, bytearray(length))
    except OSError as exc:
        raise FetchError(f"cannot get batch part {key} from the nsq source's runner at {address}: {exc} "
                         "(executors must reach the driver's host: set the source's driverHost/driverPort)") from None
    if status != b"+":
        raise FetchError(f"the nsq source's runner at {address}: {data.decode(errors='replace')}")
    return data


def _exactly(sock: socket.socket, buffer: bytearray) -> bytearray:
    view = memoryview(buffer)
    got = 0
    while got < len(buffer):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError(f"connection closed after {got} of {len(buffer)} bytes")
        got += n
    return buffer
