"""The streaming source: ``spark.readStream.format("nsq")``, at-least-once end to end.

Theory of operation
-------------------
Spark runs the methods of a ``DataSourceStreamReader`` in two kinds of process. The offset
methods (``latestOffset``, ``partitions``, ``commit``) run in one long-lived driver-side
runner per query: the only persistent Python object, so it owns the NSQ consumer (a
``Feed``: the nsqds found directly or through lookupd, with as many connections to each as
``maxInFlight`` needs at its ``--max-rdy-count``). ``read`` runs on
executors in fresh, unpickled copies that share nothing with the runner.

Offsets are ``{"seq": n, "hb": k}``. ``latestOffset`` takes up to ``maxBatch`` (or the
engine's ``ReadMaxRows``) buffered messages — as the client delivered them, ``MessageBatch``es
of undecoded frames — frames them into ``partitions`` parts (``parts.py``) keyed by the new
``seq``, serves them from memory (``server.py``) and returns ``{"seq": n + 1, "hb": 0}``; the
messages stay in flight, held. ``partitions(start, end)`` lists those parts with the runner's
address; executors fetch them over TCP and parse them into Arrow batches in parallel, so no
storage is shared between the driver and the executors. Spark calls ``commit(end)`` while
planning the *next* batch, after the sink's commit and the ``commits/`` log entry for ``end``
are durable: only then does the runner FIN the batch's messages and stop serving its parts.
So:

- a crash before ``commit`` leaves the messages un-FINed: nsqd redelivers them (at once when
  the connection drops, else after their timeout), and the restarted query re-plans the logged
  batch with no parts (a new runner holds none of its predecessor's), so nothing is read twice
  from the runner; nothing is lost, some ids may arrive twice (dedupe on ``id``, or the
  pipeline's ``--dedupe-window``);
- the last batch before an idle period would never be committed (no next batch), so when
  nothing new arrived and the engine has caught up with a batch that is not yet committed, the
  runner bumps ``hb`` once: an empty batch whose planning commits the one before;
- a batch stays in flight until the next batch is planned, so ``maxInFlight`` must exceed two
  batches (checked in ``options.py``), and the Feed TOUCHes held messages so batches longer
  than the message timeout keep them.

``latestOffset`` never blocks for data, except the runner's first call, which waits up to
``FIRST_BATCH_WAIT`` for the first messages (and ``FIRST_BATCH_SETTLE`` more for the rest of
a batch) so the first batch carries data instead of costing an empty cycle, yet starts soon.
Until ``minBatch`` messages are buffered (Kafka's ``minOffsetsPerTrigger``; by default
``maxBatch``, a full batch) it answers "nothing new" — Spark asks again after its
polling delay, 10 ms — unless ``maxBatchDelay`` passed since the last batch was planned: a
backlog goes in full batches, and a slower stream in one batch per delay rather than one per
Spark cycle (fewer, larger output files; Spark's fixed cost per batch paid less often), each
message waiting at most the delay. ``minBatch=0`` takes whatever arrived during the last
cycle. The previous batch stays uncommitted meanwhile, which ``maxInFlight`` > 2 x
``maxBatch`` leaves room for. ``trace.py`` records each call (and each executor ``read``)
when ``PYNSQD_SPARK_TRACE`` is set.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from pynsqd.spark import trace
from pynsqd.spark.options import SourceOptions
from pynsqd.spark.parts import Segment, arrow_batches, encode
from pynsqd.spark.server import PartServer, fetch

# A Trigger.AvailableNow run waits this long for the first messages, and counts the topic as
# drained after a quiet period this long. Both cover a slow start on a busy host (connect, SUB,
# a new connection's RDY 1 until its first delivery raises it): a short quiet period can end a
# run after its first message under load. The cost is this many idle seconds at the end of a
# batch-style run.
AVAILABLE_NOW_WAIT = 5.0
AVAILABLE_NOW_QUIET = 5.0
# The runner's first latestOffset comes right after its consumer started connecting, so it would
# find nothing and Spark would run an empty batch 0 (a whole micro-batch cycle) before the
# first data. It waits up to this long for the first messages instead ...
FIRST_BATCH_WAIT = 0.5
# ... and once messages come, this much longer for more of a batch (a backlog's first runs
# arrive over a few hundred ms as the connections get their RDY): a first batch that starts
# early commits the first rows early.
FIRST_BATCH_SETTLE = 0.1
# A part is a Spark task (one output file per partition value, a Python worker's start-up):
# a batch smaller than two of these, a slow stream's, goes in fewer parts.
MIN_PART = 10_000


class PartPartition(InputPartition):
    """One part of one batch: where an executor's ``read`` fetches it, and its key there."""

    def __init__(self, address: str, key: str) -> None:
        super().__init__(key)
        self.address = address
        self.key = key

    @property
    def name(self) -> str:
        return self.key.rpartition("/")[2]


class NSQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Driver side: consumer, part server, FIN on commit. Executor side: fetch and parse parts."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        # Everything below lives only in the driver-side runner; pickled copies for executors
        # carry it empty (it is created lazily, never in __init__).
        self._feed: Any = None
        self._server: PartServer | None = None
        self._seq = 0
        self._hb = 0
        self._pending: dict[int, tuple[list[str], list[Any]]] = {}
        self._available_now = False
        self._drained = False
        self._first = True
        self._wait_from: float | None = None  # minBatch: when the wait for a fuller batch began

    def __getstate__(self) -> dict[str, Any]:
        return {"opts": self.opts}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["opts"])  # type: ignore[misc]

    # -- driver-side runner ---------------------------------------------------------------

    def _ensure_feed(self) -> Any:
        if self._feed is None:
            from pynsqd.spark.feed import Feed

            self._server = PartServer(self.opts.driver_host, self.opts.driver_port)
            self._feed = Feed(self.opts)
            self._feed.start()
        return self._feed

    def initialOffset(self) -> dict:
        trace.event("initial")
        return {"seq": 0, "hb": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.opts.max_batch)

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = True
        self._ensure_feed().wait_for_messages(AVAILABLE_NOW_WAIT)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        trace.event("latest.in", start=start["seq"])
        end = self._latest_offset(start, limit)
        trace.event("latest.out", end=end["seq"], hb=end["hb"])
        return end

    def _latest_offset(self, start: dict, limit: ReadLimit) -> dict:
        feed = self._ensure_feed()
        if (start["seq"], start["hb"]) > (self._seq, self._hb):
            # A restart on a checkpoint: continue after the logged offsets.
            self._seq, self._hb = start["seq"], start["hb"]
        want = self.opts.max_batch
        if isinstance(limit, ReadMaxRows):
            want = min(want, limit.max_rows)
        elif isinstance(limit, ReadAllAvailable):
            want = self.opts.max_in_flight
        if self._first and not self._drained:
            self._first = False
            if feed.wait_for_messages(FIRST_BATCH_WAIT):
                feed.wait_for_count(want, FIRST_BATCH_SETTLE)
        elif self._too_few(feed, want):
            return {"seq": self._seq, "hb": self._hb}  # no new batch yet: Spark asks again
        held = [] if self._drained else feed.take(want)
        if not held and self._available_now and not self._drained:
            feed.wait_for_messages(AVAILABLE_NOW_QUIET)
            held = feed.take(want)
            self._drained = not held
        if trace.enabled():
            trace.event("latest.took", rows=sum(len(b) for b in held), batches=len(held))
        if held:
            self._seq += 1
            self._hb = 0
            self._pending[self._seq] = (self._serve(self._seq, held), held)
            self._wait_from = time.monotonic()  # the next batch waits from here
            trace.event("served", seq=self._seq)
        elif self._pending and start == {"seq": self._seq, "hb": self._hb}:
            self._hb += 1  # heartbeat: an empty batch whose planning commits the last one
            self._wait_from = None
        return {"seq": self._seq, "hb": self._hb}

    def _too_few(self, feed: Any, want: int) -> bool:
        """``minBatch``: fewer than that are buffered, and this wait began less than
        ``maxBatchDelay`` ago. The wait begins when the last batch was planned, or, after an
        idle period with every batch committed, at the first call that finds messages: so a
        message waits at most the delay (or the cycle it arrived in, if longer) before its
        batch is planned. An uncommitted batch with nothing buffered waits too, for the
        heartbeat that commits it. Never in an availableNow run, which ends on a quiet period."""
        opts = self.opts
        if not opts.min_batch or self._available_now:
            return False
        buffered = feed.buffered
        if not buffered and not self._pending:
            self._wait_from = None  # idle, all committed: the next wait starts with data
            return False
        now = time.monotonic()
        if self._wait_from is None:
            self._wait_from = now
        return buffered < min(opts.min_batch, want) and now - self._wait_from < opts.max_batch_delay_ms / 1000

    def _serve(self, seq: int, held: list[Any]) -> list[str]:
        """Frame the batches ``held`` (``MessageBatch``es) into up to ``partitions`` parts of
        about equal message counts, at least ``MIN_PART`` each, slicing batches at the
        boundaries (no per-message work), and serve them; returns their keys."""
        nsqds: dict[str, int] = {}
        total = sum(len(b) for b in held)
        parts = max(1, min(self.opts.partitions, total // MIN_PART))
        size = -(-total // parts)
        files: list[list[Segment]] = [[]]
        room = size
        for batch in held:
            index = nsqds.setdefault(batch.nsqd_address, len(nsqds))
            offsets, frames = batch.offsets, batch.frames
            while len(offsets) > 1:
                if room == 0:
                    files.append([])
                    room = size
                take = min(room, len(offsets) - 1)
                files[-1].append((index, frames, offsets[:take + 1]))
                offsets = offsets[take:]
                room -= take
        assert self._server is not None
        keys = []
        for i, segments in enumerate(files):
            key = self._server.key(f"{seq:012d}-{i:03d}")
            self._server.add(key, encode(self.opts.topic, self.opts.channel, list(nsqds), segments))
            keys.append(key)
        return keys

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        trace.event("partitions", start=start["seq"], end=end["seq"])
        out: list[InputPartition] = []
        for seq in range(start["seq"] + 1, end["seq"] + 1):
            keys, _ = self._pending.get(seq, ([], []))
            out.extend(PartPartition(self._server.address, key) for key in keys if self._server is not None)
        return out

    def commit(self, end: dict) -> None:
        trace.event("commit.in", end=end["seq"])
        self._commit(end)
        trace.event("commit.out", end=end["seq"])

    def _commit(self, end: dict) -> None:
        done = sorted(seq for seq in self._pending if seq <= end["seq"])
        if not done:
            return
        held = [m for seq in done for m in self._pending[seq][1]]
        self._feed.finish(held)
        assert self._server is not None
        for seq in done:
            for key in self._pending.pop(seq)[0]:
                self._server.drop(key)

    def stop(self) -> None:
        if self._feed is not None:
            self._feed.close()
            self._feed = None
        if self._server is not None:
            self._server.close()
            self._server = None

    # -- executors --------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, PartPartition)
        trace.event("read.in", part=partition.name)
        rows = 0
        for batch in arrow_batches(partition.name, fetch(partition.address, partition.key)):
            rows += batch.num_rows
            yield batch
        trace.event("read.out", part=partition.name, rows=rows)
