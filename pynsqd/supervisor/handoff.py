"""The supervisor's side of a new TCP connection: read up to the first routing command.

Theory of operation
-------------------
``greet`` owns an accepted socket until it knows which shard should serve it. It reads the
magic and then whole commands (the sans-IO ``Greeting`` frames the lines and IDENTIFY's
sized body itself and checks no more than it needs to route; ``identify.negotiate`` settles
the IDENTIFY), answering IDENTIFY itself and skipping NOP, until:

- a ``SUB``/``PUB``/``MPUB``/``DPUB`` line arrives: the owner of its topic gets the socket;
- IDENTIFY asks for TLS, snappy or deflate: the supervisor cannot follow the stream past
  that, so the IDENTIFY itself (unanswered) goes to a shard, which finishes the negotiation
  and relays to the owner later if need be (``shard/relay.py``);
- anything else (bad magic, a routing command without a valid topic, an IDENTIFY that does
  not negotiate, AUTH, RDY before SUB, an oversize line, NOP under ``--tls-required``) or
  ``IDLE_HANDOFF`` of silence: a shard (round robin) gets it and does what nsqd does —
  answers the error, sends heartbeats, applies deadlines — so the supervisor never has to.

The hand-off carries the state (magic seen, negotiated settings, remote address) and the
*unread* bytes: everything from the start of the command that decided. Nothing is answered
twice and nothing is lost; the supervisor only ever writes IDENTIFY responses, each fully
written (``sock_sendall``) before the socket moves on, so the order on the wire holds.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from pynsqd.node.config import NsqdOptions
from pynsqd.node.identify import Settings, negotiate
from pynsqd.node.messages import ConnectionState
from pynsqd.wire import MAGIC_V2
from pynsqd.wire.commands import DEFAULT_MAX_LINE
from pynsqd.wire.errors import ProtocolError
from pynsqd.wire.frames import encode_response
from pynsqd.wire.names import is_valid_name

IDLE_HANDOFF = 0.25  # seconds of silence before a shard takes the connection as it is
READ_SIZE = 65536
_ROUTING = frozenset({b"SUB", b"PUB", b"MPUB", b"DPUB"})
_UPGRADES = ("tls_v1", "snappy", "deflate")
_SIZE = struct.Struct(">i")

# handoff(shard or None for "any", socket, state, unread bytes)
HandOff = Callable[[int | None, socket.socket, ConnectionState, bytes], Awaitable[None]]


def wants_upgrade(body: bytes) -> bool:
    """True when an IDENTIFY body asks for something only a shard can carry on with."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    return isinstance(data, dict) and any(data.get(key) is True for key in _UPGRADES)


class Greeting:
    """What has been read from one connection so far (sans-IO: ``step`` decides)."""

    def __init__(self, opts: NsqdOptions, remote: tuple[Any, ...]) -> None:
        self.opts = opts
        self.remote = f"{remote[0]}:{remote[1]}" if len(remote) >= 2 else "unix"
        self.settings: Settings | None = None
        self.magic = False
        self.buf = b""

    def state(self) -> ConnectionState:
        return ConnectionState(magic=self.magic, remote=self.remote, settings=self.settings)

    def step(self) -> tuple[str, Any]:
        """One decision on the buffered bytes: ``("need", None)`` more bytes;
        ``("reply", frame)`` write it and call again; ``("route", topic)`` hand to the
        topic's owner; ``("any", None)`` hand to any shard."""
        if not self.magic:
            if len(self.buf) < 4:
                return "need", None
            if self.buf[:4] != MAGIC_V2:
                return "any", None
            self.magic = True
            self.buf = self.buf[4:]
        while True:
            nl = self.buf.find(b"\n", 0, DEFAULT_MAX_LINE)
            if nl < 0:
                return ("any", None) if len(self.buf) >= DEFAULT_MAX_LINE else ("need", None)
            line = self.buf[:nl].rstrip(b"\r")
            params = line.split(b" ")
            name = params[0]
            if name in _ROUTING:
                topic = params[1].decode("utf-8", "surrogateescape") if len(params) > 1 else ""
                return ("route", topic) if is_valid_name(topic) else ("any", None)
            if name == b"NOP" and self.opts.tls_required == "false":  # else a shard refuses it
                self.buf = self.buf[nl + 1:]
                continue
            if name != b"IDENTIFY" or len(params) != 1:
                return "any", None
            if len(self.buf) < nl + 5:
                return "need", None
            (size,) = _SIZE.unpack_from(self.buf, nl + 1)
            if not 0 < size <= self.opts.max_body_size:
                return "any", None
            end = nl + 5 + size
            if len(self.buf) < end:
                return "need", None
            body = self.buf[nl + 5:end]
            if wants_upgrade(body):
                return "any", None
            current = self.settings or Settings.defaults(self.opts, self.remote.rpartition(":")[0])
            try:
                self.settings, response = negotiate(body, self.opts, current)
            except ProtocolError:
                return "any", None
            self.buf = self.buf[end:]
            return "reply", encode_response(response)


async def greet(sock: socket.socket, remote: tuple[Any, ...], opts: NsqdOptions,
                owner: Callable[[str], int], handoff: HandOff, hurry: asyncio.Event | None = None) -> None:
    """Read ``sock`` up to its routing decision and hand it off (see the module doc). Once
    ``hurry`` is set (the supervisor is about to re-execute itself) a connection still
    waiting for bytes goes to a shard at once, as after ``IDLE_HANDOFF`` of silence."""
    loop = asyncio.get_running_loop()
    g = Greeting(opts, remote)
    try:
        while True:
            action, arg = g.step()
            if action == "reply":
                await loop.sock_sendall(sock, arg)
                continue
            if action == "route":
                await handoff(owner(arg), sock, g.state(), g.buf)
                return
            if action == "any":
                await handoff(None, sock, g.state(), g.buf)
                return
            data = await _read(loop, sock, hurry)
            if data is None:
                await handoff(None, sock, g.state(), g.buf)
                return
            if not data:
                sock.close()
                return
            g.buf += data
    except OSError:
        sock.close()


async def _read(loop: asyncio.AbstractEventLoop, sock: socket.socket, hurry: asyncio.Event | None) -> bytes | None:
    """The next bytes of ``sock``; None after ``IDLE_HANDOFF`` of silence or once ``hurry``
    is set (then nothing read is lost: the read is cancelled before it takes any)."""
    if hurry is None:
        try:
            return await asyncio.wait_for(loop.sock_recv(sock, READ_SIZE), IDLE_HANDOFF)
        except TimeoutError:
            return None
    if hurry.is_set():
        return None
    read = asyncio.ensure_future(loop.sock_recv(sock, READ_SIZE))
    hurried = asyncio.ensure_future(hurry.wait())
    try:
        await asyncio.wait([read, hurried], timeout=IDLE_HANDOFF, return_when=asyncio.FIRST_COMPLETED)
    finally:
        hurried.cancel()
        if not read.done():
            read.cancel()
    if read.done() and not read.cancelled():
        return read.result()
    return None
