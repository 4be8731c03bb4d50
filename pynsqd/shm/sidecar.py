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

Deferred messages that find no room in a full shared-memory log while the process runs
are appended to a second file, the journal ``<queue name>.diskqueue.deferred.jnl``, before
the publish is acknowledged (a ``write`` survives kill -9 in the page cache)::

    records  8 bytes  due time, wall-clock ns since the epoch, big-endian
             4 bytes  message length, big-endian
             4 bytes  CRC-32 of the message, big-endian
             n bytes  the message

A message of the journal that is stored elsewhere since (the log, the disk queue, a
channel) while others still wait is struck off with a record of the same shape whose due
time is ``2**64 - 1`` and whose "message" is the 16-byte id of the one it strikes off (one
``write`` for a batch), so a kill -9 brings back only what still waited. Reading stops at a
torn or corrupt record (logged): a crash in the middle of an append loses only that append,
which was not acknowledged (or, for a strike-off, repeats a message stored elsewhere). The
queue removes the journal once every message in it is stored elsewhere, and loads it back
at start like the sidecar.

The sidecar is written to ``<file>.tmp``, fsynced, renamed over the file, and the directory is
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
_ENTRY = struct.Struct(">QII")
_STRUCK = (1 << 64) - 1  # the due time of a journal record that strikes a message off
_ID_AT = 10  # the message id's offset in NSQ's encoding

Deferred = tuple[int, bytes]  # (due, wall-clock ns; message)


class SidecarError(Exception):
    """A sidecar file that does not hold a valid list of deferred messages."""


def sidecar_path(data_path: str, queue_name: str) -> str:
    return os.path.join(data_path, f"{queue_name}.diskqueue.deferred.dat")


def journal_of(sidecar: str) -> str:
    """The journal's path next to the sidecar at ``sidecar``."""
    return sidecar[:-len(".dat")] + ".jnl"


def append_journal(path: str, due: int, message: bytes) -> None:
    """Append one deferred message to the journal at ``path``. Raises ``OSError``."""
    _append(path, _ENTRY.pack(due, len(message), zlib.crc32(message)) + message)


def strike_journal(path: str, messages: Sequence[bytes]) -> None:
    """Note in the journal at ``path`` that ``messages`` (of it) are stored elsewhere now, in
    one write: they are not loaded back. Raises ``OSError``."""
    ids = [message[_ID_AT:_ID_AT + 16] for message in messages]
    _append(path, b"".join(_ENTRY.pack(_STRUCK, len(i), zlib.crc32(i)) + i for i in ids))


def _append(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        if os.write(fd, data) != len(data):
            raise OSError(f"short write to {path}")
    finally:
        os.close(fd)


def journal_size(path: str) -> int:
    """Bytes in the journal at ``path`` (0 when there is none). Raises ``OSError``."""
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def journal_records_after(path: str, offset: int) -> int:
    """Whole records (appends and strike-offs) of the journal at ``path`` from byte ``offset``
    on, a record boundary it had: after a crash, whether an append that began there got in.
    Never raises (0 when there is nothing to read)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return 0
    return len(_entries(data)[0])


def _entries(data: bytes) -> tuple[list[Deferred], int]:
    """The whole journal records at the start of ``data``, and where the first torn or
    corrupt one (or the end) is."""
    out: list[Deferred] = []
    pos = 0
    while pos + _ENTRY.size <= len(data):
        due, size, crc = _ENTRY.unpack_from(data, pos)
        message = data[pos + _ENTRY.size:pos + _ENTRY.size + size]
        if len(message) != size or zlib.crc32(message) != crc:
            break
        out.append((due, message))
        pos += _ENTRY.size + size
    return out, pos


def read_journal(path: str, log: logging.Logger) -> list[Deferred]:
    """The whole records of the journal at ``path`` ([] when there is none); never raises."""
    data = _read_bytes(path, log)
    if data is None:
        return []
    out, pos = _entries(data)
    if pos < len(data):
        log.error("deferred messages journal %s: torn or corrupt record at %d ignored", path, pos)
    struck = {message for due, message in out if due == _STRUCK}
    if struck:
        out = [(due, m) for due, m in out if due != _STRUCK and m[_ID_AT:_ID_AT + 16] not in struck]
    return out


def write_journal(path: str, records: Sequence[Deferred]) -> None:
    """Replace the journal at ``path`` with ``records`` durably; with none, remove it."""
    body = b"".join(_ENTRY.pack(due, len(message), zlib.crc32(message)) + message for due, message in records)
    if records:
        _replace(path, body)
    else:
        remove(path)


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
    if records:
        _replace(path, encode(records))
    else:
        remove(path)


def _replace(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "wb") as out:
            out.write(data)
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
    data = _read_bytes(path, log)
    if data is None:
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


def _read_bytes(path: str, log: logging.Logger) -> bytes | None:
    """The file's bytes; None when there is none or it cannot be read (logged)."""
    try:
        with open(path, "rb") as src:
            return src.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.error("failed to read deferred messages from %s - %s", path, exc)
        return None


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
