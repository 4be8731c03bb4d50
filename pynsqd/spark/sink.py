"""The sink: ``df.write.format("nsq")`` and ``df.writeStream.format("nsq")``.

Theory of operation
-------------------
Spark calls ``write`` on executors, once per partition (per micro-batch when streaming), with
Arrow record batches. Each row's ``body`` (binary or string) is published to the row's
``topic`` column when the frame has one, else to the ``topic`` option. Bodies are gathered per
topic into MPUB chunks that stay within nsqd's limits (``maxBodySize`` for the whole command,
``maxMsgSize`` per message, nsqd's defaults), sent on the process's pooled ``Producer``
(executor Python workers are reused) with up to ``WINDOW`` chunks awaiting their ``OK`` at
once; ``write`` returns only when every chunk was confirmed, and any error fails the task, so
Spark retries it. NSQ has no transactions: ``commit``/``abort`` only count, and delivery is
at-least-once (a retried task or batch publishes its rows again).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage

from pynsqd.client import Producer
from pynsqd.spark.loopthread import shared
from pynsqd.spark.options import SinkOptions

WINDOW = 4  # MPUB chunks awaiting OK at once, per task
MPUB_OVERHEAD = 4  # the message count; each message adds its 4-byte size

_producers: dict[str, Producer] = {}


@dataclass
class Published(WriterCommitMessage):
    rows: int


def check_schema(names: list[str]) -> None:
    if "body" not in names:
        raise ValueError(f"the nsq sink needs a 'body' column (binary or string); got {names}")


def _bodies(column: Any) -> list[bytes]:
    import pyarrow as pa

    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return [b"" if v is None else v.encode() for v in column.to_pylist()]
    if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
        return [b"" if v is None else v for v in column.to_pylist()]
    raise ValueError(f"the nsq sink's body column must be binary or string, not {column.type}")


def chunks(bodies: list[bytes], opts: SinkOptions) -> Iterator[list[bytes]]:
    """Split ``bodies`` into MPUB-sized lists (within max body and message sizes)."""
    chunk: list[bytes] = []
    size = MPUB_OVERHEAD
    for body in bodies:
        if len(body) > opts.max_msg_size:
            raise ValueError(f"a body of {len(body)} bytes exceeds maxMsgSize={opts.max_msg_size}")
        if chunk and size + 4 + len(body) > opts.max_body_size:
            yield chunk
            chunk, size = [], MPUB_OVERHEAD
        chunk.append(body)
        size += 4 + len(body)
    if chunk:
        yield chunk


async def _publish(opts: SinkOptions, work: list[tuple[str, list[bytes]]]) -> None:
    producer = _producers.get(opts.nsqd)
    if producer is None:
        producer = _producers[opts.nsqd] = Producer(opts.nsqd)
    sem = asyncio.Semaphore(WINDOW)

    async def one(topic: str, bodies: list[bytes]) -> None:
        async with sem:
            await producer.multi_publish(topic, bodies)

    try:
        await asyncio.gather(*(one(topic, bodies) for topic, bodies in work))
    except BaseException:
        _producers.pop(opts.nsqd, None)
        await producer.close()
        raise


def publish_batches(opts: SinkOptions, batches: Iterator[Any]) -> int:
    """Publish every row of ``batches``; return the row count once every MPUB was confirmed."""
    lt = shared()
    rows = 0
    for batch in batches:
        names = batch.schema.names
        check_schema(names)
        bodies = _bodies(batch.column(names.index("body")))
        rows += len(bodies)
        if "topic" in names:
            per_topic: dict[str, list[bytes]] = {}
            for topic, body in zip(batch.column(names.index("topic")).to_pylist(), bodies):
                topic = topic or opts.topic
                if not topic:
                    raise ValueError("a row has no topic and the topic option is not set")
                per_topic.setdefault(topic, []).append(body)
        elif opts.topic:
            per_topic = {opts.topic: bodies}
        else:
            raise ValueError("the nsq sink needs the topic option or a 'topic' column")
        work = [(topic, chunk) for topic, group in per_topic.items() for chunk in chunks(group, opts)]
        if work:
            lt.call(_publish(opts, work))
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
