"""``nsq_spark_pipeline``: a topic/channel → optional SQL → Parquet files and/or another topic.

Theory of operation
-------------------
One streaming query reads ``format("nsq")`` (the at-least-once source), exposes it to
``--sql`` as the view ``nsq``, and writes the result:

- to Parquet under ``--output-dir`` (Spark's file sink: files appear with its metadata log, so
  ``spark.read.parquet(dir)`` sees only committed batches), partitioned by ``--partition-by``
  (``date`` is derived from the message ``timestamp`` when the result has no such column);
- and/or to ``--output-topic`` with the ``nsq`` sink (the result needs a ``body`` column);
  both at once go through ``foreachBatch`` so one consumer feeds both (two queries on one
  channel would split its messages between them).

Spark runs on ``local[*]`` unless ``--master`` names another master, or ``spark-submit``
(which sets ``spark.master``) launched the command; the checkpoint directory makes a restart
continue where the last committed batch ended. Every ``--progress-interval`` a line reports
batches, rows, rows/s and lag (the age of the newest message in the last batch). SIGINT or
SIGTERM only sets an event; the main loop then stops the query and Spark, and exits 0.
Messages of a batch that was not committed when it stopped come back from nsqd after their
timeout (at-least-once); ``--dedupe-window`` drops the rows whose ``id`` was already written
within the window (``dedupe.py``), so a crash and restart inside it leaves no duplicate rows.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from datetime import UTC
from typing import Any, NoReturn

from pynsqd.options import SECOND, UsageError, flag, resolve, run_cli

PROG = "nsq_spark_pipeline"
SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"


def _required(value: str) -> str | None:
    return None if value else "required"


@dataclass
class PipelineOptions:
    nsqd_tcp_addresses: list[str] = flag("nsqd-tcp-address", [], "nsqd TCP address (may be given multiple times)",
                                         kind="strlist")
    lookupd_http_addresses: list[str] = flag("lookupd-http-address", [],
                                             "lookupd HTTP address (may be given multiple times)", kind="strlist")
    topic: str = flag("topic", "", "NSQ topic to read", validate=_required)
    channel: str = flag("channel", "nsq_spark_pipeline", "NSQ channel")
    sql: str = flag("sql", "", "SQL over the stream, which is the view 'nsq' "
                    "(columns id, attempts, timestamp, body, nsqd, topic, channel)")
    output_dir: str = flag("output-dir", "", "write Parquet files here")
    partition_by: list[str] = flag("partition-by", ["date"], "Parquet partition column(s); 'date' is derived "
                                   "from timestamp when absent (may be given multiple times)", kind="strlist")
    output_topic: str = flag("output-topic", "", "publish the result's 'body' column to this topic")
    output_nsqd_tcp_address: str = flag("output-nsqd-tcp-address", "", "nsqd TCP address for --output-topic "
                                        "(default: the first --nsqd-tcp-address)")
    checkpoint_dir: str = flag("checkpoint-dir", "", "Spark checkpoint directory (restart continues from it)",
                               validate=_required)
    master: str = flag("master", "", "Spark master URL (default: local[*], or what spark-submit set)")
    trigger_interval: int = flag("trigger-interval", 0, "micro-batch interval (0: as fast as possible)",
                                 kind="duration")
    max_batch: int = flag("max-batch", 0, "messages per micro-batch (0: 100000, or max-in-flight / 3)")
    max_in_flight: int = flag("max-in-flight", 0, "messages in flight, over as many connections to each nsqd as "
                              "its --max-rdy-count needs (0: 3 x max-batch)")
    max_batch_delay: int = flag("max-batch-delay", SECOND, "a micro-batch waits to be full (max-batch) for at most "
                                "this long (0: it takes what arrived)", kind="duration")
    msg_timeout: int = flag("msg-timeout", 60 * SECOND, "message timeout asked of nsqd", kind="duration")
    progress_interval: int = flag("progress-interval", 5 * SECOND, "how often to print progress",
                                  kind="duration")
    dedupe_window: int = flag("dedupe-window", 0, "drop rows whose id was already written within this long "
                              "(0: off; at-least-once)", kind="duration")


def build_source(spark: Any, opts: PipelineOptions) -> Any:
    reader = spark.readStream.format("nsq").option("topic", opts.topic).option("channel", opts.channel)
    reader = reader.option("msgTimeout", str(opts.msg_timeout // 1_000_000))
    reader = reader.option("maxBatchDelay", str(opts.max_batch_delay // 1_000_000))
    if opts.max_in_flight:
        reader = reader.option("maxInFlight", str(opts.max_in_flight))
    if opts.max_batch:
        reader = reader.option("maxBatch", str(opts.max_batch))
    if opts.nsqd_tcp_addresses:
        reader = reader.option("nsqdTCPAddresses", ",".join(opts.nsqd_tcp_addresses))
    if opts.lookupd_http_addresses:
        reader = reader.option("lookupdHTTPAddresses", ",".join(opts.lookupd_http_addresses))
    # executors fetch each batch from the source's runner, on the driver's host: where they
    # reach Spark's driver (spark.driver.host, SPARK_LOCAL_IP), they reach it
    driver_host = spark.conf.get("spark.driver.host", "")
    if driver_host:
        reader = reader.option("driverHost", driver_host)
    return reader.load()


def transform(spark: Any, opts: PipelineOptions, df: Any) -> Any:
    from pyspark.sql import functions as F

    if opts.dedupe_window:
        from pynsqd.spark.dedupe import dedupe

        df = dedupe(df, f"{opts.dedupe_window // 1_000_000} milliseconds")
    if opts.sql:
        df.createOrReplaceTempView("nsq")
        df = spark.sql(opts.sql)
    if opts.output_dir and "date" in opts.partition_by and "date" not in df.columns:
        if "timestamp" not in df.columns:
            raise UsageError("--partition-by=date needs a 'timestamp' or 'date' column in the result")
        df = df.withColumn("date", F.to_date("timestamp"))
    if "timestamp" in df.columns:
        df = df.observe("pipeline", F.max("timestamp").alias("newest"))
    return df


def start_query(opts: PipelineOptions, df: Any) -> Any:
    nsqd_out = opts.output_nsqd_tcp_address or (opts.nsqd_tcp_addresses or [""])[0]
    if opts.output_topic and not nsqd_out:
        raise UsageError("--output-topic needs --output-nsqd-tcp-address")
    if opts.output_topic and "body" not in df.columns:
        raise UsageError("--output-topic needs a 'body' column in the result")
    writer = df.writeStream.option("checkpointLocation", opts.checkpoint_dir)
    if opts.trigger_interval:
        writer = writer.trigger(processingTime=f"{opts.trigger_interval // 1_000_000} milliseconds")
    parts = opts.partition_by

    def to_topic(w: Any) -> Any:
        return w.format("nsq").option("nsqdTCPAddress", nsqd_out).option("topic", opts.output_topic)

    if opts.output_dir and opts.output_topic:
        def both(batch: Any, batch_id: int) -> None:
            batch.persist()
            batch.write.mode("append").partitionBy(*parts).parquet(opts.output_dir)
            to_topic(batch.select("body").write).mode("append").save()
            batch.unpersist()

        return writer.foreachBatch(both).start()
    if opts.output_dir:
        return writer.format("parquet").partitionBy(*parts).option("path", opts.output_dir).start()
    return to_topic(writer).start()


def progress_line(query: Any, started: float) -> str:
    p = query.lastProgress or {}
    rows = p.get("numInputRows", 0)
    rate = p.get("processedRowsPerSecond", 0.0)
    observed = (p.get("observedMetrics") or {}).get("pipeline")
    newest = observed["newest"] if observed is not None else None
    lag = "-"
    if newest:
        from datetime import datetime

        when = datetime.fromisoformat(str(newest).replace("Z", "+00:00"))
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        lag = f"{max(0.0, time.time() - when.timestamp()):.1f}s"
    return (f"{PROG}: batch {p.get('batchId', '-')} rows {rows} rows/s {rate:,.0f} lag {lag} "
            f"up {time.monotonic() - started:.0f}s")


def first_rows_line(query: Any, started: float) -> str | None:
    """The line saying how long after ``started`` (``time.time()``) the first rows were
    committed: the end of the first batch with rows, once there was one (else None)."""
    from datetime import datetime

    for p in query.recentProgress:
        if p.get("numInputRows"):
            began = datetime.fromisoformat(str(p["timestamp"]).replace("Z", "+00:00")).timestamp()
            end = began + p["durationMs"]["triggerExecution"] / 1000
            return (f"{PROG}: first rows committed {end - started:.1f}s after start "
                    f"(batch {p['batchId']}, {p['numInputRows']} rows)")
    return None


def run(argv: list[str]) -> int:
    started, launched = time.monotonic(), time.time()
    opts, _ = resolve(PipelineOptions, argv, PROG, "Stream an NSQ topic through Spark into Parquet and/or a topic.")
    if not opts.nsqd_tcp_addresses and not opts.lookupd_http_addresses:
        raise UsageError("give --nsqd-tcp-address or --lookupd-http-address")
    if not opts.output_dir and not opts.output_topic:
        raise UsageError("give --output-dir and/or --output-topic")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # Spark starts its Python workers as ``python -m pyspark.daemon`` in this process's
    # working directory, which ``-m`` puts first on their sys.path: a ``pynsqd/`` folder
    # there (another checkout) would be what they unpickle the source and sink with.
    # Safe-path mode keeps them on the installed code, as this command is.
    os.environ.setdefault("PYTHONSAFEPATH", "1")
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(PROG).config("spark.ui.showConsoleProgress", "false")
    if opts.master:
        builder = builder.master(opts.master)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if not spark.sparkContext.getConf().contains(SHUFFLE_PARTITIONS):
        # --dedupe-window's state is kept in this many partitions (fixed by the first run's
        # checkpoint); Spark's default, 200, would run 200 tasks per micro-batch
        spark.conf.set(SHUFFLE_PARTITIONS, str(spark.sparkContext.defaultParallelism))
    # After the session: SparkContext installs its own SIGINT handler (cancel jobs, raise
    # KeyboardInterrupt); ours only sets an event, and the main loop stops the query.
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    from pynsqd.spark import register

    register(spark)  # auto-registration covers local runs; a cluster launched from here needs it
    query = start_query(opts, transform(spark, opts, build_source(spark, opts)))
    print(f"{PROG}: started query {query.id} ({opts.topic}/{opts.channel}) in application "
          f"{spark.sparkContext.applicationId}", flush=True)
    status = 0
    try:
        interval = opts.progress_interval / 1e9
        next_line = time.monotonic() + interval
        first = None
        while not stop.wait(0.2) and query.isActive:
            if first is None and (first := first_rows_line(query, launched)):
                print(first, flush=True)
            if time.monotonic() >= next_line:
                next_line += interval
                if query.lastProgress:
                    print(progress_line(query, started), flush=True)
        error = query.exception()
        if error is not None:
            print(f"{PROG}: error: {error}", file=sys.stderr, flush=True)
            status = 1
    finally:
        query.stop()
        spark.stop()
    print(f"{PROG}: stopped", flush=True)
    return status


def main(argv: list[str] | None = None) -> NoReturn:
    run_cli(run, PROG, argv if argv is not None else sys.argv[1:])


if __name__ == "__main__":
    main()
