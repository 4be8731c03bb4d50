"""A chunked request body as Go's ``net/http`` reads it: bytes in, data out.

Theory of operation
-------------------
Each chunk is a size line — hex digits (at most 16), whitespace after them dropped, anything
from a ``;`` on (an extension) ignored, the line shorter than ``MAX_CHUNK_LINE`` bytes — then
that many bytes of data and exactly CRLF. A chunk of size 0 ends the data; then comes either
CRLF or trailer fields ending in an empty line, which must show up within ``MAX_TRAILER``
bytes and are checked as fields and dropped (Go merges them into ``Request.Trailer``, which no
NSQ handler reads). Like Go (1.21.5 and later), a body whose framing outgrows its data — more
than ``MAX_CHUNK_EXCESS`` bytes beyond 16 bytes and twice the data of each chunk — cannot be
read. Anything else that breaks these rules makes the body ``BROKEN``.
"""

from __future__ import annotations

import re
from collections.abc import Callable

MAX_CHUNK_LINE = 4096  # Go's maxLineLength for a chunk-size line
MAX_TRAILER = 4096  # what Go's reader holds while it looks for a trailer's end
MAX_CHUNK_EXCESS = 16 * 1024  # framing bytes a chunked body may carry beyond its allowance
MORE, DONE, BROKEN = range(3)  # what ``read`` reports

_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")
_SIZE, _DATA, _DATA_END, _TRAILER = range(4)


class ChunkedBody:
    """One chunked body, read from a buffer its owner keeps. ``trailer_ok(lines)`` judges the
    trailer fields (the lines between the last chunk and the empty line)."""

    def __init__(self, trailer_ok: Callable[[list[bytes]], bool]) -> None:
        self.trailer_ok = trailer_ok
        self._state = _SIZE
        self._remaining = 0  # data bytes of the current chunk still to come
        self._excess = 0  # framing beyond what Go allows for the data so far

    def read(self, buf: bytes, pos: int, out: Callable[[bytes], None]) -> tuple[int, int]:
        """Take what can be taken of ``buf[pos:]``, giving the data to ``out``: the position
        reached, and ``MORE`` (it needs more bytes), ``DONE`` (the body and its trailer were
        read) or ``BROKEN`` (it cannot be read)."""
        while True:
            state = self._state
            if state == _SIZE:
                end = buf.find(b"\n", pos, pos + MAX_CHUNK_LINE - 1)
                if end < 0:
                    return pos, BROKEN if len(buf) - pos >= MAX_CHUNK_LINE - 1 else MORE
                line = buf[pos:end + 1]
                pos = end + 1
                size = line.rstrip(b" \t\r\n").partition(b";")[0]
                if not _CHUNK_SIZE.fullmatch(size):
                    return pos, BROKEN
                self._remaining = int(size, 16)
                self._excess = max(self._excess + len(line) + 2 - 16 - 2 * self._remaining, 0)
                if self._excess > MAX_CHUNK_EXCESS:
                    return pos, BROKEN
                self._state = _DATA if self._remaining else _TRAILER
            elif state == _DATA:
                take = min(self._remaining, len(buf) - pos)
                if not take:
                    return pos, MORE
                out(buf[pos:pos + take])
                pos += take
                self._remaining -= take
                if self._remaining:
                    return pos, MORE
                self._state = _DATA_END
            elif state == _DATA_END:
                if len(buf) - pos < 2:
                    return pos, MORE
                if buf[pos:pos + 2] != b"\r\n":
                    return pos, BROKEN
                pos += 2
                self._state = _SIZE
            else:
                return self._trailer(buf, pos)

    def _trailer(self, buf: bytes, pos: int) -> tuple[int, int]:
        if len(buf) - pos < 2:
            return pos, MORE
        if buf[pos:pos + 2] == b"\r\n":
            return pos + 2, DONE
        end = buf.find(b"\r\n\r\n", pos, pos + MAX_TRAILER)
        if end < 0:
            return pos, BROKEN if len(buf) - pos >= MAX_TRAILER else MORE
        lines = [line[:-1] if line.endswith(b"\r") else line for line in buf[pos:end].split(b"\n")]
        return end + 4, DONE if self.trailer_ok(lines) else BROKEN
