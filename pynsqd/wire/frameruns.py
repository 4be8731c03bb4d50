"""Runs of message frames in a server→client stream, in pure Python: finding them, and the
one command line per message that answers a run. ``pynsqd.wire._frameruns`` is the compiled
twin (same results); ``pynsqd.client.batch`` uses whichever ``pynsqd.compiled.compiled_twin``
gives. A consumer in batch mode does no other work per message, so at a few hundred thousand
messages a second these two loops are most of its CPU.

A message frame is ``[4B size][4B type = 2][8B timestamp][2B attempts][16B id][body]``
(``pynsqd.wire.frames``, ``pynsqd.wire.message``), big-endian, ``size`` counting from the type.
"""

from __future__ import annotations

import struct

FRAME_MESSAGE = 2
MIN_MESSAGE_SIZE = 30  # a message frame's size field with an empty body: type 4 + header 26
ID_AT = 18  # the id's first byte, counted from the frame's first byte

_FRAME = struct.Struct(">ii")


def scan_messages(buf: bytearray, pos: int, limit: int, offsets: list[int]) -> int:
    """Append to ``offsets`` where each complete message frame of ``buf`` starts, from ``pos``
    on, up to the first frame that is not a message, not complete, or out of bounds (a size
    below a message's or above ``limit``); returns that frame's start (or the end of ``buf``),
    which the caller reads the slow way."""
    end = len(buf)
    unpack = _FRAME.unpack_from
    append = offsets.append
    while end - pos >= 8:
        size, frame_type = unpack(buf, pos)
        nxt = pos + 4 + size
        if frame_type != FRAME_MESSAGE or not MIN_MESSAGE_SIZE <= size <= limit or nxt > end:
            break
        append(pos)
        pos = nxt
    return pos


def id_commands(verb: bytes, frames: bytes, offsets: list[int]) -> bytes:
    """``VERB <id>\\n`` for each message frame ``frames[offsets[i]:offsets[i + 1]]``, as one
    byte string (``FIN``, ``TOUCH``); ``ValueError`` for an offset whose id is not in ``frames``."""
    starts = offsets[:-1]
    if not starts:
        return b""
    if min(starts) < 0 or max(starts) + ID_AT + 16 > len(frames):
        bad = next(o for o in starts if o < 0 or o + ID_AT + 16 > len(frames))
        raise ValueError(f"frame offset {bad} is not in the {len(frames)} bytes of frames")
    lead = verb + b" "
    return lead + (b"\n" + lead).join([frames[o + ID_AT:o + ID_AT + 16] for o in starts]) + b"\n"
