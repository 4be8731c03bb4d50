"""The inbound rings of a node: one shared-memory ``ByteRing`` per (producer shard, owner
shard) pair, named after the data path. The supervisor creates them at start and releases
them at exit; the shards attach to them and write (``shard/crossshard.py``) and drain
(``shard/inbound.py``) the records of ``crossrecord.py``."""

from __future__ import annotations

import resource

from pynsqd.shm.ring import ByteRing, RingError
from pynsqd.shm.segment import Segment, segment_name

RING_SIZE = 16 * 1024 * 1024  # per (producer, owner) pair; a record may be half of it


def ring_size() -> int:
    """``RING_SIZE``, or less when the file-size limit (tmpfs counts) would refuse it."""
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    if soft == resource.RLIM_INFINITY:
        return RING_SIZE
    return max(4096, min(RING_SIZE, soft // 4096 * 4096))


def ring_name(data_dir: str, src: int, dst: int) -> str:
    return segment_name(data_dir, "inbound", f"{src}-{dst}")


def create_rings(data_dir: str, shards: int) -> list[Segment]:
    """Supervisor, at start: make (or keep, with what they hold) every inbound ring."""
    segments = []
    for dst in range(shards):
        for src in range(shards):
            if src == dst:
                continue
            seg = Segment.open(ring_name(data_dir, src, dst), ring_size(), create=True)
            try:
                if seg.created:
                    raise RingError("new")
                ring = ByteRing(seg.buf, init=False)
            except RingError:
                ring = ByteRing(seg.buf, init=True)
            ring.close()
            segments.append(seg)
    return segments


def release_rings(segments: list[Segment]) -> None:
    """Supervisor, at exit: unmap the rings; remove the empty ones (a ring still holding
    records — a shard killed before it drained — stays for the next start to drain)."""
    for seg in segments:
        try:
            ring = ByteRing(seg.buf, init=False)
            empty = len(ring) == 0
            ring.close()
        except RingError:
            empty = True
        seg.close()
        if empty:
            seg.unlink()
