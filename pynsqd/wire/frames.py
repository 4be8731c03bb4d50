"""Server→client frames: ``[4B BE size][4B BE frame type][data]``, size = len(data) + 4.

Frame types: 0 response, 1 error, 2 message. ``encode_*`` builds frames; ``FrameParser``
is the sans-IO reader a client uses (``feed(bytes) -> [(type, data), ...]``).
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
    return encode_frame(FRAME_ERROR, error.text.encode())


OK_FRAME = encode_response(OK)
HEARTBEAT_FRAME = encode_response(HEARTBEAT)
CLOSE_WAIT_FRAME = encode_response(CLOSE_WAIT)


class FrameParser:
    """Reads frames from a byte stream (the client's side of the connection).

    ``feed`` returns complete frames as ``(frame_type, data)``; a frame whose size is
    negative, below 4 or above ``max_frame_size`` raises ``ProtocolError`` (``E_BAD_BODY``).
    """

    def __init__(self, max_frame_size: int = 64 * 1024 * 1024) -> None:
        self._buf = bytearray()
        self._max = max_frame_size

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        buf = self._buf
        buf += data
        out: list[tuple[int, bytes]] = []
        pos = 0
        end = len(buf)
        while end - pos >= 8:
            size, frame_type = FRAME_HEADER.unpack_from(buf, pos)
            if size < 4 or size > self._max:
                raise ProtocolError("E_BAD_BODY", f"invalid frame size {size}")
            if end - pos - 4 < size:
                break
            out.append((frame_type, bytes(buf[pos + 8:pos + 4 + size])))
            pos += 4 + size
        if pos:
            del buf[:pos]
        return out

    @property
    def buffered(self) -> int:
        """Bytes held waiting for the rest of a frame."""
        return len(self._buf)
