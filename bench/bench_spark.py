"""Spark ↔ NSQ throughput: the ``nsq`` streaming source and the ``nsq`` sink, rows/s.

    .venv/bin/python bench/bench_spark.py [--messages 300000] [--rows 1000000] [--repeat 3] [--only source]
                                          [--source nsq|simple|both]
    .venv/bin/python bench/bench_spark.py --pipeline [--runs cold,ceiling,backlog,live,dedupe,trickle,sink,output]

``--pipeline``: ``nsq_spark_pipeline`` at its defaults against nsqd at its defaults, next to
Spark's own ceiling in the same invocation (``bench/spark_pipeline.py`` says what each run is).
Otherwise:

source: N messages are published to a fresh nsqd (``--max-rdy-count`` raised so a batch can
stay in flight until the next one commits it; the shared-memory log sized so the backlog stays
in memory) into a channel that already exists (``--new-channel``: before it exists), then one
streaming query reads them with ``format("nsq")`` into the ``noop`` sink (or Parquet with
``--parquet``; through the pipeline's deduplication with ``--dedupe-window``). ``rows_s``:
the clock runs from ``start()`` until nsqd reports every message FINed (so it includes the
query's start-up and the commit of the last batch);
``steady_rows_s``: from the first FIN seen to the last. ``simple``: the same run through the
baseline ``SimpleDataSourceStreamReader`` (``simple_source.py``: rows built in the driver-side
runner), on the same node and session, alternating which source goes first. sink:
``spark.range(rows)`` as string bodies written with ``format("nsq")``; the clock runs until
``save()`` returned (every MPUB confirmed). One local[2] SparkSession for every run; its
start-up, the first query's Python start-up and the JVM's JIT compilation of Spark's code are
excluded by unmeasured warm-up runs of ``--warmup`` messages (default: as many as a measured
run), repeated until ``--warmup-secs`` (60) have passed: a streaming pipeline runs for hours,
and the compilers settle only after a minute or two. ``PYNSQD_SPARK_TRACE=dir`` on the command
line traces the source (``bench/spark_timeline.py dir``).
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Figures, report, start_node
from pynsqd.spark import trace


def session(java_options: str, confs: list[str]) -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    # Spark's Python workers unpickle the baseline source by module name: bench.simple_source
    root = str(Path(__file__).resolve().parent.parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    if java_options:
        builder = builder.config("spark.driver.extraJavaOptions", java_options)
    for conf in confs:
        key, _, value = conf.partition("=")
        builder = builder.config(key, value)
    spark = (builder.master("local[2]").appName("bench_spark").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").config("spark.ui.showConsoleProgress", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def pipeline_session(java_options: str, confs: list[str]) -> Any:
    """A session as ``nsq_spark_pipeline`` makes one (its shuffle partitions: the parallelism)."""
    spark = session(java_options, [*confs, "spark.sql.streaming.numRecentProgressUpdates=1000"])
    spark.conf.set("spark.sql.shuffle.partitions", str(spark.sparkContext.defaultParallelism))
    # the ceiling's rate source never ends: stopping its query aborts the batch being written,
    # which Spark logs as an error (a failed query still shows in query.exception())
    spark.sparkContext.setLogLevel("FATAL")
    from pynsqd.spark import register

    register(spark)
    return spark


# One client: httpx.get() builds a client (and its TLS context) per call, ~27 ms of CPU. A long
# timeout: with a 1.2M-message backlog the node once took over 5 s (httpx's default) to answer.
_HTTP = httpx.Client(timeout=60.0)


def finished(http: int, topic: str, channel: str) -> tuple[int, int, int]:
    data = _HTTP.get(f"http://127.0.0.1:{http}/stats", params={"format": "json", "topic": topic}).json()
    for t in data["topics"] or []:  # null: no such topic (yet)
        for c in t["channels"]:
            if c["channel_name"] == channel:
                fin = sum(cl["finish_count"] for cl in c["clients"] or [])
                return fin, c["depth"], c["in_flight_count"]
    return 0, -1, -1


def publish(tcp: int, topic: str, n: int, size: int) -> None:
    from pynsqd.client import SyncProducer

    body = b"x" * size
    with SyncProducer(f"127.0.0.1:{tcp}") as producer:
        for start in range(0, n, 10_000):
            producer.multi_publish(topic, [body] * min(10_000, n - start))


def source_run(spark: Any, args: argparse.Namespace, tcp: int, http: int, topic: str, tmp: str,
               fmt: str = "nsq") -> Figures:
    """rows/s from ``start()`` until every message was FINed, and in the steady state (from the
    first FIN seen to the last: query start-up excluded), and the number of micro-batches.
    ``fmt``: ``nsq``, or ``nsq_simple`` for the simple-reader baseline (``simple_source.py``)."""
    if not args.new_channel:  # a consumer group that exists: the backlog waits in its channel
        for what, params in (("topic", {"topic": topic}), ("channel", {"topic": topic, "channel": "bench"})):
            _HTTP.post(f"http://127.0.0.1:{http}/{what}/create", params=params).raise_for_status()
    publish(tcp, topic, args.messages, args.size)
    df = (spark.readStream.format(fmt).option("nsqdTCPAddresses", f"127.0.0.1:{tcp}").option("topic", topic)
          .option("channel", "bench").option("maxBatch", str(args.max_batch))
          .option("maxInFlight", str(3 * args.max_batch)).option("partitions", str(args.partitions))
          .option("minBatch", str(args.min_batch)).load())
    if args.dedupe_window:
        from pynsqd.spark.dedupe import dedupe

        df = dedupe(df, args.dedupe_window)
    writer = df.writeStream.option("checkpointLocation", f"{tmp}/ckpt-{topic}")
    writer = writer.format("parquet").option("path", f"{tmp}/out-{topic}") if args.parquet else writer.format("noop")
    if args.trigger_ms:
        writer = writer.trigger(processingTime=f"{args.trigger_ms} milliseconds")
    trace.event("bench.start", topic=topic)
    t0 = time.perf_counter()
    query = writer.start()
    first: tuple[float, int] | None = None
    slowest = 0.0  # the longest /stats poll: the node's event loop busy for that long
    try:
        while True:
            asked = time.perf_counter()
            fin, depth, inflight = finished(http, topic, "bench")
            now = time.perf_counter()
            slowest = max(slowest, now - asked)
            if first is None and fin > 0:
                first = (now, fin)
            if fin >= args.messages and depth == 0 and inflight == 0:
                trace.event("bench.done", topic=topic)
                break
            if query.exception() is not None:
                raise SystemExit(f"query failed: {query.exception()}")
            time.sleep(0.05)
        elapsed = now - t0
        progress = query.lastProgress
        assert first is not None
        # 0: not measurable, the first FIN was seen after half the messages (a /stats poll stalled)
        steady = (args.messages - first[1]) / max(now - first[0], 1e-9) if first[1] <= args.messages // 2 else 0.0
        return {"rows_s": args.messages / elapsed, "steady_rows_s": steady,
                "MB_s": args.messages * args.size / elapsed / 1e6, "secs": elapsed,
                "batches": progress["batchId"] + 1 if progress else 0, "slowest_stats_s": slowest}
    finally:
        query.stop()


def sink_run(spark: Any, args: argparse.Namespace, tcp: int, topic: str) -> float:
    df = spark.range(args.rows).selectExpr(f"repeat('x', {args.size}) AS body").repartition(args.partitions)
    df.cache().count()
    t0 = time.perf_counter()
    (df.write.format("nsq").mode("append").option("nsqdTCPAddress", f"127.0.0.1:{tcp}").option("topic", topic)
     .save())
    elapsed = time.perf_counter() - t0
    df.unpersist()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=0,
                        help="messages a run (default: 300000, with --pipeline 1000000)")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100, help="body bytes")
    parser.add_argument("--max-batch", type=int, default=50_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--min-batch", type=int, default=0, help="source option minBatch (0: off)")
    parser.add_argument("--parquet", action="store_true", help="source into Parquet instead of noop")
    parser.add_argument("--dedupe-window", default="",
                        help="source: drop repeated ids within this Spark interval, as nsq_spark_pipeline's "
                             "--dedupe-window does (e.g. '10 minutes'; default: off)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", choices=["source", "sink"], help="measure one side only")
    parser.add_argument("--source", choices=["nsq", "simple", "both"], default="both",
                        help="which source to measure: the nsq source, the SimpleDataSourceStreamReader "
                             "baseline (bench/simple_source.py), or both in each run (the default)")
    parser.add_argument("--trigger-ms", type=int, default=0,
                        help="source: a processingTime trigger (default: the next batch as soon as one ends)")
    parser.add_argument("--java-options", default="",
                        help="the Spark JVM's extra options, e.g. -XX:TieredStopAtLevel=1 (C1 JIT only)")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting for the session (repeatable)")
    parser.add_argument("--new-channel", action="store_true",
                        help="source: publish before the channel exists (the backlog waits in the topic and moves "
                             "to the channel as the query starts), instead of into an existing channel")
    parser.add_argument("--warmup", type=int, default=0,
                        help="messages (and sink rows) of each unmeasured warm-up run (default: --messages)")
    parser.add_argument("--warmup-secs", type=float, default=60.0,
                        help="repeat the warm-up run until this long after the session started: the JVM's "
                             "C1/C2 compilers were still compiling Spark's code (~0.5 s of compile time per "
                             "second) two minutes into a session, and each run was faster than the one before")
    parser.add_argument("--log-bytes", type=int, default=0,
                        help="the node's --mem-queue-bytes (default: room for the backlog or 4 x maxBatch messages)")
    parser.add_argument("--pipeline", action="store_true",
                        help="nsq_spark_pipeline at its defaults against Spark's own ceiling (bench/spark_pipeline.py)")
    parser.add_argument("--runs", default="ceiling,backlog,live,dedupe,trickle,sink,output",
                        help="--pipeline: which runs, comma-separated (also: cold, once before the others)")
    parser.add_argument("--ceiling-batch", type=int, default=0,
                        help="--pipeline: the ceiling's rows a batch (default: the source's default maxBatch)")
    parser.add_argument("--live-rate", type=float, default=200_000, help="--pipeline: live stream messages/s")
    parser.add_argument("--trickle-rate", type=float, default=100, help="--pipeline: trickle messages/s")
    parser.add_argument("--trickle-secs", type=float, default=30, help="--pipeline: trickle duration")
    parser.add_argument("--timeout", type=float, default=600, help="--pipeline: seconds a run may take")
    parser.add_argument("--phases", action="store_true",
                        help="--pipeline: also print Spark's durationMs of each batch phase (medians, ms)")
    args = parser.parse_args()
    args.messages = args.messages or (1_000_000 if args.pipeline else 300_000)
    args.warmup = args.warmup or args.messages
    tmp = tempfile.mkdtemp(prefix="bench-spark-")
    os.mkdir(f"{tmp}/data")  # the node runs in it
    if args.pipeline:
        from bench import spark_pipeline

        try:
            spark_pipeline.main(args, tmp, lambda: pipeline_session(args.java_options, args.conf))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    # The backlog is meant to wait in memory, and every message the stream holds in flight (up
    # to 3 x maxBatch) stays in the shard's log until its batch commits: size the queue (in
    # messages, --mem-queue-size) and the log (in bytes) for whichever is larger. A backlog past
    # either spills to the disk queue, and reading it back (disk reads, an fsync per 2,500) was a
    # third of the shard's time; a 1.2M backlog with --mem-queue-size=1000000 ended the run with
    # its last 200k messages trickling in from disk.
    held = max(args.messages, args.warmup, 4 * args.max_batch)
    log_bytes = args.log_bytes or max(32 << 20, held * (args.size + 96))
    node, tcp, http = start_node(f"{tmp}/data", f"--max-rdy-count={4 * args.max_batch}",
                                 f"--mem-queue-size={max(1_000_000, held)}", f"--mem-queue-bytes={log_bytes}")
    started = time.monotonic()
    spark = session(args.java_options, args.conf)
    from bench.simple_source import register

    register(spark)
    sources = {"nsq": [("source", "nsq")], "simple": [("simple", "nsq_simple")],
               "both": [("source", "nsq"), ("simple", "nsq_simple")]}[args.source]
    counter = iter(range(1_000_000))
    try:
        warm = argparse.Namespace(**{**vars(args), "messages": args.warmup, "rows": min(args.rows, args.warmup)})
        for n in itertools.count():  # until --warmup-secs have passed, at least once
            if args.only != "sink":
                for key, fmt in sources:
                    source_run(spark, warm, tcp, http, f"warm{key}{n}", tmp, fmt)
            if args.only != "source":
                sink_run(spark, warm, tcp, f"warmsink{n}")
            if time.monotonic() - started >= args.warmup_secs:
                break

        def one(a: argparse.Namespace) -> Figures:
            n = next(counter)
            figures: Figures = {}
            if a.only != "sink":
                for key, fmt in sources[::-1] if n % 2 else sources:  # alternate which goes first
                    figures[key] = source_run(spark, a, tcp, http, f"{key}{n}", tmp, fmt)
            if a.only != "source":
                snk = sink_run(spark, a, tcp, f"sink{n}")
                figures["sink"] = {"rows_s": a.rows / snk, "MB_s": a.rows * a.size / snk / 1e6, "secs": snk}
            return figures

        report(one, args, f"{args.size}-byte bodies, local[2], machine shared with other work")
    finally:
        spark.stop()
        node.terminate()
        node.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
