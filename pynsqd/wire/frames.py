"""Server→client frames: ``[4B BE size][4B BE frame type][data]``, size = len(data) + 4.

Frame types: 0 response, 1 error, 2 message. ``encode_*`` builds frames; ``FrameParser``
is the sans-IO reader a client uses (``feed(bytes) -> [(type, data), ..., maybe an error]``).
"""

from __future__ import annotations

import struct

from pynsqd.wire.errors import ProtocolError

FRAME_RESPONSE = 0
FRAME_ERROR = 1
FRAME_MESSAGE = 2

FRAME_HEADER = struct.Struct(">ii")
MESSAGE_FRAME_HEADER = struct.Struct(">iiqH")  # size, type, timestamp, attempts
_SIZE = struct.Struct(">i")

OK = b"OK"
HEARTBEAT = b"_heartbeat_"
CLOSE_WAIT = b"CLOSE_WAIT"


def encode_frame(frame_type: int, data: bytes) -> bytes:
    """One frame carrying ``data``."""
    return FRAME_HEADER.pack(len(data) + 4, frame_type) + data


def encode_response(data: bytes) -> bytes:
    """A response frame (``OK``, JSON, ``_heartbeat_``, ``CLOSE_WAIT``)."""
    return encode_frame(FRAME_RESPONSE, data)


def encode_error(error: ProtocolError) -> bytes:
    """An error frame for ``error``: ``"<CODE> <description>"``."""
    return encode_frame(FRAME_ERROR, error.encode_text())


OK_FRAME = encode_response(OK)
HEARTBEAT_FRAME = encode_response(HEARTBEAT)
CLOSE_WAIT_FRAME = encode_response(CLOSE_WAIT)


Frame = tuple[int, bytes]


class FrameParser:
    """Reads frames from a byte stream (the client's side of the connection).

    ``feed`` returns complete frames as ``(frame_type, data)``. A frame whose size is below 4
    or above ``max_frame_size`` ends the stream: it is reported, as soon as its 4 size bytes
    arrive, as a final ``ProtocolError`` (``E_BAD_BODY``) item after the frames before it,
    as ``CommandParser`` does; ``feed`` then returns ``[]``. Frame types are not checked
    (the client decides what an unknown type means).
    """

    def __init__(self, max_frame_size: int = 64 * 1024 * 1024) -> None:
        self._buf = bytearray()
        self._max = max_frame_size
        self._failed = False

    def feed(self, data: bytes, limit: int = 0) -> list[Frame | ProtocolError]:
        """Add received bytes; return the frames they complete (and maybe a final error).

        ``limit`` > 0 returns at most that many frames and keeps the bytes after them
        buffered (``take_buffered`` hands them out when the stream switches encoding)."""
        if self._failed:
            return []
        buf = self._buf
        buf += data
        out: list[Frame | ProtocolError] = []
        pos = 0
        end = len(buf)
        while end - pos >= 4 and not (limit and len(out) >= limit):
            size = _SIZE.unpack_from(buf, pos)[0]
            if size < 4 or size > self._max:
                self._failed = True
                buf.clear()
                out.append(ProtocolError("E_BAD_BODY", f"invalid frame size {size}"))
                return out
            if end - pos - 4 < size:
                break
            frame_type = _SIZE.unpack_from(buf, pos + 4)[0]
            out.append((frame_type, bytes(buf[pos + 8:pos + 4 + size])))
            pos += 4 + size
        if pos:
            del buf[:pos]
        return out

    def take_buffered(self) -> bytes:
        """Remove and return the bytes held after the last complete frame."""
        data = bytes(self._buf)
        self._buf.clear()
        return data

    @property
    def failed(self) -> bool:
        """True once a bad frame was reported; the parser then ignores further input."""
        return self._failed

    @property
    def buffered(self) -> int:
        """Bytes held waiting for the rest of a frame."""
        return len(self._buf)
