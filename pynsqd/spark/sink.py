"""The sink: ``df.write.format("nsq")`` and ``df.writeStream.format("nsq")``.

Theory of operation
-------------------
Spark calls ``write`` on executors, once per partition (per micro-batch when streaming), with
Arrow record batches. Each row's ``body`` (binary or string) is published to the row's
``topic`` column when the frame has one, else to the ``topic`` option. The rows never become
Python objects: Arrow kernels prefix each body with its 4-byte big-endian size (``framed``),
which makes the column's data buffer the MPUB body itself, and the batch is cut into MPUB
commands that stay within nsqd's limits (``maxBodySize`` for the whole command, ``maxMsgSize``
per message, nsqd's defaults) by bisecting the column's offsets: Python work per command, not
per row. They go out on the process's pooled ``Producer`` (executor Python workers are reused)
with up to ``WINDOW`` commands awaiting their ``OK`` at once; ``write`` returns only when every
one was confirmed, and any error fails the task, so Spark retries it. NSQ has no
transactions: ``commit``/``abort`` only count, and delivery is at-least-once (a retried task
or batch publishes its rows again).
"""

from __future__ import annotations

import asyncio
import bisect
import sys
import threading
from array import array
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage

from pynsqd.client import Producer
from pynsqd.spark import trace
from pynsqd.spark.loopthread import shared
from pynsqd.spark.options import SinkOptions

WINDOW = 4  # MPUB commands awaiting OK at once, per task
MPUB_OVERHEAD = 4  # the message count; each message adds its 4-byte size

_producers: dict[str, Producer] = {}


@dataclass
class Published(WriterCommitMessage):
    rows: int


def check_schema(names: list[str]) -> None:
    if "body" not in names:
        raise ValueError(f"the nsq sink needs a 'body' column (binary or string); got {names}")


def _as_binary(column: Any) -> Any:
    import pyarrow as pa

    if not any(is_type(column.type) for is_type in (pa.types.is_string, pa.types.is_large_string,
                                                    pa.types.is_binary, pa.types.is_large_binary)):
        raise ValueError(f"the nsq sink's body column must be binary or string, not {column.type}")
    return column.cast(pa.binary()).fill_null(b"")


def framed(bodies: Any, opts: SinkOptions) -> Any:
    """``bodies`` (a binary array) as a binary array of ``[4-byte big-endian size][body]``
    values: its data buffer is an MPUB body without the count."""
    import pyarrow as pa
    import pyarrow.compute as pc

    sizes = pc.binary_length(bodies)
    if len(sizes) and (longest := pc.max(sizes).as_py()) > opts.max_msg_size:
        raise ValueError(f"a body of {longest} bytes exceeds maxMsgSize={opts.max_msg_size}")
    swapped = array("i")
    swapped.frombytes(memoryview(sizes.buffers()[1])[4 * sizes.offset:4 * (sizes.offset + len(sizes))])
    if sys.byteorder == "little":
        swapped.byteswap()
    prefixes = pa.Array.from_buffers(pa.binary(4), len(sizes), [None, pa.py_buffer(swapped)])
    return pc.binary_join_element_wise(prefixes.cast(pa.binary()), bodies, b"")


def chunks(messages: Any, opts: SinkOptions) -> Iterator[tuple[int, memoryview]]:
    """``(count, bytes)`` of each MPUB command's worth of ``messages`` (from ``framed``): as many
    as fit in ``maxBodySize`` with the count, and at least one."""
    n = len(messages)
    if not n:
        return
    offsets = memoryview(messages.buffers()[1]).cast("i")[messages.offset:messages.offset + n + 1]
    data = memoryview(messages.buffers()[2])
    room = opts.max_body_size - MPUB_OVERHEAD
    start = 0
    while start < n:
        end = max(start + 1, bisect.bisect_right(offsets, offsets[start] + room, start + 1, n + 1) - 1)
        yield end - start, data[offsets[start]:offsets[end]]
        start = end


async def _publish(opts: SinkOptions, topic: str, count: int, payload: memoryview) -> None:
    """One MPUB on the process's pooled producer for ``opts.nsqd``; a failure drops it."""
    producer = _producers.get(opts.nsqd)
    if producer is None:
        producer = _producers[opts.nsqd] = Producer(opts.nsqd)
    try:
        await producer.multi_publish_framed(topic, count, payload)
    except BaseException:
        if _producers.get(opts.nsqd) is producer:
            del _producers[opts.nsqd]
        await producer.close()
        raise


def _by_topic(batch: Any, bodies: Any, opts: SinkOptions) -> list[tuple[str, Any]]:
    """``(topic, bodies)`` groups of a batch: by its ``topic`` column (a null or empty one is
    the ``topic`` option), else all to the ``topic`` option; in row order within a topic."""
    import pyarrow.compute as pc

    names = batch.schema.names
    if "topic" not in names:
        if not opts.topic:
            raise ValueError("the nsq sink needs the topic option or a 'topic' column")
        return [(opts.topic, bodies)]
    topics = batch.column(names.index("topic")).cast("string")
    topics = pc.if_else(pc.equal(topics, ""), None, topics)
    if opts.topic:
        topics = topics.fill_null(opts.topic)
    elif topics.null_count:
        raise ValueError("a row has no topic and the topic option is not set")
    unique = pc.unique(topics).to_pylist()
    if len(unique) == 1:
        return [(unique[0], bodies)]
    return [(topic, bodies.filter(pc.equal(topics, topic))) for topic in unique]


def publish_batches(opts: SinkOptions, batches: Iterator[Any]) -> int:
    """Publish every row of ``batches``; return the row count once every MPUB was confirmed.
    Up to ``WINDOW`` MPUBs are unanswered at once, across batches: the next batch is framed
    while nsqd stores the last one. The first error fails the call (and so the task)."""
    lt = shared()
    window = threading.Semaphore(WINDOW)
    sent: list[Future[None]] = []
    rows = 0
    trace.event("write.in")
    try:
        for batch in batches:
            trace.event("write.batch", rows=batch.num_rows)
            names = batch.schema.names
            check_schema(names)
            bodies = _as_binary(batch.column(names.index("body")))
            rows += len(bodies)
            for topic, group in _by_topic(batch, bodies, opts):
                for count, payload in chunks(framed(group, opts), opts):
                    window.acquire()
                    future = asyncio.run_coroutine_threadsafe(_publish(opts, topic, count, payload), lt.loop)
                    future.add_done_callback(lambda _: window.release())
                    sent.append(future)
            while sent and sent[0].done():
                sent.pop(0).result()  # an error surfaces at the next batch
    except BaseException:
        for future in sent:
            future.cancel()
        raise
    trace.event("write.sent", rows=rows)
    for future in sent:
        future.result()
    trace.event("write.out", rows=rows)
    return rows


class NSQWriter(DataSourceArrowWriter):
    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return Published(publish_batches(self.opts, iterator))


class NSQStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return Published(publish_batches(self.opts, iterator))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass
