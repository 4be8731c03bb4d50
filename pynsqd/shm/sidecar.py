"""The deferred messages of a durable queue across a clean exit: one small file per queue.

Theory of operation
-------------------
On a clean exit a durable topic or channel writes its ready and in-flight messages to its
disk queue and its deferred ones here, with their wall-clock due times, so that nothing
depends on shared memory once the process is gone (a reboot clears ``/dev/shm``). At the
next start the queue loads the file back as deferred records and removes it.

The file is ``<queue name>.diskqueue.deferred.dat`` in the data path::

    header   8 bytes  magic  b"PYNSQDEF"
             4 bytes  version (1), big-endian
             4 bytes  record count, big-endian
    records  8 bytes  due time, wall-clock ns since the epoch, big-endian
             4 bytes  message length, big-endian
             n bytes  the message in NSQ's encoding (attempts as stored)
    trailer  4 bytes  CRC-32 of everything before it, big-endian

It is written to ``<file>.tmp``, fsynced, renamed over the file, and the directory is
fsynced, so a reader sees the old file, the new file or none. A file that does not parse
exactly (bad magic or version, wrong count, short, trailing bytes, CRC mismatch) is renamed
to ``<file>.bad`` and logged; its queue starts without it.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from collections.abc import Sequence

MAGIC = b"PYNSQDEF"
VERSION = 1
_HEADER = struct.Struct(">8sII")
_RECORD = struct.Struct(">QI")
_CRC = struct.Struct(">I")

Deferred = tuple[int, bytes]  # (due, wall-clock ns; message)


class SidecarError(Exception):
    """A sidecar file that does not hold a valid list of deferred messages."""


def sidecar_path(data_path: str, queue_name: str) -> str:
    return os.path.join(data_path, f"{queue_name}.diskqueue.deferred.dat")


def encode(records: Sequence[Deferred]) -> bytes:
    parts = [_HEADER.pack(MAGIC, VERSION, len(records))]
    for due, message in records:
        parts.append(_RECORD.pack(due, len(message)))
        parts.append(message)
    body = b"".join(parts)
    return body + _CRC.pack(zlib.crc32(body))


def decode(data: bytes) -> list[Deferred]:
    """The records of a sidecar file's bytes; ``SidecarError`` unless they parse exactly."""
    if len(data) < _HEADER.size + _CRC.size:
        raise SidecarError(f"short file ({len(data)} bytes)")
    magic, version, count = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise SidecarError("bad magic")
    if version != VERSION:
        raise SidecarError(f"unknown version {version}")
    end = len(data) - _CRC.size
    if zlib.crc32(memoryview(data)[:end]) != _CRC.unpack_from(data, end)[0]:
        raise SidecarError("checksum mismatch")
    out: list[Deferred] = []
    pos = _HEADER.size
    while pos < end:
        if pos + _RECORD.size > end:
            raise SidecarError(f"torn record header at {pos}")
        due, size = _RECORD.unpack_from(data, pos)
        pos += _RECORD.size
        if pos + size > end:
            raise SidecarError(f"record at {pos} runs past the end ({size} bytes)")
        out.append((due, data[pos:pos + size]))
        pos += size
    if len(out) != count:
        raise SidecarError(f"{len(out)} records, header says {count}")
    return out


def write(path: str, records: Sequence[Deferred]) -> None:
    """Replace ``path`` with ``records`` durably; with none, remove it. Raises ``OSError``."""
    if not records:
        remove(path)
        return
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "wb") as out:
            out.write(encode(records))
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _sync_dir(path)


def read(path: str, log: logging.Logger) -> list[Deferred]:
    """The records in ``path`` ([] when there is none). A corrupt file is renamed ``.bad``
    and logged, an unreadable one logged; neither raises."""
    try:
        with open(path, "rb") as src:
            data = src.read()
    except FileNotFoundError:
        return []
    except OSError as exc:
        log.error("failed to read deferred messages from %s - %s", path, exc)
        return []
    try:
        return decode(data)
    except SidecarError as exc:
        bad = f"{path}.bad"
        try:
            os.replace(path, bad)
            log.error("deferred messages file %s is corrupt (%s); renamed to %s", path, exc, bad)
        except OSError as err:
            log.error("deferred messages file %s is corrupt (%s); failed to rename it - %s", path, exc, err)
        return []


def remove(path: str) -> None:
    """Remove ``path`` if it exists (durably). Raises ``OSError`` for other failures."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    _sync_dir(path)


def _sync_dir(path: str) -> None:
    fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
