"""Client→server commands: a sans-IO parser with NSQ's limits, and encoders.

Theory of operation
-------------------
A command is one line, ``NAME[ SP param]*\\n`` (a trailing ``\\r`` is dropped; params are
split on single spaces, so two spaces make an empty param). IDENTIFY, AUTH, PUB, DPUB and
MPUB are followed by ``[4B BE size][body]``.

``CommandParser.feed(data)`` returns the commands completed by ``data`` as
``(name, params, body)`` tuples — ``name`` and ``params`` are ``bytes``; ``body`` is
``None``, ``bytes``, or for MPUB the ``list`` of message bodies. When the stream breaks a
rule, the last item returned is a ``ProtocolError`` and the parser stops: every framing error
is fatal in NSQ, so nothing after it can be trusted.

The parser checks what NSQ checks *before reading a body*, in NSQ's order, because a client
that sends a bad header may never send the body it announced: parameter counts, topic names
and DPUB's timeout for the publish commands; then the body size against ``--max-msg-size`` /
``--max-body-size`` as soon as the 4 size bytes arrive; then, for MPUB, each message's size.
Buffering is bounded by the longest line (``max_line``) plus the largest body allowed.
Checks that depend on the connection's state (SUB after SUB, FIN before SUB, …) are the
server's, in ``pynsqd.shard.protocol``.

Differences from nsqd, on purpose: an over-long command line (NSQ: 16 KiB bufio buffer, then
a silent close) gets ``E_INVALID command line too long``; an MPUB whose declared body size is
larger than its messages has the surplus discarded (NSQ would parse it as the next command).
"""

from __future__ import annotations

import struct

from pynsqd.wire.errors import ProtocolError
from pynsqd.wire.names import go_quote, is_valid_name

Command = tuple[bytes, list[bytes], "bytes | list[bytes] | None"]

_SIZE = struct.Struct(">i")
_unpack_size = _SIZE.unpack_from

# Commands followed by a size-prefixed body.
_BODY_COMMANDS = frozenset({b"IDENTIFY", b"AUTH", b"PUB", b"DPUB", b"MPUB"})

DEFAULT_MAX_LINE = 16 * 1024


class CommandParser:
    """Incremental parser of the command stream that follows the magic.

    ``max_msg_size`` and ``max_body_size`` are nsqd's ``--max-msg-size`` and
    ``--max-body-size``; ``max_req_timeout_ms`` bounds DPUB's delay.
    """

    def __init__(self, max_msg_size: int = 1048576, max_body_size: int = 5242880,
                 max_req_timeout_ms: int = 3600000, max_line: int = DEFAULT_MAX_LINE) -> None:
        self.max_msg_size = max_msg_size
        self.max_body_size = max_body_size
        self.max_req_timeout_ms = max_req_timeout_ms
        self.max_line = max_line
        self._buf = bytearray()
        self._pending: tuple[bytes, list[bytes]] | None = None  # command waiting for its body
        self._body_size = -1  # size of the pending body, once its 4 bytes have arrived
        self._failed = False

    @property
    def failed(self) -> bool:
        """True once a protocol error was returned; the parser then ignores further input."""
        return self._failed

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a complete command."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[Command | ProtocolError]:
        """Add received bytes; return the commands they complete (and maybe a final error)."""
        if self._failed:
            return []
        buf = self._buf
        buf += data
        out: list[Command | ProtocolError] = []
        pos = 0
        end = len(buf)
        try:
            while pos < end:
                if self._pending is not None:
                    pos = self._take_body(buf, pos, end, out)
                    if self._pending is not None:
                        break  # body incomplete
                    continue
                nl = buf.find(b"\n", pos)
                if nl < 0:
                    if end - pos > self.max_line:
                        raise ProtocolError("E_INVALID", "command line too long")
                    break
                line = bytes(buf[pos:nl])
                pos = nl + 1
                if line.endswith(b"\r"):
                    line = line[:-1]
                params = line.split(b" ")
                name = params[0]
                if name in _BODY_COMMANDS:
                    self._check_header(name, params)
                    self._pending = (name, params)
                    self._body_size = -1
                else:
                    out.append((name, params, None))
        except ProtocolError as exc:
            self._failed = True
            buf.clear()
            out.append(exc)
            return out
        if pos:
            del buf[:pos]
        return out

    # --- the body-carrying commands ------------------------------------------------------

    def _check_header(self, name: bytes, params: list[bytes]) -> None:
        """What nsqd checks from the command line alone, before it reads the body."""
        if name == b"AUTH":
            if len(params) != 1:
                raise ProtocolError("E_INVALID", "AUTH invalid number of parameters")
            return
        if name == b"IDENTIFY":
            return
        cmd = name.decode()
        need = 3 if name == b"DPUB" else 2
        if len(params) < need:
            raise ProtocolError("E_INVALID", f"{cmd} insufficient number of parameters")
        topic = params[1].decode("utf-8", "replace")
        if not is_valid_name(topic):
            desc = f"{cmd} topic name {go_quote(topic)} is not valid"
            if name == b"MPUB":  # nsqd doubles the code in this one message
                desc = "E_BAD_TOPIC " + desc
            raise ProtocolError("E_BAD_TOPIC", desc)
        if name == b"DPUB":
            raw = params[2]
            try:
                if not raw.lstrip(b"+-").isdigit():
                    raise ValueError
                ms = int(raw)
            except ValueError:
                raise ProtocolError(
                    "E_INVALID", f"DPUB could not parse timeout {raw.decode('utf-8', 'replace')}"
                ) from None
            if not 0 <= ms <= self.max_req_timeout_ms:
                raise ProtocolError(
                    "E_INVALID", f"DPUB timeout {ms} out of range 0-{self.max_req_timeout_ms}")

    def _take_body(self, buf: bytearray, pos: int, end: int,
                   out: list[Command | ProtocolError]) -> int:
        assert self._pending is not None
        name, params = self._pending
        if self._body_size < 0:
            if end - pos < 4:
                return pos
            size = _unpack_size(buf, pos)[0]
            pos += 4
            self._check_body_size(name, size)
            self._body_size = size
        size = self._body_size
        if end - pos < size:
            return pos
        if name == b"MPUB":
            body: bytes | list[bytes] = self._split_mpub(buf, pos, size)
        else:
            body = bytes(buf[pos:pos + size])
        out.append((name, params, body))
        self._pending = None
        self._body_size = -1
        return pos + size

    def _check_body_size(self, name: bytes, size: int) -> None:
        if name in (b"PUB", b"DPUB"):
            cmd = name.decode()
            if size <= 0:
                raise ProtocolError("E_BAD_MESSAGE", f"{cmd} invalid message body size {size}")
            if size > self.max_msg_size:
                raise ProtocolError("E_BAD_MESSAGE",
                                    f"{cmd} message too big {size} > {self.max_msg_size}")
            return
        cmd = name.decode()
        if name == b"MPUB":
            if size <= 0:
                raise ProtocolError("E_BAD_BODY", f"MPUB invalid body size {size}")
            if size > self.max_body_size:
                raise ProtocolError("E_BAD_BODY", f"MPUB body too big {size} > {self.max_body_size}")
            return
        if size > self.max_body_size:  # IDENTIFY, AUTH
            raise ProtocolError("E_BAD_BODY", f"{cmd} body too big {size} > {self.max_body_size}")
        if size <= 0:
            raise ProtocolError("E_BAD_BODY", f"{cmd} invalid body size {size}")

    def _split_mpub(self, buf: bytearray, start: int, size: int) -> list[bytes]:
        end = start + size
        if size < 4:
            raise ProtocolError("E_BAD_BODY", "MPUB failed to read message count")
        count = _unpack_size(buf, start)[0]
        if count <= 0 or count > (self.max_body_size - 4) // 5:
            raise ProtocolError("E_BAD_BODY", f"MPUB invalid message count {count}")
        pos = start + 4
        max_msg = self.max_msg_size
        bodies: list[bytes] = []
        append = bodies.append
        for i in range(count):
            if end - pos < 4:
                raise ProtocolError("E_BAD_MESSAGE", f"MPUB failed to read message({i}) body size")
            msg_size = _unpack_size(buf, pos)[0]
            pos += 4
            if msg_size <= 0:
                raise ProtocolError("E_BAD_MESSAGE", f"MPUB invalid message({i}) body size {msg_size}")
            if msg_size > max_msg:
                raise ProtocolError("E_BAD_MESSAGE", f"MPUB message too big {msg_size} > {max_msg}")
            if end - pos < msg_size:
                raise ProtocolError("E_BAD_MESSAGE", "MPUB failed to read message body")
            append(bytes(buf[pos:pos + msg_size]))
            pos += msg_size
        return bodies


# --- encoders (the client's side) ----------------------------------------------------------

def _with_body(line: bytes, body: bytes) -> bytes:
    return line + _SIZE.pack(len(body)) + body


def encode_identify(json_body: bytes) -> bytes:
    return _with_body(b"IDENTIFY\n", json_body)


def encode_auth(secret: bytes) -> bytes:
    return _with_body(b"AUTH\n", secret)


def encode_sub(topic: str, channel: str) -> bytes:
    return b"SUB %s %s\n" % (topic.encode(), channel.encode())


def encode_pub(topic: str, body: bytes) -> bytes:
    return _with_body(b"PUB %s\n" % topic.encode(), body)


def encode_dpub(topic: str, delay_ms: int, body: bytes) -> bytes:
    return _with_body(b"DPUB %s %d\n" % (topic.encode(), delay_ms), body)


def encode_mpub(topic: str, bodies: list[bytes]) -> bytes:
    parts = [_SIZE.pack(len(bodies))]
    for body in bodies:
        parts.append(_SIZE.pack(len(body)))
        parts.append(body)
    return _with_body(b"MPUB %s\n" % topic.encode(), b"".join(parts))


def encode_rdy(count: int) -> bytes:
    return b"RDY %d\n" % count


def encode_fin(msg_id: bytes) -> bytes:
    return b"FIN " + msg_id + b"\n"


def encode_req(msg_id: bytes, delay_ms: int) -> bytes:
    return b"REQ %s %d\n" % (msg_id, delay_ms)


def encode_touch(msg_id: bytes) -> bytes:
    return b"TOUCH " + msg_id + b"\n"


NOP = b"NOP\n"
CLS = b"CLS\n"
