"""The node's topics as its shards report them, and ``nsqd.dat`` kept up to date off the loop.

``TopicTable`` holds each shard's topics (``TopicRecord`` by name): a shard sends its whole
list at start and exit (``Snapshot``) and, in between, only the topics a loop turn changed
(``Updated``), so a change costs the same with ten topics or ten thousand. Each topic's entry
of ``nsqd.dat`` is encoded once, when it changes (``metadata.encode_topic``); the file is
those pieces joined.

``MetadataWriter`` replaces ``nsqd.dat`` (temp file, fsync, rename: ``metadata.save``) on one
worker thread, so the supervisor's loop — which proxies admin calls and answers stats — never
waits for the disk. Changes coalesce: the bytes are taken on the loop when a write starts, and
whatever changes while it runs is written by one more write right after it. Writes run one at
a time in order, so an older file never replaces a newer one; ``flush`` (the last save, at
exit) waits for the write in progress and then writes inline.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable

import orjson

from pynsqd.node import metadata
from pynsqd.node.metadata import TopicRecord

log = logging.getLogger("pynsqd.supervisor")


class TopicTable:
    """Each shard's topics, with their ``nsqd.dat`` entries encoded once per change."""

    def __init__(self, shards: int) -> None:
        # per shard: name → (record, its entry of the file; None for an ephemeral topic)
        self.shards: list[dict[str, tuple[TopicRecord, orjson.Fragment | None]]] = [{} for _ in range(shards)]

    def replace(self, shard: int, topics: list[TopicRecord]) -> None:
        """The shard's whole list (at its start or exit)."""
        self.shards[shard] = {}
        self.update(shard, topics, [])

    def update(self, shard: int, topics: list[TopicRecord], deleted: list[str]) -> None:
        """Some of the shard's topics now read ``topics``; those named ``deleted`` are gone."""
        mine = self.shards[shard]
        for name in deleted:
            mine.pop(name, None)
        for topic in topics:
            mine[topic.name] = (topic, metadata.encode_topic(topic))

    def records(self) -> list[TopicRecord]:
        return [t for mine in self.shards for t, _ in mine.values()]

    def registrations(self) -> list[tuple[str, list[str]]]:
        """Topics and their channels, for lookupd."""
        return [(t.name, [c.name for c in t.channels]) for t in self.records()]

    def encode(self) -> bytes:
        """``nsqd.dat``'s bytes."""
        return metadata.encode_pieces(p for mine in self.shards for _, p in mine.values() if p is not None)


class MetadataWriter:
    """Replaces ``nsqd.dat`` with ``encode()`` on a worker thread, coalescing changes."""

    def __init__(self, data_dir: str, encode: Callable[[], bytes]) -> None:
        self.data_dir = data_dir
        self.encode = encode
        self.failing = False  # the last write failed (logged once per spell)
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="nsqd.dat")
        self._scheduled = False  # a write starts at the end of this loop turn
        self._running: asyncio.Future[None] | None = None
        self._again = False  # changed while a write ran
        self._closed = False  # flushed: writes are inline from now on

    def schedule(self) -> None:
        """Something changed: write it soon (once per loop turn, one write at a time)."""
        if self._closed:
            self.save_now()
        elif self._running is not None:
            self._again = True
        elif not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._start)

    def _start(self) -> None:
        self._scheduled = False
        if self._closed:  # ``flush`` wrote it
            return
        self._again = False
        loop = asyncio.get_running_loop()
        self._running = loop.run_in_executor(self._pool, metadata.save, self.data_dir, self.encode())
        self._running.add_done_callback(self._written)

    def _written(self, future: asyncio.Future[None]) -> None:
        self._running = None
        exc = future.exception() if not future.cancelled() else None
        self._report(exc)
        if self._again:
            self._start()

    def _report(self, exc: BaseException | None) -> None:
        if exc is not None:  # kept in memory; written with the next change or at exit
            if not self.failing:
                log.error("failed to persist metadata - %s", exc)
            self.failing = True
        elif self.failing:
            log.info("metadata persisted again")
            self.failing = False

    def save_now(self) -> None:
        """Write inline (at start, before any shard runs and nothing is being written)."""
        try:
            metadata.save(self.data_dir, self.encode())
        except OSError as exc:
            self._report(exc)
        else:
            self._report(None)

    async def flush(self) -> None:
        """The last write: wait for the one in progress, then write what is current; its
        failure is always logged. The thread is released."""
        while self._running is not None:
            await asyncio.wait([self._running])
        self._closed = True
        self._again = False
        self.failing = False
        self.save_now()
        self._pool.shutdown(wait=False)
