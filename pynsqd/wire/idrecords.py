"""Messages from a batch of bodies in pure Python: each body behind the batch's 10-byte
prefix (timestamp and attempts) and its id, the ids a range (``first``, ``first + step``,
...) written as 16 hex digits. ``pynsqd.wire._idrecords`` is its compiled twin (same bytes);
``pynsqd.wire.message.IdFactory.next_records`` uses whichever
``pynsqd.compiled.compiled_twin`` gives."""

from __future__ import annotations

import struct
from collections.abc import Sequence


def make_records(prefix: bytes, first: int, step: int, bodies: Sequence[bytes]) -> list[bytes]:
    """``prefix + id + body`` for each body, the ids ``first`` counted up by ``step``."""
    take = len(bodies)
    # one pack and one hex call for the whole range, cut into 16s (no format call per id)
    text = struct.pack(f">{take}Q", *range(first, first + take * step, step)).hex().encode()
    return [prefix + text[i:i + 16] + body for i, body in zip(range(0, 16 * take, 16), bodies)]
