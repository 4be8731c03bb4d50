"""HTTP/1.x requests read as Go's ``net/http`` server reads them: bytes in, requests out.

Theory of operation
-------------------
nsqd, nsqlookupd and nsqadmin are Go programs: whatever reaches their HTTP ports is judged
by ``net/http`` before a handler sees it. ``RequestParser`` applies Go's rules, in Go's
order, so that a client gets from pynsqd the bytes Go would send:

1. The request line is ``method SP target SP version``, cut at its first two spaces. The
   method is a token (any token: ``FOO`` reaches the handler), the version ``HTTP/d.d``, the
   target what ``url.ParseRequestURI`` takes (``*``, an absolute path or an absolute URL; no
   control byte; valid ``%`` escapes). Otherwise: ``GO_BAD_REQUEST``, at once.
2. Header lines, as ``net/textproto`` (Go 1.20 and later) reads them: a line ends at LF (a
   CR right before it is dropped); a line that starts with SP or HTAB continues the field
   before it (the first field may not); a field needs a colon, a non-empty name of token
   bytes or spaces, and a value without control bytes but HTAB. Otherwise: ``GO_BAD_REQUEST``.
3. The complete head: more than one ``Host`` → 400; ``Transfer-Encoding`` (HTTP/1.1 and
   later) other than one ``chunked`` → ``GO_UNSUPPORTED_TE`` (501); ``Content-Length``
   fields that differ, or one that is not a decimal of at most 63 bits → 400 (``chunked``
   wins over a length); a major version other than 1 (but ``PRI * HTTP/2.0``) → 505; an
   HTTP/1.1 request without ``Host`` (but ``CONNECT``), a ``Host`` of other bytes than
   ``net/http`` allows, a field name with a space → 400 with Go's reason. HTTP/1.2 to 1.9 are
   served as 1.1; after a POST, up to four CR/LF bytes before the next request are skipped.
4. ``Expect``: ``100-continue`` (HTTP/1.1, a body to come) sets ``expect_continue``; any
   other value sets ``expect_failed`` (Go answers 417 and reads no further).

A head is bounded as Go bounds it: past ``HEAD_LIMIT`` bytes (``MaxHeaderBytes`` and Go's
4 KiB of slack), or ``MAX_HEADER_FIELDS`` fields (ours: Go has no count), it is refused with
``GO_HEAD_TOO_LARGE``; at most that much of a head is ever held. Every refusal is a
``Refusal``: the raw answer to write once earlier requests are answered, then close (after
``linger`` for a 431, as Go's ``closeWriteAndWait``). After a refusal the parser takes no
more bytes.

A body is framed by its ``Content-Length`` or by chunks (``httpchunks.ChunkedBody``). It is
kept up to the ``limit`` the owner sets in ``on_head`` and counted beyond it. A body that
cannot be read (bad framing, or the connection's end inside it) gives a request marked
``broken``. After a request that closes the connection (``keep_alive`` false, a broken one
too) the parser takes no more bytes; an end of input inside a head is a 400, as in Go.

A head that is all there and plainly well-formed (CRLF lines, token names, no continuation
or control byte) is read with one match of ``_WHOLE_HEAD``; any other line by line. Both
apply the same rules.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from pynsqd.httpchunks import BROKEN, MORE, ChunkedBody
from pynsqd.httptarget import target_ok

# Go's net/http: DefaultMaxHeaderBytes (1 MiB) for the request line and headers, read with
# 4096 bytes of slack; past it the answer is 431 and the connection closes. Go has no count
# of its own; ours bounds what many tiny headers cost in memory (nothing real sends 10,000).
MAX_HEADER_BYTES = 1 << 20
HEAD_LIMIT = MAX_HEADER_BYTES + 4096
MAX_HEADER_FIELDS = 10_000


def _go_error(status: bytes, body: bytes) -> bytes:
    return b"HTTP/1.1 " + status + b"\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n" + body


def _go_status_error(status: bytes, reason: bytes) -> bytes:
    return _go_error(status + b": " + reason, status + b": " + reason)


# Go's raw answers to requests it does not hand to a handler (``conn.serve``), byte for byte
GO_BAD_REQUEST = _go_error(b"400 Bad Request", b"400 Bad Request")
GO_HEAD_TOO_LARGE = _go_error(b"431 Request Header Fields Too Large", b"431 Request Header Fields Too Large")
GO_UNSUPPORTED_TE = _go_error(b"501 Not Implemented", b"Unsupported transfer encoding")
GO_VERSION_NOT_SUPPORTED = _go_status_error(b"505 HTTP Version Not Supported", b"unsupported protocol version")
GO_MISSING_HOST = _go_status_error(b"400 Bad Request", b"missing required Host header")
GO_MALFORMED_HOST = _go_status_error(b"400 Bad Request", b"malformed Host header")
GO_INVALID_HEADER_NAME = _go_status_error(b"400 Bad Request", b"invalid header name")

_TCHARS = rb"!#$%&'*+\-.^_`|~0-9A-Za-z"
_METHOD = re.compile(rb"[" + _TCHARS + rb"]+")
_NAME_BAD = re.compile(rb"[^" + _TCHARS + rb" ]")  # textproto accepts spaces, the server refuses them
_VALUE_BAD = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_HOST_BAD = re.compile(rb"[^0-9A-Za-z!$%&()*+,\-.:;=\[\]'_~]")
_VERSION = re.compile(rb"HTTP/([0-9]\.[0-9])")
# a plainly well-formed head: request line, fields of token names and allowed bytes, CRLF lines
_WHOLE_HEAD = re.compile(rb"([" + _TCHARS + rb"]+) ([!-~\x80-\xff]+) HTTP/([0-9]\.[0-9])\r\n"
                         rb"((?:[" + _TCHARS + rb"]+:[\t\x20-\x7e\x80-\xff]*\r\n)*)\r\n")
_WHOLE_FIELD = re.compile(rb"([" + _TCHARS + rb"]+):[ \t]*((?:[\t\x20-\x7e\x80-\xff]*[!-~\x80-\xff])?)[ \t]*\r\n")
_PROTOCOLS = {b"%d.%d" % (major, minor): (f"{major}.{minor}", (major, minor) >= (1, 1))
              for major in range(10) for minor in range(10)}  # "d.d" -> (version, at least 1.1)
_FRAMING = frozenset((b"host", b"content-length", b"transfer-encoding", b"connection", b"expect"))
# those fields in "\n" + a plainly well-formed head's field lines, lowered (their values are
# all compared without regard to case)
_FRAMING_FIELD = re.compile(rb"\n(host|content-length|transfer-encoding|connection|expect):[ \t]*"
                            rb"((?:[\t\x20-\x7e\x80-\xff]*[!-~\x80-\xff])?)[ \t]*\r")
_CONTINUE = re.compile(rb"(?:^|[ ,\t])100-continue(?:$|[ ,\t])", re.IGNORECASE)  # Go's hasToken
_OWS = b" \t"
_WS = b" \t\r\n"


class Refusal(Exception):
    """A request Go refuses before any handler: ``answer`` (raw bytes) is written in turn,
    then the connection closes, after ``linger`` seconds of reading and dropping what still
    comes when set (Go's ``closeWriteAndWait`` after a 431)."""

    def __init__(self, answer: bytes, linger: bool = False) -> None:
        super().__init__(answer.partition(b"\r\n")[0].decode("ascii"))
        self.answer = answer
        self.linger = linger


def _bad() -> Refusal:
    return Refusal(GO_BAD_REQUEST)


class Request:
    """One request: its head as read, then its body (``chunks`` up to ``limit`` bytes, ``size``
    counted in full). ``publish`` is for the owner (nsqd's inline publishes)."""

    __slots__ = ("_fields", "_headers", "broken", "chunks", "content_length", "expect_continue", "expect_failed",
                 "http11", "keep_alive", "limit", "method", "publish", "size", "target", "version")

    def __init__(self, method: bytes, target: bytes, version: str, http11: bool, fields: bytes | None = None) -> None:
        self.method = method
        self.target = target
        self.version = version  # "1.1", "1.0", "1.2" ...
        self.http11 = http11  # at least HTTP/1.1: answered as HTTP/1.1
        self._fields = fields  # the field lines of a plainly well-formed head, split when asked for
        self._headers: list[tuple[bytes, bytes]] | None = None
        self.content_length = -1  # -1: chunked, or none declared
        self.keep_alive = True
        self.expect_continue = False
        self.expect_failed = False
        self.broken = False  # its body could not be read whole: answer, then close
        self.publish = False
        self.limit = 0
        self.chunks: list[bytes] = []
        self.size = 0

    @property
    def headers(self) -> list[tuple[bytes, bytes]]:
        """The fields, names lowered, in order."""
        if self._headers is None:
            fields = self._fields
            self._headers = [(name.lower(), value) for name, value in _WHOLE_FIELD.findall(fields)] if fields else []
        return self._headers

    @property
    def body(self) -> bytes | None:
        """The body, or ``None`` if it passed ``limit``."""
        if self.size > self.limit:
            return None
        return self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)

    def add(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size <= self.limit:
            self.chunks.append(chunk)

    def header(self, name: bytes) -> bytes | None:
        """The first value of the field ``name`` (lower case), or ``None``."""
        for key, value in self.headers:
            if key == name:
                return value
        return None


_HEAD, _BODY, _CHUNKED, _DONE = range(4)


class RequestParser:
    """Feed bytes with ``feed`` (and ``feed_eof`` at the end of input): each head calls
    ``on_head(request)`` before its body is read — the owner sets ``request.limit`` there, and
    returns False to read no body (the parser then stops) — and each complete request
    ``on_request(request)``. ``feed`` raises ``Refusal``; requests completed before it were
    already delivered."""

    def __init__(self, on_head: Callable[[Request], bool], on_request: Callable[[Request], None]) -> None:
        self.on_head = on_head
        self.on_request = on_request
        self._buf = b""
        self._pos = 0
        self._state = _HEAD
        self._req: Request | None = None  # the request being read (None: before its request line)
        self._head_used = 0  # bytes of the current head taken so far
        self.after_post = False  # Go skips up to 4 CR/LF bytes before a request that follows a POST
        self._remaining = 0  # body bytes still to come
        self._chunks: ChunkedBody | None = None  # the chunked body being read
        self._spaced = False  # the head has a field name with a space
        self.idle = True  # between requests, with nothing held (as of the last feed)

    @property
    def stopped(self) -> bool:
        """After a refusal or a request it reads no further: it takes no more bytes."""
        return self._state == _DONE

    def feed(self, data: bytes) -> None:
        if self._state == _DONE:
            return
        self._buf = self._buf[self._pos:] + data if self._buf else data
        self._pos = 0
        try:
            self._run(False)
        finally:
            if self._pos >= len(self._buf):
                self._buf = b""
                self._pos = 0
            self.idle = self._state == _HEAD and self._req is None and not self._buf and not self._head_used

    def feed_eof(self) -> None:
        """The peer sent its last byte: a head cut short is a 400 (``Refusal``); a body cut
        short gives its request, ``broken``."""
        self.idle = False
        if self._state == _DONE:
            return
        self._run(True)
        if self._state == _HEAD:
            self._state = _DONE  # nothing more can come: the connection closes once it is answered
            if self._req is not None or self._pos < len(self._buf):
                raise _bad()
        else:
            self._broken()

    def _run(self, eof: bool) -> None:
        while True:
            state = self._state
            if state == _HEAD:
                if (self._pos >= len(self._buf) and not eof) or not self._head(eof):
                    return
            elif state == _BODY:
                if not self._body():
                    return
            elif state == _DONE:
                return
            elif not self._chunked():
                return

    # --- the head ------------------------------------------------------------------------
    def _head(self, eof: bool) -> bool:
        """Take the head's complete lines; True once the head is done."""
        buf, pos = self._buf, self._pos
        if self._req is None:
            if self.after_post and pos < len(buf) and buf[pos] in b"\r\n":
                peek = buf[pos:pos + 4]
                if len(peek) < 4 and not eof:
                    return False
                skip = len(peek) - len(peek.lstrip(b"\r\n"))
                pos += skip
                self._head_used += skip
            self.after_post = False
            if self._whole_head(buf, pos):
                return True
        while True:
            room = HEAD_LIMIT - self._head_used
            end = buf.find(b"\n", pos, pos + room)
            if end < 0:
                self._pos = pos
                if len(buf) - pos >= room:
                    self._state = _DONE
                    raise Refusal(GO_HEAD_TOO_LARGE, linger=True)
                if eof and pos < len(buf):
                    self._state = _DONE
                    raise _bad()
                return False
            line = buf[pos:end - 1] if end > pos and buf[end - 1] == 13 else buf[pos:end]
            self._head_used += end + 1 - pos
            pos = end + 1
            req = self._req
            self._pos = pos
            if req is None:
                self._req = self._request_line(line)
            elif line:
                self._field(req, line)
            else:
                self._head_done(req, [field for field in req.headers if field[0] in _FRAMING])
                return True

    def _whole_head(self, buf: bytes, pos: int) -> bool:
        """A head that is all there and plainly well-formed (CRLF lines, token names,
        values of the bytes Go allows, no continuation), read in one match; False to read
        it line by line, which decides every other case."""
        end = buf.find(b"\r\n\r\n", pos, pos + HEAD_LIMIT - self._head_used - 3)
        if end < 0:
            return False
        head = _WHOLE_HEAD.fullmatch(buf, pos, end + 4)
        if head is None:
            return False
        method, target, protocol, fields = head.groups()
        if (((target[0] != 47 or b"%" in target) and not target_ok(method, target))  # 47: "/"
                or (len(fields) > 4 * MAX_HEADER_FIELDS and fields.count(b"\n") > MAX_HEADER_FIELDS)):
            return False
        self._pos = end + 4
        version, http11 = _PROTOCOLS[protocol]
        self._head_done(Request(method, target, version, http11, fields),
                        _FRAMING_FIELD.findall(b"\n" + fields.lower()))
        return True

    def _request_line(self, line: bytes) -> Request:
        method, sp1, rest = line.partition(b" ")
        target, sp2, proto = rest.partition(b" ")
        if not sp1 or not sp2 or not _METHOD.fullmatch(method):
            raise self._stop(_bad())
        version = _VERSION.fullmatch(proto)
        if version is None or not target_ok(method, target):
            raise self._stop(_bad())
        return Request(method, target, *_PROTOCOLS[version[1]])

    def _field(self, req: Request, line: bytes) -> None:
        headers = req.headers
        if line[0] in _OWS:  # a continuation of the field before
            piece = line.strip(_OWS)
            if not headers or _VALUE_BAD.search(piece):
                raise self._stop(_bad())
            name, value = headers[-1]
            headers[-1] = (name, value + b" " + piece if value else piece)
            return
        field = _field_line(line)
        if field is None:
            raise self._stop(_bad())
        name, value = field
        if len(headers) >= MAX_HEADER_FIELDS:
            raise self._stop(Refusal(GO_HEAD_TOO_LARGE, linger=True))
        if b" " in name:
            self._spaced = True  # textproto takes it; the server refuses it once the head is read
        headers.append((name.lower(), value))

    def _head_done(self, req: Request, framing: list[tuple[bytes, bytes]]) -> None:
        """Go's checks of a whole head, in its order (``framing``: its fields named in
        ``_FRAMING``); then its body, if any."""
        self._req = None
        self._head_used = 0
        host = length = encoding = connection = expect = None
        encodings = 0
        lengths_differ = False
        for name, value in framing:
            if name == b"host":
                if host is not None:
                    raise self._stop(_bad())  # more than one
                host = value
            elif name == b"content-length":
                value = value.strip(_WS)
                if length is None:
                    length = value
                elif value != length:
                    lengths_differ = True
            elif name == b"connection":
                connection = value if connection is None else connection + b"," + value
            elif name == b"transfer-encoding":
                encoding = value
                encodings += 1
            elif expect is None:
                expect = value
        chunked = False
        if encodings and req.http11:
            if encodings != 1 or encoding is None or encoding.lower() != b"chunked":
                raise self._stop(Refusal(GO_UNSUPPORTED_TE))
            chunked = True
        if length is not None:
            if lengths_differ:
                raise self._stop(_bad())
            if not chunked and length:
                digits = length.lstrip(b"0") or b"0"  # (int() refuses thousands of digits)
                if not length.isdigit() or len(digits) > 19 or int(digits) >= 1 << 63:
                    raise self._stop(_bad())
                req.content_length = int(digits)
        if not chunked and req.content_length < 0:
            req.content_length = 0
        version = req.version
        h2_preface = version == "2.0" and req.method == b"PRI" and req.target == b"*" and not req.headers
        if version[0] != "1" and not h2_preface:
            raise self._stop(Refusal(GO_VERSION_NOT_SUPPORTED))
        if host is None:
            if req.http11 and not h2_preface and req.method != b"CONNECT":
                raise self._stop(Refusal(GO_MISSING_HOST))
        elif _HOST_BAD.search(host):
            raise self._stop(Refusal(GO_MALFORMED_HOST))
        if self._spaced:
            self._spaced = False
            raise self._stop(Refusal(GO_INVALID_HEADER_NAME))
        if connection is not None:
            close = _CLOSE.search(connection) is not None
            if version == "1.0":
                req.keep_alive = not close and _KEEP_ALIVE.search(connection) is not None
            else:
                req.keep_alive = not close
        elif version == "1.0" or h2_preface:
            req.keep_alive = False
        if expect is not None:
            if _CONTINUE.search(expect):
                req.expect_continue = req.http11 and (chunked or req.content_length > 0)
            elif expect:
                req.expect_failed = True
                req.keep_alive = False
        self.after_post = req.method == b"POST"
        if not self.on_head(req) or req.expect_failed:
            self._state = _DONE
            self.on_request(req)
        elif chunked:
            self._state = _CHUNKED
            self._chunks = ChunkedBody(_trailer_ok)
            self._current = req
        elif req.content_length:
            self._current = req
            self._remaining = req.content_length
            if len(self._buf) - self._pos >= req.content_length:
                self._body()  # all here: the common case
            else:
                self._state = _BODY
        else:
            self._deliver(req)

    def _deliver(self, req: Request) -> None:
        """A complete request; after one that closes the connection nothing more is read."""
        if not req.keep_alive:
            self._state = _DONE
        self.on_request(req)

    # --- the body ------------------------------------------------------------------------
    _current: Request

    def _body(self) -> bool:
        buf, pos = self._buf, self._pos
        take = min(self._remaining, len(buf) - pos)
        if not take:
            return False
        self._current.add(buf if pos == 0 and take == len(buf) else buf[pos:pos + take])
        self._pos = pos + take
        self._remaining -= take
        if self._remaining:
            return False
        self._state = _HEAD
        self._deliver(self._current)
        return True

    def _chunked(self) -> bool:
        """Read of the chunked body what is here; False when it needs more bytes."""
        assert self._chunks is not None
        self._pos, status = self._chunks.read(self._buf, self._pos, self._current.add)
        if status == MORE:
            return False
        if status == BROKEN:
            self._broken()
            return False
        self._chunks = None
        self._state = _HEAD
        self._deliver(self._current)
        return True

    def _broken(self) -> None:
        """The body cannot be read whole: deliver its request as it is, and stop."""
        self._state = _DONE
        self.idle = False
        req = self._current
        req.broken = True
        req.keep_alive = False
        self.on_request(req)

    def _stop(self, refusal: Refusal) -> Refusal:
        self._state = _DONE
        self.idle = False
        return refusal


def _field_line(line: bytes) -> tuple[bytes, bytes] | None:
    """``(name, value)`` of a field line textproto takes (not a continuation), else None."""
    name, colon, value = line.partition(b":")
    value = value.strip(_OWS)
    if not colon or not name or _NAME_BAD.search(name) or _VALUE_BAD.search(value):
        return None
    return name, value


def _trailer_ok(lines: list[bytes]) -> bool:
    """Whether textproto takes ``lines`` as fields (a trailer after a chunked body)."""
    if lines and lines[0][:1] in (b" ", b"\t"):
        return False
    for line in lines:
        if not line:
            break
        if line[0] in _OWS:
            if _VALUE_BAD.search(line):
                return False
        elif _field_line(line) is None:
            return False
    return True


def _token(token: bytes) -> re.Pattern[bytes]:
    """A search for ``token`` as an element of a comma-separated field value, case aside."""
    return re.compile(rb"(?:^|,)[ \t]*" + token + rb"[ \t]*(?:,|$)", re.IGNORECASE)


_CLOSE = _token(b"close")
_KEEP_ALIVE = _token(b"keep-alive")
