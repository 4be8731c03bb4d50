"""The per-message loop of an MPUB body in pure Python: each message's 4-byte size checked as
nsqd checks it, and its bytes taken, as far as the body has arrived. ``pynsqd.wire._mpubscan``
is its compiled twin (same results, same errors); ``pynsqd.wire.commands`` uses whichever
``pynsqd.compiled.compiled_twin`` gives."""

from __future__ import annotations

import struct

from pynsqd.wire.errors import ProtocolError

_unpack_size = struct.Struct(">i").unpack_from


def scan_bodies(buf: bytearray, start: int, off: int, avail: int, size: int, count: int, max_msg: int,
                bodies: list[bytes]) -> int:
    """Append to ``bodies`` the messages of the MPUB body at ``buf[start:]`` (``size`` bytes
    declared, ``avail`` arrived) from body offset ``off`` on, until ``count`` are taken or the
    next one has not fully arrived; returns the offset reached. ``ProtocolError`` with nsqd's
    text for a size that is not positive, too big, or past the declared body."""
    while len(bodies) < count:
        i = len(bodies)
        if size - off < 4:
            raise ProtocolError("E_BAD_MESSAGE", f"MPUB failed to read message({i}) body size")
        if avail - off < 4:
            break
        msg_size = _unpack_size(buf, start + off)[0]
        if msg_size <= 0:
            raise ProtocolError("E_BAD_MESSAGE", f"MPUB invalid message({i}) body size {msg_size}")
        if msg_size > max_msg:
            raise ProtocolError("E_BAD_MESSAGE", f"MPUB message too big {msg_size} > {max_msg}")
        if size - off - 4 < msg_size:
            raise ProtocolError("E_BAD_MESSAGE", "MPUB failed to read message body")
        if avail - off - 4 < msg_size:
            break
        bodies.append(bytes(buf[start + off + 4:start + off + 4 + msg_size]))
        off += 4 + msg_size
    return off
