"""Spool files: how a micro-batch travels from the driver's consumer to the executors.

Theory of operation
-------------------
The source's driver-side runner holds the NSQ connections (only it can FIN, and only after
Spark committed the batch), but parsing rows in that one process would cap the stream at one
core. So the runner only *writes*: each batch's messages go, as the exact bytes NSQ delivered,
into a few spool files (one per partition), and executors parse those files into Arrow record
batches in parallel.

A spool file is::

    b"NSQSPOOL1\\n"  JSON header line {"topic", "channel", "nsqd": [address, ...]}  b"\\n"
    then per message:  [4B uint32 BE length][1B nsqd index][NSQ message encoding]

The message encoding is NSQ's own (``pynsqd.wire.message``: timestamp ns, attempts, 16-byte
id, body), so a body may hold any bytes, newlines included. Files are written to a temporary
name and renamed into place, so a reader sees a whole file or none; a file for a sequence
number that is reused after a restart is simply replaced.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator, Sequence
from typing import Any

from pynsqd.wire.message import BODY_OFFSET, HEADER

MAGIC = b"NSQSPOOL1\n"
RECORD = struct.Struct(">IB")

SCHEMA_DDL = "id string, attempts int, timestamp timestamp, body binary, nsqd string, topic string, channel string"
ROWS_PER_ARROW_BATCH = 65536


class SpoolError(Exception):
    """A spool file is missing, truncated or not a spool file."""


def write_spool(path: str, topic: str, channel: str, nsqds: Sequence[str],
                records: Sequence[tuple[int, bytes]]) -> None:
    """Write ``records`` (``(nsqd index, raw NSQ message)``) to ``path`` atomically."""
    header = json.dumps({"topic": topic, "channel": channel, "nsqd": list(nsqds)}).encode()
    parts = [MAGIC, header, b"\n"]
    pack = RECORD.pack
    for index, raw in records:
        parts.append(pack(len(raw), index))
        parts.append(raw)
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(b"".join(parts))
    os.replace(tmp, path)


def read_spool(path: str) -> tuple[dict[str, Any], list[tuple[int, bytes]]]:
    """Read a spool file back into its header and ``(nsqd index, raw message)`` records."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise SpoolError(f"spool file {path} is missing: executors must see the driver's spoolDir") from None
    if not data.startswith(MAGIC):
        raise SpoolError(f"{path} is not a spool file")
    end = data.find(b"\n", len(MAGIC))
    if end < 0:
        raise SpoolError(f"{path}: truncated header")
    header = json.loads(data[len(MAGIC):end])
    records: list[tuple[int, bytes]] = []
    pos, size, unpack = end + 1, len(data), RECORD.unpack_from
    while pos < size:
        if pos + RECORD.size > size:
            raise SpoolError(f"{path}: truncated record at byte {pos}")
        length, index = unpack(data, pos)
        pos += RECORD.size
        if pos + length > size or length < BODY_OFFSET:
            raise SpoolError(f"{path}: bad record length {length} at byte {pos}")
        records.append((index, data[pos:pos + length]))
        pos += length
    return header, records


def arrow_batches(path: str) -> Iterator[Any]:
    """Parse a spool file into ``pyarrow.RecordBatch``es in the source's schema (executor side)."""
    import pyarrow as pa

    header, records = read_spool(path)
    topic, channel, nsqds = header["topic"], header["channel"], header["nsqd"]
    unpack = HEADER.unpack_from
    for start in range(0, len(records), ROWS_PER_ARROW_BATCH):
        chunk = records[start:start + ROWS_PER_ARROW_BATCH]
        ids: list[str] = []
        attempts: list[int] = []
        stamps: list[int] = []
        bodies: list[bytes] = []
        where: list[str] = []
        for index, raw in chunk:
            ts, att, msg_id = unpack(raw)
            ids.append(msg_id.decode("ascii", "replace"))
            attempts.append(att)
            stamps.append(ts // 1000)
            bodies.append(raw[BODY_OFFSET:])
            where.append(nsqds[index])
        n = len(chunk)
        yield pa.RecordBatch.from_arrays([
            pa.array(ids, pa.string()),
            pa.array(attempts, pa.int32()),
            pa.array(stamps, pa.timestamp("us", tz="UTC")),
            pa.array(bodies, pa.binary()),
            pa.array(where, pa.string()),
            pa.array([topic] * n, pa.string()),
            pa.array([channel] * n, pa.string()),
        ], names=["id", "attempts", "timestamp", "body", "nsqd", "topic", "channel"])
