"""go-diskqueue's on-disk format, without I/O: file names, the metadata text, record framing,
the roll rule and the record parser.

Every function here is pure so the rules can be tested alone; ``diskqueue.py`` does the I/O.

* data file ``<name>.diskqueue.%06d.dat``: records ``[4B big-endian int32 length][payload]``,
  nothing else (no header, checksum or magic);
* metadata ``<name>.diskqueue.meta.dat``: ``"%d\\n%d,%d\\n%d,%d\\n"`` = depth,
  readFileNum,readPos, writeFileNum,writePos;
* roll rule: a record goes to the next file when ``writePos > 0`` and it would take the
  current file past ``max_bytes_per_file``, so a file exceeds the limit only when it holds a
  single record bigger than the limit.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

HEADER = struct.Struct(">i")
HEADER_SIZE = HEADER.size

_META = re.compile(rb"\s*(-?\d+)\n(-?\d+),(-?\d+)\n(-?\d+),(-?\d+)\n?\s*")


def data_file_name(name: str, file_num: int) -> str:
    """``t.diskqueue.000001.dat`` (the directory is the caller's)."""
    return f"{name}.diskqueue.{file_num:06d}.dat"


def meta_file_name(name: str) -> str:
    return f"{name}.diskqueue.meta.dat"


def data_file_pattern(name: str) -> re.Pattern[str]:
    """Matches this queue's data file names; group 1 is the file number."""
    return re.compile(rf"{re.escape(name)}\.diskqueue\.(\d{{6,}})\.dat")


def all_files_pattern(name: str) -> re.Pattern[str]:
    """Matches every file the queue may leave: data, ``.bad``, metadata and its temp files,
    and the deferred-messages sidecar and journal (``pynsqd.shm.sidecar``) with their temp and
    ``.bad`` files."""
    return re.compile(rf"{re.escape(name)}\.diskqueue\.(?:\d{{6,}}\.dat(?:\.bad)?|meta\.dat(?:\.\d+\.tmp)?"
                      r"|deferred\.dat(?:\.bad|\.tmp)?|deferred\.jnl(?:\.tmp)?)")


@dataclass(frozen=True, slots=True)
class Meta:
    """The persisted state: records not yet read, where reading and writing stand."""

    depth: int
    read_file: int
    read_pos: int
    write_file: int
    write_pos: int

    def encode(self) -> bytes:
        return (f"{self.depth}\n{self.read_file},{self.read_pos}\n"
                f"{self.write_file},{self.write_pos}\n").encode()

    @classmethod
    def decode(cls, data: bytes) -> Meta:
        """Parse the metadata text; ``ValueError`` when it is not go-diskqueue's format."""
        match = _META.fullmatch(data)
        if match is None:
            raise ValueError(f"malformed diskqueue metadata {data[:80]!r}")
        return cls(*(int(group) for group in match.groups()))

    def is_sane(self) -> bool:
        """Positions are non-negative and reading is not ahead of writing."""
        return (min(self.read_file, self.read_pos, self.write_file, self.write_pos) >= 0
                and (self.read_file, self.read_pos) <= (self.write_file, self.write_pos))


def check_sizes(lengths: Sequence[int], min_size: int, max_size: int) -> int | None:
    """Index of the first payload length outside ``[min_size, max_size]``, or ``None``."""
    if not lengths or (min(lengths) >= min_size and max(lengths) <= max_size):
        return None
    return next(i for i, n in enumerate(lengths) if not min_size <= n <= max_size)


def frame(records: Sequence[bytes], lengths: Sequence[int]) -> bytes:
    """The records framed back to back, ready for one ``write``. Records of one length (an
    MPUB of equal bodies) share their header: one join with it as the separator."""
    if lengths and lengths.count(lengths[0]) == len(lengths):
        head = HEADER.pack(lengths[0])
        return head + head.join(records)
    parts: list[bytes] = [b""] * (2 * len(records))
    parts[::2] = map(HEADER.pack, lengths)
    parts[1::2] = records
    return b"".join(parts)


def plan_segments(write_pos: int, lengths: Sequence[int], max_bytes: int) -> list[tuple[int, int, bool]]:
    """Split a batch by the roll rule into ``(first, stop, roll_before)`` runs, one per file.

    ``roll_before`` says to move to the next file before writing ``records[first:stop]``.
    """
    if write_pos + sum(lengths) + HEADER_SIZE * len(lengths) <= max_bytes or (
            write_pos == 0 and len(lengths) == 1):
        return [(0, len(lengths), False)]
    segments: list[tuple[int, int, bool]] = []
    first, pos, roll = 0, write_pos, False
    for i, length in enumerate(lengths):
        size = HEADER_SIZE + length
        if pos > 0 and pos + size > max_bytes:
            if i > first:
                segments.append((first, i, roll))
            first, pos, roll = i, 0, True
        pos += size
    segments.append((first, len(lengths), roll))
    return segments


class Stop(Enum):
    """Why a parse stopped at the returned position."""

    COUNT = "count"        # max_count records parsed
    END = "end"            # exactly at ``stop``: a clean record boundary
    PARTIAL = "partial"    # a header or payload runs past ``stop`` (more bytes, or a torn tail)
    CORRUPT = "corrupt"    # a length outside [min_size, max_size]: no way to find the next record


def parse_records(buf: bytes, pos: int, stop: int, min_size: int, max_size: int, max_count: int,
                  out: list[bytes]) -> tuple[int, Stop]:
    """Append up to ``max_count`` payloads framed in ``buf[pos:stop]`` to ``out``.

    Returns the position after the last whole record and why parsing stopped.
    """
    unpack = HEADER.unpack_from
    append = out.append
    remaining = max_count
    while remaining > 0:
        if pos + HEADER_SIZE > stop:
            return pos, (Stop.END if pos == stop else Stop.PARTIAL)
        (length,) = unpack(buf, pos)
        if length < min_size or length > max_size:
            return pos, Stop.CORRUPT
        end = pos + HEADER_SIZE + length
        if end > stop:
            return pos, Stop.PARTIAL
        append(buf[pos + HEADER_SIZE:end])
        pos = end
        remaining -= 1
    return pos, Stop.COUNT


def scan_records(buf: bytes, pos: int, stop: int, min_size: int, max_size: int) -> tuple[int, int, Stop]:
    """Count the whole records in ``buf[pos:stop]`` without copying them: ``(count, pos, why)``."""
    unpack = HEADER.unpack_from
    count = 0
    while pos + HEADER_SIZE <= stop:
        (length,) = unpack(buf, pos)
        if length < min_size or length > max_size:
            return count, pos, Stop.CORRUPT
        end = pos + HEADER_SIZE + length
        if end > stop:
            return count, pos, Stop.PARTIAL
        pos = end
        count += 1
    return count, pos, (Stop.END if pos == stop else Stop.PARTIAL)
