"""The supervisor's table of topics (whole lists and per-turn updates from the shards) and the
writer that keeps ``nsqd.dat`` up to date off the loop."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from pathlib import Path

import pytest

from pynsqd.node import metadata
from pynsqd.node.metadata import ChannelRecord, TopicRecord
from pynsqd.supervisor.topictable import MetadataWriter, TopicTable
from tests.conftest import run_async


def T(name: str, paused: bool = False, *channels: tuple[str, bool]) -> TopicRecord:
    return TopicRecord(name, paused, [ChannelRecord(c, p) for c, p in channels])


def test_updates_replace_topics_and_deletions_remove_them() -> None:
    table = TopicTable(2)
    table.replace(0, [T("a"), T("b", False, ("x", False))])
    table.update(1, [T("c")], [])
    table.update(0, [T("b", True, ("x", False), ("y", True))], ["a"])
    table.update(1, [T("gone#ephemeral", False, ("c", False))], ["never-known"])
    assert table.records() == [T("b", True, ("x", False), ("y", True)), T("c"),
                               T("gone#ephemeral", False, ("c", False))]
    assert table.registrations() == [("b", ["x", "y"]), ("c", []), ("gone#ephemeral", ["c"])]
    assert metadata.decode(table.encode()) == [T("b", True, ("x", False), ("y", True)), T("c")]
    assert table.encode() == metadata.encode(table.records())
    table.replace(0, [T("d", False, ("e#ephemeral", False), ("f", True))])  # a shard's whole list again
    assert metadata.decode(table.encode()) == [T("d", False, ("f", True)), T("c")]


def test_a_name_two_shards_report_stays_until_both_drop_it() -> None:
    table = TopicTable(2)
    table.update(0, [T("t", False, ("a", False))], [])
    table.update(1, [T("t", False, ("b", False))], [])
    table.update(0, [], ["t"])
    assert metadata.decode(table.encode()) == [T("t", False, ("b", False))]


def _read(path: Path) -> list[TopicRecord]:
    return metadata.load(str(path))


def test_the_writer_ends_with_the_last_state_and_coalesces(tmp_path: Path) -> None:
    table = TopicTable(1)
    writer = MetadataWriter(str(tmp_path), table.encode)
    writes: list[bytes] = []

    def counting_encode() -> bytes:
        writes.append(table.encode())
        return writes[-1]
    writer.encode = counting_encode
    disk = threading.Event()  # the writer's thread is held until set: a slow disk

    async def main() -> None:
        writer._pool.submit(disk.wait)
        for i in range(300):  # one change per loop turn while the first write waits for the disk
            table.update(0, [T(f"t{i:03d}")], [])
            writer.schedule()
            await asyncio.sleep(0)
        disk.set()
        await _settled(writer)
        assert [t.name for t in _read(tmp_path)] == [f"t{i:03d}" for i in range(300)]
        assert len(writes) == 2  # the first change, then everything made while it was written
        table.update(0, [], ["t000"])
        writer.schedule()
        await writer.flush()  # the exit's last save
        assert len(_read(tmp_path)) == 299
        table.update(0, [], ["t001"])
        writer.schedule()  # after the flush: written at once
        assert len(_read(tmp_path)) == 298

    run_async(main())
    assert [n for n in os.listdir(tmp_path) if n != "nsqd.dat"] == []  # no temp file left


async def _settled(writer: MetadataWriter) -> None:
    """Wait until no write is in progress or due (each write is awaited, not timed)."""
    while writer._running is not None or writer._scheduled:
        if writer._running is not None:
            await asyncio.wait([writer._running])
        else:
            await asyncio.sleep(0)


def test_a_failing_write_is_logged_once_and_its_recovery_too(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    table = TopicTable(1)
    missing = tmp_path / "not-yet"
    writer = MetadataWriter(str(missing), table.encode)

    async def main() -> None:
        caplog.set_level(logging.INFO, "pynsqd.supervisor")
        for i in range(3):
            table.update(0, [T(f"t{i}")], [])
            writer.schedule()
            await _settled(writer)
        assert writer.failing
        missing.mkdir()
        table.update(0, [T("t3")], [])
        writer.schedule()
        await _settled(writer)
        assert not writer.failing
        await writer.flush()

    run_async(main())
    messages = [r.getMessage() for r in caplog.records]
    assert sum(m.startswith("failed to persist metadata") for m in messages) == 1
    assert messages.count("metadata persisted again") == 1
    assert [t.name for t in _read(missing)] == ["t0", "t1", "t2", "t3"]
