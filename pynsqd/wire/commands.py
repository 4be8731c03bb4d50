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
a silent close) gets ``E_INVALID command line too long``. nsqd reads MPUB's messages straight
off the stream after checking the declared body size, without cross-checking the two; here the
messages must fit in the declared body, so one MPUB never buffers more than
``--max-body-size``: a message that would run past it fails at once with nsqd's "failed to
read" error, and a surplus after the last message is discarded (nsqd would parse it as the
next command). Well-formed MPUBs, and every error a well-formed stream can produce, are
byte-for-byte nsqd's.

A consumer sends one FIN per message, often hundreds in one read. With ``fin_runs=True``
(the server's parser) a run of well-formed FIN lines (``FIN <16 bytes>\n``, no space, CR or
LF in the id) is matched by one regular expression and returned as a single
``(FIN_RUN, [id, ...], None)`` command; ``FIN_RUN`` is a name no line can produce, and
``encode_command`` turns it back into the FIN lines. Anything else about a FIN (a short id,
a CR, an extra parameter) takes the ordinary path, so its error is exactly nsqd's.

Numbers (DPUB's delay) are parsed as nsqd's ``ByteToBase10`` does (``parse_base10``), and
names in error texts are quoted as Go's ``%q`` does (``go_quote``), so error frames match
nsqd's byte for byte.
"""

from __future__ import annotations

import re
import struct

from pynsqd.compiled import compiled_twin
from pynsqd.wire import mpubscan
from pynsqd.wire.errors import ProtocolError, go_quote
from pynsqd.wire.names import MAX_NAME_LENGTH, is_valid_name, is_valid_name_bytes

Command = tuple[bytes, list[bytes], "bytes | list[bytes] | None"]

_SIZE = struct.Struct(">i")
_unpack_size = _SIZE.unpack_from
_twin = compiled_twin("pynsqd.wire._mpubscan")
_scan_bodies = mpubscan.scan_bodies if _twin is None else _twin.scan_bodies

# Commands followed by a size-prefixed body.
_BODY_COMMANDS = frozenset({b"IDENTIFY", b"AUTH", b"PUB", b"DPUB", b"MPUB"})

DEFAULT_MAX_LINE = 16 * 1024

# A run of FIN lines read at once: (FIN_RUN, [message id, ...], None). A name split from a
# line never holds "\n", so no client can send this one.
FIN_RUN = b"FIN\n"
_FIN_LINE = 21  # len(b"FIN " + 16-byte id + b"\n")
_FINS = re.compile(rb"(?:FIN [^ \r\n]{16}\n)+")
_FIN_ID = re.compile(rb"FIN ([^ \r\n]{16})\n")

# One whole PUB or MPUB of one message in a read (``CommandParser._one_publish``).
_PUBLISH_FIRST = (b"P", b"M")
_PUBLISH_LINE = 5 + MAX_NAME_LENGTH + 1  # b"MPUB " + the longest topic + b"\n"
_TOPICS_KEPT = 256  # valid topic names a parser remembers


class CommandParser:
    """Incremental parser of the command stream that follows the magic.

    ``max_msg_size`` and ``max_body_size`` are nsqd's ``--max-msg-size`` and
    ``--max-body-size``; ``max_req_timeout_ms`` bounds DPUB's delay. ``max_line`` is the
    longest command line *including* its ``\\n`` (nsqd's 16 KiB read buffer).
    """

    def __init__(self, max_msg_size: int = 1048576, max_body_size: int = 5242880,
                 max_req_timeout_ms: int = 3600000, max_line: int = DEFAULT_MAX_LINE,
                 fin_runs: bool = False) -> None:
        self._fin_runs = fin_runs and max_line >= _FIN_LINE
        self.max_msg_size = max_msg_size
        self.max_body_size = max_body_size
        self.max_req_timeout_ms = max_req_timeout_ms
        self.max_line = max_line
        self._buf = bytearray()
        self._pending: tuple[bytes, list[bytes]] | None = None  # command waiting for its body
        self._body_size = -1  # size of the pending body, once its 4 bytes have arrived
        # MPUB, checked while its body arrives: offset checked so far, count, bodies so far
        self._mpub_off = 0
        self._mpub_count = -1
        self._mpub_bodies: list[bytes] = []
        self._failed = False
        self._topics: dict[bytes, None] = {}  # topic names already found valid
        self._publish_line = min(_PUBLISH_LINE, max_line)

    @property
    def failed(self) -> bool:
        """True once a protocol error was returned; the parser then ignores further input."""
        return self._failed

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a complete command."""
        return len(self._buf)

    def unparsed(self) -> bytes:
        """The received bytes not yet returned as a command, as they arrived (a command whose
        line was read but whose body is incomplete is re-encoded), for handing the stream on."""
        if self._pending is None:
            return bytes(self._buf)
        _, params = self._pending
        head = b" ".join(params) + b"\n"
        if self._body_size >= 0:
            head += _SIZE.pack(self._body_size)
        return head + bytes(self._buf)

    def feed(self, data: bytes) -> list[Command | ProtocolError]:
        """Add received bytes; return the commands they complete (and maybe a final error).

        An error is reported as soon as the bytes that break a rule have arrived (a bad
        header does not wait for the body it announces); after it, ``feed`` returns ``[]``.
        """
        if self._failed:
            return []
        buf = self._buf
        if not buf and self._pending is None and data[:1] in _PUBLISH_FIRST:
            one = self._one_publish(data)
            if one is not None:
                return [one]
        buf += data
        out: list[Command | ProtocolError] = []
        pos = 0
        end = len(buf)
        max_line = self.max_line
        fin_runs = self._fin_runs
        try:
            while pos < end:
                if self._pending is not None:
                    pos = self._take_body(buf, pos, end, out)
                    if self._pending is not None:
                        break  # body incomplete
                    continue
                if fin_runs and buf[pos] == 70 and buf.startswith(b"FIN ", pos):  # 70: "F"
                    run = _FINS.match(buf, pos)
                    if run is not None:
                        out.append((FIN_RUN, _FIN_ID.findall(buf, pos, run.end()), None))
                        pos = run.end()
                        continue
                nl = buf.find(b"\n", pos, pos + max_line)
                if nl < 0:
                    if end - pos >= max_line:
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
            self._pending = None
            self._mpub_bodies = []
            buf.clear()
            out.append(exc)
            return out
        if pos:
            del buf[:pos]
        return out

    def _one_publish(self, data: bytes) -> Command | None:
        """``data`` as exactly one PUB or MPUB of one message that is well formed and within
        the limits (what a publisher waiting for each answer sends), or None for the general
        path, which gives the same command and every error. Saves buffering the read."""
        nl = data.find(b"\n", 0, self._publish_line)
        if nl < 0:
            return None
        if data.startswith(b"PUB "):
            name, at = b"PUB", 4
        elif data.startswith(b"MPUB "):
            name, at = b"MPUB", 5
        else:
            return None
        topic = data[at:nl]
        if topic not in self._topics:
            if not is_valid_name_bytes(topic):  # a CR, a space, a bad name: the general path
                return None
            if len(self._topics) >= _TOPICS_KEPT:
                self._topics.clear()
            self._topics[topic] = None
        if len(data) < nl + 9:
            return None
        size = _unpack_size(data, nl + 1)[0]
        if nl + 5 + size != len(data):
            return None
        if name == b"PUB":
            if not 0 < size <= self.max_msg_size:
                return None
            return name, [name, topic], data[nl + 5:]
        if size > self.max_body_size or len(data) < nl + 13 or _unpack_size(data, nl + 5)[0] != 1:
            return None
        msg_size = _unpack_size(data, nl + 9)[0]
        if not 0 < msg_size <= self.max_msg_size or msg_size != size - 8:
            return None
        return name, [name, topic], [data[nl + 13:]]

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
        if not is_valid_name(params[1].decode("utf-8", "replace")):
            desc = f"{cmd} topic name {go_quote(params[1])} is not valid"
            if name == b"MPUB":  # nsqd doubles the code in this one message
                desc = "E_BAD_TOPIC " + desc
            raise ProtocolError("E_BAD_TOPIC", desc)
        if name == b"DPUB":
            raw = params[2]
            try:
                ms = parse_base10(raw)
            except ValueError:
                text = raw.decode("utf-8", "surrogateescape")
                raise ProtocolError("E_INVALID", f"DPUB could not parse timeout {text}") from None
            delay = ms_to_duration_ns(ms)
            if delay < 0 or delay > self.max_req_timeout_ms * 1_000_000:
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
            self._mpub_off = 0
            self._mpub_count = -1
            self._mpub_bodies = []
        size = self._body_size
        if name == b"MPUB":
            self._scan_mpub(buf, pos, min(end - pos, size))
        if end - pos < size:
            return pos
        body: bytes | list[bytes]
        if name == b"MPUB":
            body, self._mpub_bodies = self._mpub_bodies, []
        else:
            with memoryview(buf) as view:  # one copy, not a bytearray slice and then bytes
                body = bytes(view[pos:pos + size])
        out.append((name, params, body))
        self._pending = None
        self._body_size = -1
        return pos + size

    def _check_body_size(self, name: bytes, size: int) -> None:
        cmd = name.decode()
        if name in (b"PUB", b"DPUB"):
            if size <= 0:
                raise ProtocolError("E_BAD_MESSAGE", f"{cmd} invalid message body size {size}")
            if size > self.max_msg_size:
                raise ProtocolError("E_BAD_MESSAGE",
                                    f"{cmd} message too big {size} > {self.max_msg_size}")
            return
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

    def _scan_mpub(self, buf: bytearray, start: int, avail: int) -> None:
        """Check the MPUB body's count and message sizes as soon as each arrives.

        ``avail`` bytes of the body are at ``buf[start:]``. nsqd reads the messages straight
        off the stream; here they must also fit in the declared body size, which bounds what
        one command can make us buffer.
        """
        size = self._body_size
        off = self._mpub_off
        if self._mpub_count < 0:
            if size < 4:
                raise ProtocolError("E_BAD_BODY", "MPUB failed to read message count")
            if avail < 4:
                return
            count = _unpack_size(buf, start)[0]
            if count <= 0 or count > (self.max_body_size - 4) // 5:
                raise ProtocolError("E_BAD_BODY", f"MPUB invalid message count {count}")
            self._mpub_count = count
            off = 4
        off = _scan_bodies(buf, start, off, avail, size, self._mpub_count, self.max_msg_size, self._mpub_bodies)
        self._mpub_off = off


_U64 = 1 << 64
_I64 = 1 << 63


def parse_base10(raw: bytes) -> int:
    """Parse a number the way nsqd's ``protocol.ByteToBase10`` does (DPUB, REQ and RDY).

    Only ASCII digits are allowed: no sign, no spaces. An empty string is 0. The value wraps
    modulo 2**64, as Go's ``uint64`` arithmetic does. Raises ``ValueError``.
    """
    if raw and not raw.isdigit():  # bytes.isdigit() is ASCII-only
        raise ValueError(f"failed to convert {raw!r} to base 10")
    n = 0
    for i in range(0, len(raw), 4000):  # int() refuses over 4300 digits at once
        chunk = raw[i:i + 4000]
        n = (n * 10 ** len(chunk) + int(chunk)) % _U64
    return n


def ms_to_duration_ns(ms: int) -> int:
    """``time.Duration(ms) * time.Millisecond`` in Go: ``ms`` (a uint64 from ``parse_base10``)
    becomes an int64 and the product wraps, so a huge value can come out negative."""
    signed = (ms + _I64) % _U64 - _I64
    return (signed * 1_000_000 + _I64) % _U64 - _I64


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
    return encode_command(b"MPUB", [b"MPUB", topic.encode()], bodies)


def encode_command(name: bytes, params: list[bytes], body: bytes | list[bytes] | None) -> bytes:
    """A parsed command back to its bytes (``params[0]`` is the name; ``FIN_RUN``'s params
    are the ids)."""
    if name == FIN_RUN:
        return b"".join([b"FIN " + msg_id + b"\n" for msg_id in params])
    line = b" ".join(params) + b"\n"
    if body is None:
        return line
    if isinstance(body, list):
        parts = [_SIZE.pack(len(body))]
        for item in body:
            parts.append(_SIZE.pack(len(item)))
            parts.append(item)
        return _with_body(line, b"".join(parts))
    return _with_body(line, body)


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


def parse_mpub_body(body: bytes, max_msg_size: int, max_body_size: int) -> list[bytes]:
    """Split a binary MPUB body (``[4B count]([4B size][data])*``, as HTTP ``/mpub?binary=true``
    takes it) with the TCP command's checks. Raises ``ProtocolError``."""
    parser = CommandParser(max_msg_size, max_body_size)
    events = parser.feed(b"MPUB t\n" + _SIZE.pack(len(body)) + body)
    if not events:
        raise ProtocolError("E_BAD_BODY", "MPUB failed to read body")
    last = events[-1]
    if isinstance(last, ProtocolError):
        raise last
    bodies = last[2]
    assert isinstance(bodies, list)
    return bodies
