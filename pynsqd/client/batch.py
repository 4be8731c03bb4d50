"""Batch delivery: message frames handed over in bulk, as nsqd sent them, answered in bulk.

Theory of operation
-------------------
A ``Consumer`` builds a ``Message`` per message and calls its handler per message; at a few
hundred thousand messages a second that object and call are most of a consumer's CPU. In
batch mode (``BatchConsumer``) a connection's reads are split by ``FrameSplitter`` (sans-IO,
like ``pynsqd.wire.frames.FrameParser``) into *runs*: consecutive message frames kept as one
``bytes`` object plus a list of frame offsets, the frames never copied apart or decoded. The
only per-message work is reading each frame's 8-byte header to find the next one. Other
frames (responses, heartbeats, errors) come out one by one, in stream order between the runs.

A ``MessageBatch`` is one run on one connection::

    frames[offsets[i]:offsets[i + 1]]  is message i's frame:
        [4B size][4B type = 2][8B timestamp ns][2B attempts][16B id][body]

``offsets`` has ``len(batch) + 1`` entries and need not start at 0 (a slice of a batch shares
its parent's ``frames``). Answers go to the connection that delivered the batch, as one write:
``finish()``, ``requeue()``, ``touch()`` act on every message of the batch (or of a slice,
``batch[i:j]``). Each message is answered once: the batches sliced from one delivery share a
``bytearray`` with one flag per message, so answering a message twice through overlapping
slices raises ``RuntimeError`` (checked and set with C-speed slice operations, no loop).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Protocol

from pynsqd.wire.errors import ProtocolError
from pynsqd.wire.frames import FRAME_MESSAGE, Frame
from pynsqd.wire.message import HEADER, HEADER_SIZE

_FRAME = struct.Struct(">ii")
_SIZE = struct.Struct(">i")
FRAME_HEADER_SIZE = 8
MIN_MESSAGE_FRAME = FRAME_HEADER_SIZE + HEADER_SIZE  # 34: a message frame with an empty body
ID_START = FRAME_HEADER_SIZE + 10  # the 16-byte id, counted from the frame's first byte
ID_END = ID_START + 16
RawMessage = tuple[int, int, bytes, bytes]  # timestamp_ns, attempts, id, body


class MessageRun:
    """Consecutive message frames: ``frames[offsets[i]:offsets[i + 1]]`` is frame ``i``."""

    __slots__ = ("frames", "offsets")

    def __init__(self, frames: bytes, offsets: list[int]) -> None:
        self.frames = frames
        self.offsets = offsets


class FrameSplitter:
    """Splits the server→client byte stream into ``MessageRun``s and single other frames.

    ``feed(data)`` returns, in stream order, a ``MessageRun`` per run of message frames, a
    ``(frame_type, payload)`` per other frame, and maybe a final ``ProtocolError`` (a frame
    size below 4 or above ``max_frame_size``, or a message frame shorter than a message
    header), after which it ignores input. Bytes of an incomplete frame are kept."""

    def __init__(self, buffered: bytes = b"", max_frame_size: int = 64 * 1024 * 1024) -> None:
        self._buf = bytearray(buffered)
        self._max = max_frame_size
        self._failed = False

    @property
    def failed(self) -> bool:
        return self._failed

    def feed(self, data: bytes) -> list[MessageRun | Frame | ProtocolError]:
        if self._failed:
            return []
        buf = self._buf
        buf += data
        out: list[MessageRun | Frame | ProtocolError] = []
        pending: list[tuple[int, list[int], int]] = []  # runs as (index in out, offsets, end)
        offsets: list[int] = []
        pos, end, limit = 0, len(buf), self._max
        unpack = _FRAME.unpack_from
        while end - pos >= 8:
            size, frame_type = unpack(buf, pos)
            nxt = pos + 4 + size
            if size < 4 or size > limit or (frame_type == FRAME_MESSAGE and nxt - pos < MIN_MESSAGE_FRAME):
                self._failed = True
                what = "message frame too short" if 4 <= size <= limit else "invalid frame size"
                error = ProtocolError("E_BAD_BODY", f"{what} ({size})")
                return [*self._close_runs(out, pending, offsets, pos), error]
            if nxt > end:
                break
            if frame_type == FRAME_MESSAGE:
                offsets.append(pos)
            else:
                if offsets:
                    offsets.append(pos)
                    pending.append((len(out), offsets, pos))
                    out.append(MessageRun(b"", offsets))
                    offsets = []
                out.append((frame_type, bytes(buf[pos + 8:nxt])))
            pos = nxt
        if 4 <= end - pos < 8 and not 4 <= _SIZE.unpack_from(buf, pos)[0] <= limit:
            self._failed = True  # the size alone is already wrong: report it now, as FrameParser does
            return [*self._close_runs(out, pending, offsets, pos), ProtocolError("E_BAD_BODY", "invalid frame size")]
        result = self._close_runs(out, pending, offsets, pos)
        del buf[:pos]
        return result

    def _close_runs(self, out: list[MessageRun | Frame | ProtocolError], pending: list[tuple[int, list[int], int]],
                    offsets: list[int], pos: int) -> list[MessageRun | Frame | ProtocolError]:
        """Give every run the bytes it points into: one copy of the consumed part of the buffer."""
        if offsets:
            offsets.append(pos)
            pending.append((len(out), offsets, pos))
            out.append(MessageRun(b"", offsets))
        if pending:
            frames = bytes(self._buf[:pending[-1][2]])
            for index, _, _ in pending:
                run = out[index]
                assert isinstance(run, MessageRun)
                run.frames = frames
        if self._failed:
            self._buf.clear()
        return out


class BatchResponder(Protocol):
    """Where a ``MessageBatch``'s answers go: the consumer that received it, on the connection
    it came on (``batchconsumer.BatchAnswers``)."""

    @property
    def nsqd_address(self) -> str: ...

    def finish(self, batch: MessageBatch) -> None:
        """FIN every message of ``batch`` (marked answered), one write."""

    def requeue(self, batch: MessageBatch, delay: float | None, backoff: bool) -> None:
        """REQ every message of ``batch`` (marked answered), one write."""

    def touch(self, batch: MessageBatch) -> None:
        """TOUCH every message of ``batch``, one write."""


class MessageBatch:
    """Messages one read delivered on one connection, undecoded; see the module docstring.

    ``len(batch)``, ``batch[i:j]`` (a slice sharing the frames), iteration (decoded
    ``(timestamp_ns, attempts, id, body)`` tuples), ``ids()``, ``bodies()``, ``attempts()``,
    ``nsqd_address``; ``frames`` and ``offsets`` for zero-copy use. Answers: ``finish()``,
    ``requeue(delay=None, backoff=True)``, ``touch()``; ``responded`` is true once every
    message was answered; ``disable_auto_response()`` as for ``Message``.
    """

    __slots__ = ("_auto", "_lo", "_responder", "_state", "frames", "offsets")

    def __init__(self, responder: BatchResponder, frames: bytes, offsets: list[int],
                 state: bytearray | None = None, lo: int = 0) -> None:
        self._responder = responder
        self.frames = frames
        self.offsets = offsets
        self._state = state if state is not None else bytearray(len(offsets) - 1)
        self._lo = lo  # index of this batch's first message in ``_state``
        self._auto = True

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, key: slice) -> MessageBatch:
        if not isinstance(key, slice):
            raise TypeError("a MessageBatch is sliced (batch[i:j]); iterate it for messages")
        start, stop, step = key.indices(len(self))
        if step != 1:
            raise ValueError("a MessageBatch slice must be contiguous")
        stop = max(start, stop)
        part = MessageBatch(self._responder, self.frames, self.offsets[start:stop + 1],
                            self._state, self._lo + start)
        part._auto = self._auto
        return part

    def __iter__(self) -> Iterator[RawMessage]:
        frames, offsets, unpack = self.frames, self.offsets, HEADER.unpack_from
        for i in range(len(offsets) - 1):
            start = offsets[i]
            ts, attempts, msg_id = unpack(frames, start + FRAME_HEADER_SIZE)
            yield ts, attempts, msg_id, frames[start + MIN_MESSAGE_FRAME:offsets[i + 1]]

    def __repr__(self) -> str:
        return f"MessageBatch({len(self)} messages from {self.nsqd_address})"

    @property
    def nsqd_address(self) -> str:
        return self._responder.nsqd_address

    def ids(self) -> list[bytes]:
        frames = self.frames
        return [frames[o + ID_START:o + ID_END] for o in self.offsets[:-1]]

    def bodies(self) -> list[bytes]:
        frames, offsets = self.frames, self.offsets
        return [frames[offsets[i] + MIN_MESSAGE_FRAME:offsets[i + 1]] for i in range(len(offsets) - 1)]

    def attempts(self) -> list[int]:
        frames, unpack = self.frames, HEADER.unpack_from
        return [unpack(frames, o + FRAME_HEADER_SIZE)[1] for o in self.offsets[:-1]]

    # --- answers ------------------------------------------------------------------------------
    @property
    def responded(self) -> bool:
        """True once every message of this batch was answered (FIN or REQ)."""
        return self._state.find(0, self._lo, self._lo + len(self)) < 0

    @property
    def auto_response(self) -> bool:
        return self._auto

    def disable_auto_response(self) -> None:
        """The handler's return will not FIN/REQ this batch; the application will."""
        self._auto = False

    def finish(self) -> None:
        """FIN every message (one write). Raises ``RuntimeError`` if one was answered already."""
        if self._respond():
            self._responder.finish(self)

    def requeue(self, delay: float | None = None, backoff: bool = True) -> None:
        """REQ every message after ``delay`` seconds (default: the consumer's requeue delay
        times each message's attempts, capped). ``backoff`` counts the batch as one failure."""
        if self._respond():
            self._responder.requeue(self, delay, backoff)

    def touch(self) -> None:
        """TOUCH every message (reset their timeouts); not after one was answered."""
        if self._state.find(1, self._lo, self._lo + len(self)) >= 0:
            raise RuntimeError(f"{self!r}: a message was already answered")
        if len(self):
            self._responder.touch(self)

    def unanswered(self) -> list[MessageBatch]:
        """The slices of this batch whose messages are not answered yet (for partial answers)."""
        out: list[MessageBatch] = []
        state, lo, hi = self._state, self._lo, self._lo + len(self)
        i = lo
        while i < hi:
            start = state.find(0, i, hi)
            if start < 0:
                break
            stop = state.find(1, start, hi)
            stop = hi if stop < 0 else stop
            out.append(self[start - lo:stop - lo])
            i = stop
        return out

    def _respond(self) -> bool:
        """Mark every message answered; False for an empty batch (nothing to send)."""
        lo, hi = self._lo, self._lo + len(self)
        if self._state.find(1, lo, hi) >= 0:
            raise RuntimeError(f"{self!r}: a message was already answered")
        self._state[lo:hi] = b"\x01" * (hi - lo)
        return hi > lo


def join_commands(verb: bytes, ids: list[bytes]) -> bytes:
    """``VERB id\\n`` for every id, as one byte string (one join, no per-id formatting)."""
    if not ids:
        return b""
    return verb + b" " + (b"\n" + verb + b" ").join(ids) + b"\n"


__all__ = ["FrameSplitter", "MessageBatch", "MessageRun", "join_commands"]
