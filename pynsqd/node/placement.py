"""Which shard owns which topic: a table every process reads, persisted in the data path.

Theory of operation
-------------------
Hash-mod placement is stable but uneven: 32 topics over 2 shards land 16/16 only by luck
(and by the binomial law, ±3 is typical). Instead a topic is *assigned* the first time any
process meets it, to the shard owning the fewest topics (ties to the lowest index), and the
choice is appended to ``pynsqd.placement`` in the data path as one line ``<shard> <topic>\\n``.

Every process keeps the table in a dict. A name it does not know means "new since I last
looked": it takes an exclusive ``flock`` on the file, reads the lines appended since its last
read (the file is only ever appended to, so each process remembers its offset), and if the
topic is still unknown assigns it and appends the line, all under the lock. That is a few
syscalls once per new topic per process, never on the hot path of a known topic, and it needs
no round trip to the supervisor: the file in the page cache *is* the shared table. Lines are
written with one ``write`` and only complete lines are parsed.

At start the supervisor rewrites the table only when a line names a shard this run does
not have (the count shrank) or is malformed; then *every* topic is reassigned least-loaded,
in the order of its first line. A table made for fewer shards is kept as it is, and new
topics go to the new, emptier shards. A topic's data lives in per-name segments and disk
files, so any shard can take any topic over between runs.
"""

from __future__ import annotations

import fcntl
import os

FILENAME = "pynsqd.placement"


class Placement:
    """The topic → shard table of one node."""

    def __init__(self, data_dir: str, shards: int) -> None:
        self.path = os.path.join(data_dir, FILENAME)
        self.shards = shards
        self.owners: dict[str, int] = {}
        self.loads = [0] * shards
        self._offset = 0
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)

    def close(self) -> None:
        os.close(self._fd)

    def owner(self, topic: str) -> int:
        """The shard owning ``topic``; assigns one (least loaded) if it has none yet."""
        shard = self.owners.get(topic)
        if shard is not None:
            return shard
        if self.shards == 1:
            return 0
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            self._read_new()
            shard = self.owners.get(topic)
            if shard is None:
                shard = min(range(self.shards), key=lambda i: (self.loads[i], i))
                os.write(self._fd, b"%d %s\n" % (shard, topic.encode()))
                self._learn(topic, shard)
                self._offset = os.fstat(self._fd).st_size
            return shard
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _learn(self, topic: str, shard: int) -> None:
        old = self.owners.get(topic)
        if old is not None and 0 <= old < self.shards:
            self.loads[old] -= 1
        self.owners[topic] = shard
        self.loads[shard] += 1

    def _read_new(self) -> None:
        size = os.fstat(self._fd).st_size
        if size <= self._offset:
            return
        data = os.pread(self._fd, size - self._offset, self._offset)
        end = data.rfind(b"\n") + 1
        for line in data[:end].splitlines():
            shard_raw, _, name = line.partition(b" ")
            try:
                shard = int(shard_raw)
            except ValueError:
                continue
            if name and 0 <= shard < self.shards:
                self._learn(name.decode("utf-8", "surrogateescape"), shard)
        self._offset += end

    def rebalance_at_start(self) -> None:
        """Supervisor, before any shard runs: when a line names a shard past the last one (or
        is malformed), reassign every topic least-loaded and rewrite the file; else only
        read it."""
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            data = os.pread(self._fd, os.fstat(self._fd).st_size, 0)
            names: list[str] = []
            stale = False
            for line in data.splitlines():
                shard_raw, _, raw_name = line.partition(b" ")
                if not raw_name:
                    continue
                if not shard_raw.isdigit() or int(shard_raw) >= self.shards:
                    stale = True
                names.append(raw_name.decode("utf-8", "surrogateescape"))
            if not stale:
                self._read_new()
                return
            self.owners.clear()
            self.loads = [0] * self.shards
            lines = []
            for name in dict.fromkeys(names):
                shard = min(range(self.shards), key=lambda i: (self.loads[i], i))
                self._learn(name, shard)
                lines.append(b"%d %s\n" % (shard, name.encode("utf-8", "surrogateescape")))
            os.ftruncate(self._fd, 0)
            os.write(self._fd, b"".join(lines))
            self._offset = os.fstat(self._fd).st_size
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
