"""The baseline for ``bench_spark.py --source both``: the same NSQ stream through a
``SimpleDataSourceStreamReader``, Spark's simple streaming reader API.

Spark's simple reader builds every row in its one driver-side runner process: ``read(start)``
returns the batch's rows as a list of tuples, and Spark ships them to the JVM with the plan.
This class runs it against pynsqd in the same bench run as the ``nsq`` source, so the two
designs are compared on the same broker, machine and load.

It is a faithful at-least-once source, not a stub: the same ``Feed`` (batch consumer, TOUCH of
held messages), the same offsets (``{"seq", "hb"}``), FIN in ``commit(end)`` after Spark made
the batch durable, the heartbeat offset that commits the last batch before an idle period,
``maxBatch`` messages at most per batch, and the same schema. What it lacks against the ``nsq``
source is the design difference being measured: rows are decoded in the runner (one Python
tuple and ``datetime`` per message) instead of framed, served to executors and parsed there with
Arrow. ``readBetweenOffsets`` (a replay after a restart, on an executor) returns nothing, as
the ``nsq`` source's replay does: nsqd redelivers the un-FINed messages. Registered as
``format("nsq_simple")`` by ``register``; Spark's Python workers must be able to import this
module (``bench_spark.py`` puts the repository on their ``PYTHONPATH``).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from pyspark.sql.datasource import DataSource, SimpleDataSourceStreamReader
from pyspark.sql.types import StructType

from pynsqd.spark.options import SourceOptions
from pynsqd.spark.parts import SCHEMA_DDL
from pynsqd.spark.source import FIRST_BATCH_SETTLE, FIRST_BATCH_WAIT

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class SimpleNSQDataSource(DataSource):
    """``spark.readStream.format("nsq_simple")``: the ``nsq`` source's options, the simple reader."""

    @classmethod
    def name(cls) -> str:
        return "nsq_simple"

    def schema(self) -> str:
        return SCHEMA_DDL

    def simpleStreamReader(self, schema: StructType) -> SimpleDataSourceStreamReader:
        return SimpleNSQReader(SourceOptions.parse(self.options))


class SimpleNSQReader(SimpleDataSourceStreamReader):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._feed: Any = None  # created in the runner on first use, never pickled
        self._seq = 0
        self._hb = 0
        self._pending: dict[int, list[Any]] = {}  # seq → its MessageBatches, until committed
        self._first = True

    def __getstate__(self) -> dict[str, Any]:
        return {"opts": self.opts}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["opts"])  # type: ignore[misc]

    def initialOffset(self) -> dict:
        return {"seq": 0, "hb": 0}

    def read(self, start: dict) -> tuple[Iterator[tuple], dict]:
        if self._feed is None:
            from pynsqd.spark.feed import Feed

            self._feed = Feed(self.opts)
            self._feed.start()
        if (start["seq"], start["hb"]) > (self._seq, self._hb):
            self._seq, self._hb = start["seq"], start["hb"]  # a restart on a checkpoint
        if self._first:
            self._first = False
            if self._feed.wait_for_messages(FIRST_BATCH_WAIT):
                self._feed.wait_for_count(self.opts.max_batch, FIRST_BATCH_SETTLE)
        held = self._feed.take(self.opts.max_batch)
        if held:
            self._seq += 1
            self._hb = 0
            self._pending[self._seq] = held
            return iter(self._rows(held)), {"seq": self._seq, "hb": 0}
        if self._pending and start == {"seq": self._seq, "hb": self._hb}:
            self._hb += 1  # heartbeat: an empty batch whose planning commits the last one
        return iter([]), {"seq": self._seq, "hb": self._hb}

    def _rows(self, held: list[Any]) -> list[tuple]:
        topic, channel = self.opts.topic, self.opts.channel
        rows = []
        for batch in held:
            nsqd = batch.nsqd_address
            for ts, attempts, msg_id, body in batch:
                # NSQ's nanoseconds, to the microseconds Spark keeps, as the Arrow path casts them
                stamp = _EPOCH + timedelta(microseconds=ts // 1000)
                rows.append((msg_id.decode("ascii"), attempts, stamp, body, nsqd, topic, channel))
        return rows

    def readBetweenOffsets(self, start: dict, end: dict) -> Iterator[tuple]:
        return iter([])

    def commit(self, end: dict) -> None:
        done = sorted(seq for seq in self._pending if seq <= end["seq"])
        if done:
            self._feed.finish([b for seq in done for b in self._pending.pop(seq)])


def register(spark: Any) -> None:
    spark.dataSource.register(SimpleNSQDataSource)

