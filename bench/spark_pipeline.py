"""``bench_spark.py --pipeline``: ``nsq_spark_pipeline`` at its defaults against Spark's own ceiling.

Every run goes through the pipeline's own code (``pynsqd.spark.pipeline``: its options parsed
from a command line, ``transform``, ``start_query``), in one local[2] session, into Parquet
partitioned by date, with a nsqd node at its defaults:

- ``ceiling``: Spark's ``rate-micro-batch`` source, ``rowsPerBatch`` = the source's default
  ``maxBatch``, shaped as the ``nsq`` source's rows (a 16-character id, the batch's timestamp,
  a 100-byte body), through the same ``transform`` and file sink: what Spark itself does with
  rows that cost nothing to read;
- ``backlog``: ``--messages`` messages of ``--size`` bytes published into a channel that exists,
  then the pipeline started at its defaults;
- ``live``: the pipeline started as a publisher (another process) begins sending ``--messages``
  at ``--live-rate`` messages/s;
- ``dedupe``: ``backlog`` with ``--dedupe-window=10m``;
- ``trickle``: ``--trickle-rate`` messages/s for ``--trickle-secs``; each body carries its publish
  time, and the latency is from publishing to the batch's entry in the sink's
  ``_spark_metadata`` log (when Spark's readers see the row);
- ``output``: the ceiling's stream through the pipeline's ``--output-topic`` writer (the ``nsq``
  stream sink: executors MPUB) into a topic of the node;
- ``sink``: ``df.write.format("nsq")`` of ``--messages`` cached rows in two partitions;
- ``cold``: the ``nsq_spark_pipeline`` command as a user runs it, over a backlog: seconds from the
  process's start to its first committed row.

Rows/s come from the query's progress: ``steady`` from the end of the first batch with rows to
the end of the last, ``e2e`` from ``start()`` to the end of the last; ``first_s`` is ``start()``
to the end of the first batch with rows. ``x_ceiling`` is ``steady`` over the ceiling's, run by
run (each run has every kind once, in alternating order), then the median. ``us_*``: CPU
microseconds a row of each process kind (Spark's JVM, the source's driver-side runner, the
executors' Python workers, the node) after the first batch.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from bench.common import Figures, Meter, running_node
from pynsqd.spark.options import DEFAULT_MAX_BATCH_DELAY_MS
from pynsqd.spark.pipeline import PROG, PipelineOptions, build_source, start_query, transform

SQL = "SELECT id, timestamp, CAST(body AS STRING) AS line FROM nsq"
_HTTP = httpx.Client(timeout=60.0)


def pipeline_options(tcp: int, topic: str, tmp: str, *extra: str, output: bool = False) -> PipelineOptions:
    """The pipeline's options from its command line: into Parquet, or (``output``) the rows'
    bodies to the topic ``<topic>-out`` of the same node (``--output-topic``)."""
    from pynsqd.options import resolve

    outputs = ([f"--output-topic={topic}-out", "--sql=SELECT body FROM nsq"] if output else
               [f"--output-dir={tmp}/out-{topic}", f"--sql={SQL}"])
    argv = [f"--nsqd-tcp-address=127.0.0.1:{tcp}", f"--topic={topic}", *outputs,
            f"--checkpoint-dir={tmp}/ckpt-{topic}", *extra]
    opts, _ = resolve(PipelineOptions, argv, PROG, "")
    return opts


def default_max_batch() -> int:
    from pynsqd.spark.options import SourceOptions

    return SourceOptions.parse({"topic": "t", "nsqdTCPAddresses": "x:1"}).max_batch


def rate_source(spark: Any, rows_per_batch: int, size: int) -> Any:
    """The ``rate-micro-batch`` stream in the ``nsq`` source's schema."""
    from pyspark.sql import functions as F

    df = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", rows_per_batch).load()
    return df.select(
        F.lpad(F.hex("value"), 16, "0").alias("id"), F.lit(1).alias("attempts"), "timestamp",
        F.lpad(F.col("value").cast("string"), size, "x").cast("binary").alias("body"),
        F.lit("127.0.0.1:4150").alias("nsqd"), F.lit("rate").alias("topic"), F.lit("spark").alias("channel"))


def create_channel(http: int, topic: str, channel: str) -> None:
    for what, params in (("topic", {"topic": topic}), ("channel", {"topic": topic, "channel": channel})):
        _HTTP.post(f"http://127.0.0.1:{http}/{what}/create", params=params).raise_for_status()


def bodies(start: int, n: int, size: int) -> list[bytes]:
    return [b"%0*d" % (size, i) for i in range(start, start + n)]


def publish(tcp: int, topic: str, n: int, size: int, rate: float = 0.0, chunk: int = 200) -> None:
    """MPUB ``n`` distinct bodies in chunks, at most ``rate`` messages/s (0: as fast as the node takes)."""
    from pynsqd.client import SyncProducer

    t0 = time.monotonic()
    with SyncProducer(f"127.0.0.1:{tcp}") as producer:
        for start in range(0, n, chunk):
            producer.multi_publish(topic, bodies(start, min(chunk, n - start), size))
            if rate:
                ahead = (start + chunk) / rate - (time.monotonic() - t0)
                if ahead > 0:
                    time.sleep(ahead)  # pacing the stream


def stream(tcp: int, topic: str, n: int, size: int, rate: float, result: Any, chunk: int = 200) -> None:
    """The live stream: ``n`` messages in MPUBs of ``chunk``, at most ``rate`` a second, from
    prepared payloads (50 MPUBs of distinct bodies, sent in turn) with 4 MPUBs unanswered at
    once, so the publisher's own CPU stays small; puts the rate achieved on ``result``."""
    import asyncio
    import struct

    from pynsqd.client import Producer

    payloads = [b"".join(struct.pack(">i", size) + body for body in bodies(k * chunk, chunk, size)) for k in range(50)]

    async def main() -> float:
        window = asyncio.Semaphore(4)
        t0 = time.monotonic()
        async with Producer(f"127.0.0.1:{tcp}") as producer:
            async def one(k: int, count: int) -> None:
                try:
                    framed = payloads[k % len(payloads)][:count * (size + 4)]
                    await producer.multi_publish_framed(topic, count, framed)
                finally:
                    window.release()

            tasks = []
            for k, start in enumerate(range(0, n, chunk)):
                await window.acquire()
                tasks.append(asyncio.ensure_future(one(k, min(chunk, n - start))))
                ahead = (start + chunk) / rate - (time.monotonic() - t0) if rate else 0
                if ahead > 0:
                    await asyncio.sleep(ahead)  # pacing the stream
            await asyncio.gather(*tasks)
        return n / (time.monotonic() - t0)

    result.put(asyncio.run(main()))


def batches(query: Any) -> list[dict[str, Any]]:
    """The query's progress reports with rows, each with its end as epoch seconds."""
    out = []
    for p in query.recentProgress:
        if p["numInputRows"] <= 0:
            continue
        began = datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
        out.append({"rows": p["numInputRows"], "end": began + p["durationMs"]["triggerExecution"] / 1000,
                    "id": p["batchId"], "ms": p["durationMs"]})
    return sorted(out, key=lambda b: b["id"])


def rates(started: float, done: list[dict[str, Any]], phases: bool = False) -> Figures:
    rows = sum(b["rows"] for b in done)
    first = done[0]
    steady = (rows - first["rows"]) / max(done[-1]["end"] - first["end"], 1e-9) if len(done) > 1 else 0.0
    figures = {"steady": steady, "e2e": rows / max(done[-1]["end"] - started, 1e-9),
               "first_s": first["end"] - started, "batches": len(done), "rows": rows, **done[-1].get("cpu", {})}
    if phases:  # Spark's own account of a batch's time, median over the batches after the first (ms)
        for phase in ("latestOffset", "walCommit", "queryPlanning", "addBatch", "commitOffsets",
                      "triggerExecution"):
            times = [b["ms"].get(phase, 0) for b in done[1:]]
            figures[f"ms_{phase}"] = statistics.median(times) if times else 0.0
    return figures


ROLES = {"python_streaming_source_runner": "runner", "pyspark.daemon pyspark.worker": "workers", "java": "jvm"}


class CPU:
    """CPU seconds used by each role between ``mark`` and ``per_row``: Spark's JVM, the source's
    driver-side runner, the executors' Python workers (this process's descendants, told by
    command line) and the node. Counted per process: one that starts meanwhile counts whole,
    one that exits meanwhile takes its seconds with it (none should)."""

    def __init__(self, node_pid: int | None) -> None:
        self.node = Meter(node_pid) if node_pid else None
        self.start = self.sample()

    def sample(self) -> dict[tuple[str, int], float]:
        import psutil

        used: dict[tuple[str, int], float] = {}
        for proc in psutil.Process().children(recursive=True):
            try:
                line = " ".join(proc.cmdline())
                times = proc.cpu_times()
            except psutil.Error:
                continue
            role = next((r for key, r in ROLES.items() if key in line), "")
            if role:
                used[role, proc.pid] = times.user + times.system
        if self.node is not None:
            used["node", 0] = self.node.cpu()
        return used

    def mark(self) -> None:
        """Count from now (the end of the first batch: start-up left out)."""
        self.start = self.sample()

    def per_row(self, rows: int) -> Figures:
        used: dict[str, float] = {}
        for (role, pid), seconds in self.sample().items():
            used[role] = used.get(role, 0.0) + seconds - self.start.get((role, pid), 0.0)
        return {f"us_{role}": seconds / rows * 1e6 for role, seconds in sorted(used.items())}


def run_query(query: Any, want: int, timeout: float, cpu: CPU | None = None) -> list[dict[str, Any]]:
    """Wait for ``want`` rows to be committed; then stop the query. ``cpu`` counts the CPU of the
    batches after the first (seen within 0.1 s of its end)."""
    deadline = time.monotonic() + timeout
    first: int | None = None
    try:
        while True:
            if query.exception() is not None:
                raise SystemExit(f"query failed: {query.exception()}")
            done = batches(query)
            if cpu is not None and len(done) == 1 and first is None:
                first = done[0]["rows"]
                cpu.mark()
            if sum(b["rows"] for b in done) >= want:
                if cpu is not None and first is not None and len(done) > 1:
                    done[-1]["cpu"] = cpu.per_row(sum(b["rows"] for b in done) - first)
                return done
            if time.monotonic() > deadline:
                raise SystemExit(f"query took over {timeout:.0f} s: {sum(b['rows'] for b in done)} of {want} rows")
            time.sleep(0.1)
    finally:
        query.stop()


def ceiling(spark: Any, args: argparse.Namespace, tmp: str, node: tuple[Any, int, int], n: int,
            kind: str) -> Figures:
    """The rate source through the pipeline's query: into Parquet (``ceiling``), or the
    pipeline's ``--output-topic`` writer into the node (``output``)."""
    proc, tcp, _ = node
    opts = pipeline_options(tcp, f"{kind}{n}", tmp, output=kind == "output")
    df = transform(spark, opts, rate_source(spark, args.ceiling_batch or default_max_batch(), args.size))
    cpu = CPU(proc.pid if kind == "output" else None)
    started = time.time()
    return rates(started, run_query(start_query(opts, df), args.messages, args.timeout, cpu), args.phases)


def pipeline(spark: Any, args: argparse.Namespace, tmp: str, node: tuple[Any, int, int], n: int,
             kind: str) -> Figures:
    proc, tcp, http = node
    topic = f"{kind}{n}"
    opts = pipeline_options(tcp, topic, tmp, *(["--dedupe-window=10m"] if kind == "dedupe" else []))
    create_channel(http, topic, opts.channel)
    publisher = None
    spawn = multiprocessing.get_context("spawn")
    published = spawn.Queue()
    if kind == "live":
        publisher = spawn.Process(target=stream, args=(tcp, topic, args.messages, args.size, args.live_rate, published))
    else:
        publish(tcp, topic, args.messages, args.size)
    cpu = CPU(proc.pid)
    started = time.time()
    query = start_query(opts, transform(spark, opts, build_source(spark, opts)))
    if publisher is not None:
        publisher.start()
    try:
        done = run_query(query, args.messages, args.timeout, cpu)
    finally:
        if publisher is not None:
            publisher.join()
    figures = rates(started, done, args.phases)
    if publisher is not None:
        figures["published_s"] = published.get(timeout=10)
    return figures


def trickle(spark: Any, args: argparse.Namespace, tmp: str, node: tuple[Any, int, int], n: int) -> Figures:
    """Latency of a trickle from publish to the committed batch that holds it."""
    import pyarrow.parquet as pq

    from pynsqd.client import SyncProducer

    _, tcp, http = node
    topic = f"trickle{n}"
    opts = pipeline_options(tcp, topic, tmp)
    create_channel(http, topic, opts.channel)
    query = start_query(opts, transform(spark, opts, build_source(spark, opts)))
    log = Path(opts.output_dir) / "_spark_metadata"
    seen: set[str] = set()
    latencies: list[float] = []
    stop = threading.Event()

    def watch() -> None:
        """Each batch's entry in the sink's log (``N``, or every tenth ``N.compact``, which
        lists every file so far): the files it adds are committed now."""
        while not stop.is_set():
            entries = [f for f in log.iterdir() if f.name.split(".")[0].isdigit()] if log.is_dir() else []
            for entry in sorted(entries, key=lambda f: int(f.name.split(".")[0])):
                if entry.name in seen:
                    continue
                now = time.time()
                seen.add(entry.name)
                for line in entry.read_text().splitlines()[1:]:
                    path = json.loads(line)["path"].removeprefix("file://")
                    if path in seen:
                        continue
                    seen.add(path)
                    for sent in pq.read_table(path, columns=["line"]).column("line").to_pylist():
                        latencies.append(now - float(sent.rstrip("x")))
            stop.wait(0.01)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    total = int(args.trickle_rate * args.trickle_secs)
    try:
        with SyncProducer(f"127.0.0.1:{tcp}") as producer:
            t0 = time.monotonic()
            for i in range(total):
                producer.publish(topic, f"{time.time():.6f}".ljust(args.size, "x").encode())
                ahead = (i + 1) / args.trickle_rate - (time.monotonic() - t0)
                if ahead > 0:
                    time.sleep(ahead)  # pacing the trickle
        deadline = time.monotonic() + 60
        while len(latencies) < total and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        stop.set()
        watcher.join()
        query.stop()
    if len(latencies) < total:
        raise SystemExit(f"trickle: only {len(latencies)} of {total} rows committed")
    latencies.sort()
    return {"p50_s": latencies[len(latencies) // 2], "p99_s": latencies[int(len(latencies) * 0.99)],
            "max_s": latencies[-1], "rows": len(latencies)}


def cold(args: argparse.Namespace, tmp: str, node: tuple[Any, int, int]) -> Figures:
    """``nsq_spark_pipeline`` as a user starts it: seconds to its first committed row."""
    _, tcp, http = node
    topic = "cold"
    create_channel(http, topic, "nsq_spark_pipeline")
    publish(tcp, topic, args.messages, args.size)
    out = Path(tmp) / "out-cold"
    command = [sys.executable, "-m", "pynsqd.spark.pipeline", f"--nsqd-tcp-address=127.0.0.1:{tcp}",
               f"--topic={topic}", f"--sql={SQL}", f"--output-dir={out}", f"--checkpoint-dir={tmp}/ckpt-cold",
               "--master=local[2]"]
    t0 = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    log = out / "_spark_metadata"
    try:
        while not (log.is_dir() and any(f.name.isdigit() and "parquet" in f.read_text() for f in log.iterdir())):
            if proc.poll() is not None or time.monotonic() - t0 > args.timeout:
                raise SystemExit("cold: no committed row")
            time.sleep(0.05)
        first = time.monotonic() - t0
    finally:
        proc.terminate()
        proc.wait(60)
    return {"first_row_s": first}


def main(args: argparse.Namespace, tmp: str, make_session: Any) -> None:
    kinds = args.runs.split(",")
    with running_node(f"{tmp}/data") as node:
        figures: list[Figures] = []
        if "cold" in kinds:
            print(f"cold: {cold(args, tmp, node)}", flush=True)
            kinds.remove("cold")
        spark = make_session()
        try:
            started = time.monotonic()
            warm = argparse.Namespace(**{**vars(args), "messages": args.warmup, "trickle_secs": 5})
            for n in range(1000):  # warm-up: the JVM's compilers settle after a minute or two
                for kind in kinds:
                    one(spark, warm, tmp, node, 1000 + n, kind)
                if time.monotonic() - started >= args.warmup_secs:
                    break
            for n in range(args.repeat):
                order = kinds if n % 2 == 0 else kinds[::-1]  # alternate which goes first
                run: Figures = {}
                for kind in order:
                    run[kind] = one(spark, args, tmp, node, n, kind)
                for kind in kinds:  # each to the ceiling of its own run
                    if run.get("ceiling", {}).get("steady") and "steady" in run[kind]:
                        run[kind]["x_ceiling"] = run[kind]["steady"] / run["ceiling"]["steady"]
                figures.append(run)
                print(f"run {n + 1} (load {os.getloadavg()[0]:.1f}): "
                      + "  ".join(f"{k}: " + ", ".join(f"{f}={v:,.2f}" for f, v in run[k].items()) for k in kinds),
                      flush=True)
        finally:
            spark.stop()
    summary(figures, kinds)


def sink(spark: Any, args: argparse.Namespace, node: tuple[Any, int, int], n: int) -> Figures:
    """``df.write.format("nsq")`` of ``--messages`` cached rows (two partitions) into a topic."""
    proc, tcp, _ = node
    df = (spark.range(args.messages).selectExpr(f"lpad(CAST(id AS STRING), {args.size}, 'x') AS body")
          .repartition(2).cache())
    df.count()
    try:
        cpu = CPU(proc.pid)
        t0 = time.perf_counter()
        (df.write.format("nsq").mode("append").option("nsqdTCPAddress", f"127.0.0.1:{tcp}")
         .option("topic", f"sink{n}").save())
        elapsed = time.perf_counter() - t0
        return {"rows_s": args.messages / elapsed, **cpu.per_row(args.messages)}
    finally:
        df.unpersist()


def one(spark: Any, args: argparse.Namespace, tmp: str, node: tuple[Any, int, int], n: int, kind: str) -> Any:
    if kind == "sink":
        return sink(spark, args, node, n)
    if kind in ("ceiling", "output"):
        return ceiling(spark, args, tmp, node, n, kind)
    if kind == "trickle":
        return trickle(spark, args, tmp, node, n)
    return pipeline(spark, args, tmp, node, n, kind)


# What the pipeline is meant to reach on a 2-core machine: (run, figure, at least / at most, bound)
TARGETS = [("backlog", "x_ceiling", ">=", 0.6), ("live", "x_ceiling", ">=", 0.6), ("dedupe", "x_ceiling", ">=", 0.35),
           ("trickle", "p99_s", "<=", DEFAULT_MAX_BATCH_DELAY_MS / 1000 + 2), ("sink", "rows_s", ">=", 400_000),
           ("output", "steady", ">=", 400_000)]


def summary(figures: list[Figures], kinds: list[str]) -> None:
    print(f"\nmedian of {len(figures)} run(s), local[2], Parquet by date, nsqd at its defaults:")
    medians: Figures = {}
    for kind in kinds:
        medians[kind] = {k: statistics.median(r[kind][k] for r in figures) for k in figures[0][kind]}
        print(f"  {kind:8s} " + "  ".join(f"{k}={v:,.2f}" for k, v in medians[kind].items()))
    print("targets (medians):")
    for kind, figure, sense, bound in TARGETS:
        value = medians.get(kind, {}).get(figure)
        if value is None:
            continue
        met = value >= bound if sense == ">=" else value <= bound
        print(f"  {kind:8s} {figure} {value:,.2f} {sense} {bound:,.2f}: {'met' if met else 'missed'}")
