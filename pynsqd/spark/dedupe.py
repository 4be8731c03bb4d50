"""Effectively-once output: drop the rows of messages that were already written.

Theory of operation
-------------------
The source is at-least-once: a message whose batch Spark committed but whose FIN never
reached nsqd (a driver crash between the two) comes back, with the same ``id``, and a batch
that was not committed comes back whole after a restart. ``dedupe(df, window)`` keeps only the
first row of each ``id`` within ``window``, with Spark's watermark-bounded streaming
deduplication (``dropDuplicatesWithinWatermark``): its state lives in the query's checkpoint
and is committed with each batch, so an id written by a committed batch stays known across a
crash of the driver or an executor and a restart on the checkpoint, and an id of a batch that
was not committed is not (the state rolls back with the batch).

The watermark runs on the time each row was *read* — the micro-batch's timestamp, which Spark
logs with the batch's offsets and reuses when it re-runs it — not on the message's
``timestamp``: NSQ does not deliver in publish order (several nsqds, a memory and a disk queue
per channel, requeues), and an event-time watermark would drop as late any message older than
the newest one seen minus the window, which is data loss. So an id is remembered for
``window`` after it was first read, and no row is ever dropped for its age. Spark keeps that
state on the executors: about one entry per id read during the window (RocksDB, set with
``spark.sql.streaming.stateStore.providerClass``, keeps large windows off the JVM heap).
"""

from __future__ import annotations

from typing import Any

SEEN = "__nsq_read_at"


def dedupe(df: Any, window: str) -> Any:
    """``df`` (the ``nsq`` source's stream) without the rows whose ``id`` was already read
    within ``window`` (a Spark interval, e.g. ``"10 minutes"``)."""
    from pyspark.sql import functions as F

    return (df.withColumn(SEEN, F.current_timestamp()).withWatermark(SEEN, window)
            .dropDuplicatesWithinWatermark(["id"]).drop(SEEN))
