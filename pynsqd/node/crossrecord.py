"""The record a cross-shard publish writes into its owner's inbound ring: encode and decode.

Theory of operation
-------------------
A record starts ``"T"`` and ``[8B sent ns]``: the ``CLOCK_MONOTONIC`` time the producer took
just before writing it into the ring, later than the record before it in the same ring
(``shard/crossshard.py``); the owner merges its rings by it (``shard/inbound.py``). Then
``[1B kind][2B topic length][topic][8B due ns][4B body bytes][4B count]`` (big-endian);
``due`` is 0 for a batch that is not deferred, ``count`` 0 means "create the topic". What
follows depends on the kind:

* ``"F"``: the ``count`` messages as READY
  records of a ``MessageLog`` — per message ``[u32 size][u32 size ^ 0xFFFFFFFF][16-byte
  READY state header][message][pad to 8]`` — exactly the bytes ``append_ready`` would write
  (``shm/log.frame_ready``). The producer frames the batch once; the owner checks the run
  once (``shm/log.check_ready``: frame lengths, lead, sizes, count, exact end) and each
  channel whose log can take it whole appends it with one copy: no step per message on
  either side, and no second framing per log.
* ``"D"`` (batches of fewer than ``FRAMED_MIN`` messages): ``count`` times ``([4B
  length][message])``.

Anything else (no ``"T"`` head, another kind, a length that does not add up) is not a
publish record: ``decode_batch`` raises ``ValueError``. ``decode`` of an ``"F"`` record
returns a ``Frames`` (``shm/frames.py``): a sequence of the messages that code unaware of
frames reads as before (decoded on first use), and that a queue with room appends as it is
(``MessageQueue.put_many``).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import NamedTuple

from pynsqd.shm.frames import RingError
from pynsqd.shm.log import check_ready, frame_ready

TIMED = b"T"
FRAMED = b"F"
# Framing and checking a run has a fixed cost per record that only pays off from a few dozen
# messages on (docs/benchmarks.md); a /pub, a PUB or a small MPUB is written as "D".
FRAMED_MIN = 64
_SENT = struct.Struct(">Q")
_HEAD = struct.Struct(">H")
_TAIL = struct.Struct(">QII")
_LEN = struct.Struct(">I")
_TIMED = TIMED[0]
_FRAMED = FRAMED[0]
_KINDS = frozenset(b"FD")
_TIMED_HEAD = struct.Struct(">QBH")  # after "T": sent, kind, topic length


class Batch(NamedTuple):
    """A decoded record."""

    topic: str
    messages: Sequence[bytes]
    body_bytes: int
    due: int  # monotonic ns when a deferred batch falls due; 0: not deferred
    sent: int  # monotonic ns the producer took before writing it


_batch = Batch._make  # a fifth of the cost of Batch(...)


def encode_batch(topic: str, records: Sequence[bytes], body_bytes: int, due_ns: int, *, sent_ns: int,
                 framed: bool | None = None) -> bytes:
    """A kind ``"F"`` record, or ``"D"`` for fewer than ``FRAMED_MIN`` messages (``framed``
    forces one or the other). ``due_ns``: when a deferred batch falls due
    (``time.monotonic_ns()``), 0 for none; ``sent_ns``: see the module doc."""
    name = topic.encode()
    tail = _TAIL.pack(due_ns, body_bytes, len(records))
    sent = _SENT.pack(sent_ns)
    if not (len(records) >= FRAMED_MIN if framed is None else framed):
        parts = [TIMED, sent, b"D", _HEAD.pack(len(name)), name, tail]
        for record in records:
            parts.append(_LEN.pack(len(record)))
            parts.append(record)
        return b"".join(parts)
    return frame_ready(records, b"".join((TIMED, sent, FRAMED, _HEAD.pack(len(name)), name, tail))).data


def sent_of(data: bytes) -> int:
    """The record's sent time without decoding the rest (0 for a record without one)."""
    if len(data) >= 9 and data[0] == _TIMED:
        return int(_SENT.unpack_from(data, 1)[0])
    return 0


def decode_batch(data: bytes) -> Batch:
    """The record's ``Batch``; ``ValueError`` on a record that is not exactly one of the
    kinds above."""
    if not data or data[0] != _TIMED:
        raise ValueError("not a publish record")
    sent, kind, n = _TIMED_HEAD.unpack_from(data, 1)  # struct.error when short: a ValueError
    start = 9
    if kind not in _KINDS:
        raise ValueError("not a publish record")
    pos = start + 3 + n
    topic = data[start + 3:pos].decode("utf-8", "surrogateescape")
    due, body_bytes, count = _TAIL.unpack_from(data, pos)
    pos += _TAIL.size
    if kind == _FRAMED:
        if not count:
            if pos != len(data):
                raise ValueError("publish record length mismatch")
            return _batch((topic, [], body_bytes, due, sent))
        try:
            return _batch((topic, check_ready(data, pos, count), body_bytes, due, sent))
        except RingError as exc:
            raise ValueError(f"corrupt framed publish record: {exc}") from exc
    records = []
    for _ in range(count):
        (size,) = _LEN.unpack_from(data, pos)
        pos += 4
        records.append(data[pos:pos + size])
        pos += size
    if pos != len(data):
        raise ValueError("publish record length mismatch")
    return _batch((topic, records, body_bytes, due, sent))
