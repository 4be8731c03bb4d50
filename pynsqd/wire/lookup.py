"""The nsqlookupd TCP protocol V1, sans-IO: both the server's parser and the client's codec.

Theory of operation
-------------------
A producer (nsqd) connects, sends the magic ``"  V1"``, then lines ending in ``\\n``. Each
line is trimmed of surrounding whitespace (Go's ``strings.TrimSpace``) and split on single
spaces. ``IDENTIFY`` is followed by ``[4B BE size][JSON]``. Every reply, including errors,
is ``[4B BE size][data]`` with *no* frame type; a reply that is an error reads
``"<CODE> <description>"`` and every lookupd error is fatal (the server closes).

``ServerParser`` is the whole per-connection state machine of the server side, because
every error is fatal the parser alone can know it: once IDENTIFY succeeded it stays
identified, and any error ends the stream. ``feed(data)`` returns the events completed by
``data`` — ``Identify``, ``Register``, ``Unregister``, ``Ping`` — and, when the stream broke
a rule, a final ``ProtocolError`` after which the parser ignores input. ``feed_eof()``
reports a stream cut inside IDENTIFY's size or body, as nsqlookupd does. Checks run in
nsqlookupd's order: command name, then IDENTIFY state, then topic and channel names.

Buffering is bounded: a line may hold ``max_line`` bytes (16 KiB) and an IDENTIFY body
``max_identify_size`` bytes (64 KiB; nsqd sends about 150). nsqlookupd has no such limits
(its reader grows without bound, and a negative body size panics the whole daemon); here
they fail with ``E_INVALID command line too long`` and ``E_BAD_BODY IDENTIFY body too big``
/ ``E_BAD_BODY IDENTIFY failed to read body size``.

The client's side (nsqd registering itself): write ``MAGIC``, then ``encode_identify``,
``encode_register``, ``encode_unregister``, ``PING``; read replies with ``ResponseReader``
and classify each with ``response_error`` (``None`` for ``OK`` or the IDENTIFY JSON).
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

import orjson

from pynsqd.wire import MAGIC_V1
from pynsqd.wire.errors import ProtocolError
from pynsqd.wire.names import is_valid_name

MAGIC = MAGIC_V1
OK = b"OK"
PING = b"PING\n"

DEFAULT_MAX_LINE = 16 * 1024
DEFAULT_MAX_IDENTIFY_SIZE = 64 * 1024
DEFAULT_MAX_RESPONSE_SIZE = 5 * 1024 * 1024  # nsqd bounds replies by its --max-body-size

_SIZE = struct.Struct(">i")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
# unicode.IsSpace in Go: ASCII space/controls \t\n\v\f\r, NEL, NBSP and the Z categories.
_GO_SPACE = ("\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
             "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")


# --- events (what the server acts on) ------------------------------------------------------

@dataclasses.dataclass(frozen=True, slots=True)
class IdentifyInfo:
    """What a producer says about itself in IDENTIFY (``PeerInfo`` in nsqlookupd).

    All four of ``broadcast_address``, ``tcp_port``, ``http_port`` and ``version`` are
    required by the server; ``hostname`` is optional.
    """

    broadcast_address: str
    tcp_port: int
    http_port: int
    version: str
    hostname: str = ""

    def to_json(self) -> bytes:
        """The body nsqd sends: a Go map, so the keys come out sorted."""
        return orjson.dumps({
            "broadcast_address": self.broadcast_address, "hostname": self.hostname,
            "http_port": self.http_port, "tcp_port": self.tcp_port, "version": self.version,
        })


@dataclasses.dataclass(frozen=True, slots=True)
class Identify:
    info: IdentifyInfo


@dataclasses.dataclass(frozen=True, slots=True)
class Register:
    topic: str
    channel: str | None  # None registers the topic alone


@dataclasses.dataclass(frozen=True, slots=True)
class Unregister:
    topic: str
    channel: str | None  # None unregisters the topic and all its channels


@dataclasses.dataclass(frozen=True, slots=True)
class Ping:
    pass


Event = Identify | Register | Unregister | Ping

_STRING_FIELDS = ("broadcast_address", "version", "hostname", "remote_address")
_INT_FIELDS = ("tcp_port", "http_port")


def decode_identify(body: bytes) -> IdentifyInfo:
    """Decode an IDENTIFY body as Go's ``encoding/json`` fills ``PeerInfo``, then require
    the four fields. Raises ``ProtocolError`` ``E_BAD_BODY``.

    As in Go: keys match case-insensitively, unknown keys and ``null`` values are ignored,
    a value of the wrong JSON type (or a non-integer or out-of-range port) is an error,
    and invalid UTF-8 inside strings becomes U+FFFD.
    """
    failed = ProtocolError("E_BAD_BODY", "IDENTIFY failed to decode JSON body")
    try:
        data = orjson.loads(body.decode("utf-8", "replace"))
    except orjson.JSONDecodeError:
        raise failed from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise failed
    values: dict[str, Any] = {"broadcast_address": "", "version": "", "hostname": "",
                              "tcp_port": 0, "http_port": 0}
    for key, value in data.items():
        name = key if key in values or key == "remote_address" else key.lower()
        if value is None:
            continue
        if name in _STRING_FIELDS:
            if not isinstance(value, str):
                raise failed
        elif name in _INT_FIELDS:
            if type(value) is not int or not _INT64_MIN <= value <= _INT64_MAX:
                raise failed
        else:
            continue
        values[name] = value
    if not (values["broadcast_address"] and values["tcp_port"] and values["http_port"]
            and values["version"]):
        raise ProtocolError("E_BAD_BODY", "IDENTIFY missing fields")
    return IdentifyInfo(values["broadcast_address"], values["tcp_port"], values["http_port"],
                        values["version"], values["hostname"])


# --- the server's side ---------------------------------------------------------------------

class ServerParser:
    """The server side of one lookupd connection: bytes in, events (or a final error) out.

    Call ``feed`` with every chunk received and act on the events in order; a
    ``ProtocolError`` is always last: send ``encode_error(err)`` and close. Call
    ``feed_eof`` when the peer stops sending.
    """

    def __init__(self, max_line: int = DEFAULT_MAX_LINE,
                 max_identify_size: int = DEFAULT_MAX_IDENTIFY_SIZE) -> None:
        self.max_line = max_line
        self.max_identify_size = max_identify_size
        self._buf = bytearray()
        self._magic_ok = False
        self._in_identify = False  # IDENTIFY line read; its size/body are pending
        self._body_size = -1
        self._identified = False
        self._failed = False

    @property
    def failed(self) -> bool:
        """True once an error was returned; further input is ignored."""
        return self._failed

    @property
    def identified(self) -> bool:
        return self._identified

    @property
    def buffered(self) -> int:
        """Bytes held that are not yet part of a complete command."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[Event | ProtocolError]:
        """Add received bytes; return the events they complete (and maybe a final error)."""
        if self._failed:
            return []
        buf = self._buf
        buf += data
        out: list[Event | ProtocolError] = []
        pos = 0
        try:
            if not self._magic_ok:
                if len(buf) < len(MAGIC):
                    return out
                if bytes(buf[:4]) != MAGIC:
                    raise ProtocolError("E_BAD_PROTOCOL")
                self._magic_ok = True
                pos = 4
            end = len(buf)
            while pos < end:
                if self._in_identify:
                    pos = self._take_identify(buf, pos, end, out)
                    if self._in_identify:
                        break
                    continue
                nl = buf.find(b"\n", pos)
                if nl < 0:
                    if end - pos > self.max_line:
                        raise ProtocolError("E_INVALID", "command line too long")
                    break
                line = bytes(buf[pos:nl]).decode("utf-8", "surrogateescape")
                pos = nl + 1
                event = self._command(line.strip(_GO_SPACE).split(" "))
                if event is not None:
                    out.append(event)
        except ProtocolError as exc:
            self._fail(exc, out)
            return out
        if pos:
            del buf[:pos]
        return out

    def feed_eof(self) -> list[Event | ProtocolError]:
        """The peer closed its side. Inside IDENTIFY this is the error nsqlookupd reports;
        anywhere else nothing is said (a partial line is dropped)."""
        out: list[Event | ProtocolError] = []
        if self._failed or not self._in_identify:
            self._failed = True
            return out
        what = "body size" if self._body_size < 0 else "body"
        self._fail(ProtocolError("E_BAD_BODY", f"IDENTIFY failed to read {what}"), out)
        return out

    def _fail(self, exc: ProtocolError, out: list[Event | ProtocolError]) -> None:
        self._failed = True
        self._buf.clear()
        out.append(exc)

    def _command(self, params: list[str]) -> Event | None:
        name = params[0]
        if name == "PING":
            return Ping()
        if name == "IDENTIFY":
            if self._identified:
                raise ProtocolError("E_INVALID", "cannot IDENTIFY again")
            self._in_identify = True
            self._body_size = -1
            return None
        if name in ("REGISTER", "UNREGISTER"):
            if not self._identified:
                raise ProtocolError("E_INVALID", "client must IDENTIFY")
            topic, channel = _topic_channel(name, params[1:])
            return Register(topic, channel) if name == "REGISTER" else Unregister(topic, channel)
        raise ProtocolError("E_INVALID", f"invalid command {name}")

    def _take_identify(self, buf: bytearray, pos: int, end: int,
                       out: list[Event | ProtocolError]) -> int:
        if self._body_size < 0:
            if end - pos < 4:
                return pos
            size = _SIZE.unpack_from(buf, pos)[0]
            pos += 4
            if size < 0:
                raise ProtocolError("E_BAD_BODY", "IDENTIFY failed to read body size")
            if size > self.max_identify_size:
                raise ProtocolError("E_BAD_BODY",
                                    f"IDENTIFY body too big {size} > {self.max_identify_size}")
            self._body_size = size
        size = self._body_size
        if end - pos < size:
            return pos
        info = decode_identify(bytes(buf[pos:pos + size]))
        self._in_identify = False
        self._body_size = -1
        self._identified = True
        out.append(Identify(info))
        return pos + size


def _topic_channel(command: str, params: list[str]) -> tuple[str, str | None]:
    """REGISTER/UNREGISTER arguments: a topic, then an optional channel ("" means none)."""
    if not params:
        raise ProtocolError("E_INVALID", f"{command} insufficient number of params")
    topic = params[0]
    channel = params[1] if len(params) >= 2 else ""
    if not is_valid_name(topic):
        raise ProtocolError("E_BAD_TOPIC", f"{command} topic name '{topic}' is not valid")
    if channel and not is_valid_name(channel):
        raise ProtocolError("E_BAD_CHANNEL",
                            f"{command} channel name '{channel}' is not valid")
    return topic, channel or None


def encode_response(data: bytes) -> bytes:
    """A reply: ``[4B BE size][data]``."""
    return _SIZE.pack(len(data)) + data


def encode_error(error: ProtocolError) -> bytes:
    """An error reply, ``"<CODE> <description>"``; the connection must close after it."""
    return encode_response(error.text.encode("utf-8", "surrogateescape"))


OK_RESPONSE = encode_response(OK)


# --- the client's side ---------------------------------------------------------------------

def encode_identify(info: IdentifyInfo) -> bytes:
    """``IDENTIFY\\n[4B size][JSON]``; the reply is the lookupd's own info as JSON."""
    body = info.to_json()
    return b"IDENTIFY\n" + _SIZE.pack(len(body)) + body


def _topic_line(command: bytes, topic: str, channel: str | None) -> bytes:
    if channel:
        return b"%s %s %s\n" % (command, topic.encode(), channel.encode())
    return b"%s %s\n" % (command, topic.encode())


def encode_register(topic: str, channel: str | None = None) -> bytes:
    """``REGISTER topic [channel]\\n``; the reply is ``OK``."""
    return _topic_line(b"REGISTER", topic, channel)


def encode_unregister(topic: str, channel: str | None = None) -> bytes:
    """``UNREGISTER topic [channel]\\n``; the reply is ``OK``."""
    return _topic_line(b"UNREGISTER", topic, channel)


class ResponseReader:
    """Reads ``[4B BE size][data]`` replies; ``feed`` returns the complete ones.

    A size below 0 or above ``max_size`` raises ``ProtocolError`` ``E_BAD_BODY``.
    """

    def __init__(self, max_size: int = DEFAULT_MAX_RESPONSE_SIZE) -> None:
        self.max_size = max_size
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._buf
        buf += data
        out: list[bytes] = []
        pos = 0
        end = len(buf)
        while end - pos >= 4:
            size = _SIZE.unpack_from(buf, pos)[0]
            if size < 0 or size > self.max_size:
                raise ProtocolError("E_BAD_BODY", f"invalid response size {size}")
            if end - pos - 4 < size:
                break
            out.append(bytes(buf[pos + 4:pos + 4 + size]))
            pos += 4 + size
        if pos:
            del buf[:pos]
        return out

    @property
    def buffered(self) -> int:
        return len(self._buf)


def response_error(data: bytes) -> ProtocolError | None:
    """The error a reply carries (``E_*``; lookupd then closes), or None for a success."""
    if not data.startswith(b"E_"):
        return None
    code, _, desc = data.decode("utf-8", "replace").partition(" ")
    return ProtocolError(code, desc)


def decode_identify_response(data: bytes) -> dict[str, Any]:
    """The lookupd's IDENTIFY reply: ``broadcast_address``, ``hostname``, ``http_port``,
    ``tcp_port``, ``version``. Raises ``ProtocolError`` for an error reply or bad JSON."""
    err = response_error(data)
    if err is not None:
        raise err
    try:
        info = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise ProtocolError("E_BAD_BODY", "invalid IDENTIFY response") from None
    if not isinstance(info, dict):
        raise ProtocolError("E_BAD_BODY", "invalid IDENTIFY response")
    return info
