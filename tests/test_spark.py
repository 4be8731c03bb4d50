"""The ``nsq`` Spark data source, sink and pipeline command against a real nsqd.

One local[2] SparkSession serves the whole module (JVM start-up dominates); the pipeline
command and the standalone cluster run in their own processes, stopped by pid.
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("pyspark", reason="the spark extra is not installed")

from pynsqd.client import SyncProducer
from testbed.harness import Daemon, decoy_checkout, scaled, wait_for
from testbed.spark_helpers import (
    Pipeline,
    channel_stats,
    committed,
    committed_count,
    consume,
    kill_between_commit_and_fin,
    make_session,
    publish,
    rows_committed,
)

pytestmark = [pytest.mark.slow, pytest.mark.spark]
ROOT = Path(__file__).resolve().parent.parent
BIG_RDY = "--max-rdy-count=200000"


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = make_session()
    yield session
    session.stop()


def addr(nsqd: Daemon) -> str:
    host, port = nsqd.tcp
    return f"{host}:{port}"


def stream(spark: Any, nsqd: Daemon, topic: str, channel: str, fmt: str = "nsq", **options: Any) -> Any:
    reader = (spark.readStream.format(fmt).option("nsqdTCPAddresses", addr(nsqd))
              .option("topic", topic).option("channel", channel))
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


def test_source_100k_messages_into_parquet_every_id_once_and_fin_only_after_commit(
        spark: Any, nsqd_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    nsqd = nsqd_factory(BIG_RDY)
    total = 100_000
    publish(nsqd, "events", (b"m%06d" % i for i in range(total)))
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    df = stream(spark, nsqd, "events", "spark", maxBatch=20_000, maxInFlight=60_000)
    query = df.writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(ckpt)).start()
    samples = 0
    try:
        def drained() -> bool:
            nonlocal samples
            # FIN count first, committed rows after: a FIN that preceded its batch's commit would
            # show as more FINs than committed rows.
            fin = channel_stats(nsqd, "events", "spark").get("finish_count", 0)
            rows = committed_count(spark, out)
            assert fin <= rows, f"{fin} messages FINed but only {rows} rows committed"
            samples += 1
            stats = channel_stats(nsqd, "events", "spark")
            return stats.get("depth") == 0 and stats.get("in_flight_count") == 0 and stats["finish_count"] == total
        wait_for(drained, timeout=120, interval=2.0, what="every message FINed")
        assert query.exception() is None
    finally:
        query.stop()
    result = committed(spark, out)
    assert result is not None
    ids = result.select("id").distinct().count()
    bodies = {bytes(r.body) for r in result.select("body").distinct().collect()}
    assert ids == total
    assert bodies == {b"m%06d" % i for i in range(total)}
    row = result.first()
    assert row.topic == "events" and row.channel == "spark" and row.nsqd == addr(nsqd) and row.attempts == 1
    stats = channel_stats(nsqd, "events", "spark")
    assert stats["timeout_count"] == 0 and stats["requeue_count"] == 0
    assert samples >= 2


def test_source_stopped_mid_stream_and_restarted_on_its_checkpoint_loses_nothing(
        spark: Any, nsqd_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    nsqd = nsqd_factory(BIG_RDY)
    total = 30_000
    publish(nsqd, "orders", (b"o%05d" % i for i in range(total)))
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"

    def start() -> Any:
        df = stream(spark, nsqd, "orders", "spark", maxBatch=5000, maxInFlight=15000, msgTimeout=2000)
        return (df.writeStream.format("parquet").option("path", str(out))
                .option("checkpointLocation", str(ckpt)).start())

    first = start()
    try:
        wait_for(lambda: committed_count(spark, out) >= 3000, timeout=60, interval=0.3, what="some batches")
    finally:
        first.stop()  # the runner dies with its consumer: the batch in flight was not committed
    before = committed_count(spark, out)
    assert before < total
    second = start()
    try:
        def all_there() -> bool:
            df = committed(spark, out)
            stats = channel_stats(nsqd, "orders", "spark")
            return (df is not None and df.select("body").distinct().count() == total
                    and stats.get("depth") == 0 and stats.get("in_flight_count") == 0)
        wait_for(all_there, timeout=240, interval=0.5, what="every message after the restart")
        assert second.exception() is None
    finally:
        second.stop()
    result = committed(spark, out)
    assert result.select("id").distinct().count() == total  # ids are stable across redelivery
    assert {bytes(r.body) for r in result.select("body").distinct().collect()} == {b"o%05d" % i for i in range(total)}


def test_the_simple_reader_baseline_gives_exactly_the_rows_of_the_nsq_source(
        spark: Any, nsqd_factory: Callable[..., Daemon]) -> None:
    """``bench_spark.py`` compares the ``nsq`` source with a ``SimpleDataSourceStreamReader``
    (``bench/simple_source.py``) that decodes in Python: the comparison holds only if both read
    the same rows, and it cross-checks the executors' Arrow decoding against Python's."""
    from bench.simple_source import register

    register(spark)
    nsqd = nsqd_factory()
    total = 3000
    bodies = [b"b%04d\n\x00\xff" % i + bytes(range(i % 50)) for i in range(total)]
    httpx.post(f"{nsqd.http_url}/topic/create", params={"topic": "twice"}).raise_for_status()
    for channel in ("arrow", "simple"):  # both before publishing: each gets every message
        httpx.post(f"{nsqd.http_url}/channel/create", params={"topic": "twice", "channel": channel}).raise_for_status()
    publish(nsqd, "twice", bodies)
    queries = []
    try:
        for fmt, channel in (("nsq", "arrow"), ("nsq_simple", "simple")):
            df = stream(spark, nsqd, "twice", channel, fmt, maxBatch=1000, maxInFlight=2500)
            queries.append(df.writeStream.format("memory").queryName(f"twice_{channel}").start())
        for channel in ("arrow", "simple"):
            wait_for(lambda c=channel: channel_stats(nsqd, "twice", c).get("finish_count") == total, timeout=90,
                     what=f"every message FINed on {channel}")
        for query in queries:
            assert query.exception() is None
    finally:
        for query in queries:
            query.stop()

    def rows(channel: str) -> list[tuple]:
        got = spark.sql(f"SELECT * FROM twice_{channel}").collect()
        assert {r.channel for r in got} == {channel}
        return sorted((r.id, r.attempts, r.timestamp, bytes(r.body), r.nsqd, r.topic) for r in got)

    arrow, simple = rows("arrow"), rows("simple")
    assert len(arrow) == total and sorted(r[3] for r in arrow) == sorted(bodies)
    assert simple == arrow


def test_available_now_run_ends_with_every_message_committed_and_touch_keeps_a_slow_batch_alive(
        spark: Any, nsqd_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    nsqd = nsqd_factory()
    total = 2000
    publish(nsqd, "slow", (b"s%04d" % i for i in range(total)))

    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType

    def slow(body: bytes) -> bytes:
        import time as clock

        clock.sleep(0.004)  # the workload: a 1000-row batch takes > 2 s on 2 cores, the msg timeout
        return body

    df = stream(spark, nsqd, "slow", "spark", maxBatch=1000, maxInFlight=2500, msgTimeout=2000)
    out = tmp_path / "out"
    slowed = df.withColumn("body", F.udf(slow, BinaryType(), useArrow=False)("body"))
    query = (slowed.writeStream.format("parquet").option("path", str(out))
             .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
    assert query.awaitTermination(180), "the availableNow run did not end"
    assert query.exception() is None
    result = committed(spark, out)
    assert result.count() == total and result.select("id").distinct().count() == total
    assert result.filter("attempts > 1").count() == 0
    stats = channel_stats(nsqd, "slow", "spark")
    assert stats["timeout_count"] == 0 and stats["requeue_count"] == 0
    wait_for(lambda: channel_stats(nsqd, "slow", "spark").get("in_flight_count") == 0, timeout=30,
             what="the last batch FINed (heartbeat commit) or released by the stopped runner")
    assert channel_stats(nsqd, "slow", "spark")["depth"] == 0


def test_first_batch_carries_the_messages_already_waiting(
        spark: Any, nsqd_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    """The runner's first latestOffset waits briefly for data (the consumer is still connecting),
    so batch 0 is not an empty micro-batch cycle."""
    nsqd = nsqd_factory()
    total = 1500
    publish(nsqd, "early", (b"e%04d" % i for i in range(total)))
    df = stream(spark, nsqd, "early", "spark", maxBatch=800, maxInFlight=2500)
    query = df.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ckpt")).start()
    try:
        wait_for(lambda: channel_stats(nsqd, "early", "spark").get("finish_count") == total, timeout=60,
                 what="every message FINed")
        assert query.exception() is None
        progress = query.recentProgress
    finally:
        query.stop()
    first = next(p for p in progress if p["batchId"] == 0)
    assert first["numInputRows"] > 0, f"batch 0 was empty: {first}"


def test_at_its_defaults_a_batch_is_not_capped_by_nsqds_max_rdy_count(
        spark: Any, nsqd_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    """nsqd at its defaults lets one connection hold 2,500 messages; the source at its defaults
    holds several batches of 100,000 over as many connections to it as that takes."""
    nsqd = nsqd_factory()
    total = 120_000
    for what, params in (("topic", {"topic": "wide"}), ("channel", {"topic": "wide", "channel": "spark"})):
        httpx.post(f"{nsqd.http_url}/{what}/create", params=params).raise_for_status()
    publish(nsqd, "wide", (b"w%06d" % i for i in range(total)), chunk=10_000)
    query = (stream(spark, nsqd, "wide", "spark").writeStream.format("noop")
             .option("checkpointLocation", str(tmp_path / "ckpt")).start())
    try:
        clients = 0

        def drained() -> bool:
            nonlocal clients
            stats = channel_stats(nsqd, "wide", "spark")
            clients = max(clients, len(stats.get("clients") or []))
            return stats.get("finish_count") == total and stats["depth"] == 0 and stats["in_flight_count"] == 0
        wait_for(drained, timeout=180, interval=0.5, what="every message FINed")
        assert query.exception() is None
        rows = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    finally:
        query.stop()
    assert sum(rows) == total
    assert max(rows) > 10 * 2500, rows  # one connection's RDY would cap a batch near a third of 2,500
    assert clients > 1


def test_min_batch_makes_fewer_fuller_batches_and_max_batch_delay_sends_the_rest(
        spark: Any, nsqd_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    """``minBatch``: while messages trickle in, no batch is planned until that many are
    buffered; the remainder, fewer than ``minBatch``, goes after ``maxBatchDelay``."""
    nsqd = nsqd_factory()
    total, low = 3301, 1000  # the first message, then 330 MPUBs of 10
    publish(nsqd, "trickle", [b"first"])
    df = stream(spark, nsqd, "trickle", "spark", maxBatch=2000, maxInFlight=10_000, minBatch=low,
                maxBatchDelay=5000)
    query = df.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ckpt")).start()
    try:
        wait_for(lambda: channel_stats(nsqd, "trickle", "spark").get("finish_count") == 1, timeout=60,
                 what="the first message FINed")
        host, port = nsqd.tcp
        with SyncProducer(f"{host}:{port}") as producer:
            for sent in range(1, total, 10):  # < 1,000 a second, in tens: each cycle's batch would be small
                producer.multi_publish("trickle", [b"m%05d" % (sent + i) for i in range(10)])
                time.sleep(0.01)  # pacing the trickle, not waiting for anything
        wait_for(lambda: channel_stats(nsqd, "trickle", "spark").get("finish_count") == total, timeout=60,
                 what="every message FINed, the last ones after maxBatchDelay")
        assert query.exception() is None
        rows = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    finally:
        query.stop()
    assert sum(rows) == total
    # the first batch (the lone first message), then full ones, then the remainder
    assert rows[0] == 1 and all(n >= low for n in rows[1:-1]) and len(rows) <= 2 + total // low, rows


def test_sink_publishes_a_million_rows_and_a_consumer_receives_every_one(
        spark: Any, nsqd_factory: Callable[..., Daemon]) -> None:
    nsqd = nsqd_factory()
    rows = 1_000_000
    (spark.range(rows).selectExpr("CAST(id AS STRING) AS body").repartition(2)
     .write.format("nsq").mode("append").option("nsqdTCPAddress", addr(nsqd)).option("topic", "million").save())
    received = consume(nsqd, "million", "check", rows, timeout=120)
    assert len(received) == rows
    assert set(received) == {str(i).encode() for i in range(rows)}


def test_sink_fails_the_write_when_nsqd_refuses_a_batch_and_publishes_again_after(
        spark: Any, nsqd_factory: Callable[..., Daemon]) -> None:
    """nsqd refuses an MPUB (a body over its --max-msg-size, which the sink's maxMsgSize allows):
    the write fails with nsqd's error, and the next write on the same workers publishes."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    nsqd = nsqd_factory("--max-msg-size=100")

    def write(size: int, topic: str) -> None:
        (spark.range(30_000).selectExpr(f"lpad(CAST(id AS STRING), {size}, 'x') AS body").repartition(2)
         .write.format("nsq").mode("append").option("nsqdTCPAddress", addr(nsqd)).option("topic", topic).save())

    with pytest.raises((PySparkException, Py4JJavaError), match="E_BAD_MESSAGE"):
        write(200, "refused")
    write(50, "accepted")
    received = consume(nsqd, "accepted", "check", 30_000, timeout=60)
    assert sorted(received) == sorted(str(i).rjust(50, "x").encode() for i in range(30_000))


def test_stream_sink_publishes_binary_bodies_to_each_rows_topic(
        spark: Any, nsqd_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    nsqd = nsqd_factory()
    publish(nsqd, "in", (b"line %d\nwith a newline" % i for i in range(2000)))
    df = stream(spark, nsqd, "in", "fanout")
    number = "CAST(regexp_extract(CAST(body AS STRING), 'line ([0-9]+)', 1) AS INT)"
    routed = df.selectExpr("body", f"CASE WHEN {number} % 2 = 0 THEN 'even' ELSE 'odd' END AS topic")
    query = (routed.writeStream.format("nsq").option("nsqdTCPAddress", addr(nsqd))
             .option("checkpointLocation", str(tmp_path / "ckpt")).start())
    try:
        even = consume(nsqd, "even", "c", 1000, timeout=60)
        odd = consume(nsqd, "odd", "c", 1000, timeout=60)
    finally:
        query.stop()
    assert sorted(even + odd) == sorted(b"line %d\nwith a newline" % i for i in range(2000))
    assert all(int(b.split()[1]) % 2 == 0 for b in even)


def test_bad_options_are_clear_errors(spark: Any, nsqd_factory: Callable[..., Daemon]) -> None:
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    with pytest.raises((PySparkException, Py4JJavaError, ValueError), match="option topic is required"):
        spark.readStream.format("nsq").option("nsqdTCPAddresses", "127.0.0.1:1").option("channel", "c").load() \
            .writeStream.format("console").start().awaitTermination(scaled(120))  # raises once it fails
    with pytest.raises((PySparkException, Py4JJavaError, ValueError), match="'body' column"):
        spark.range(1).write.format("nsq").mode("append").option("nsqdTCPAddress", "127.0.0.1:1") \
            .option("topic", "t").save()


def readme_command() -> str:
    """The ``nsq_spark_pipeline`` example from the README, continuation lines joined."""
    text = (ROOT / "README.md").read_text()
    match = re.search(r"^(nsq_spark_pipeline .*?)(?<!\\)$", text, re.M | re.S)
    assert match, "README has no nsq_spark_pipeline example"
    return match.group(1).replace("\\\n", " ")


def test_pipeline_command_from_the_readme_survives_a_kill_and_restart(
        spark: Any, nsqd_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    """Run where its working directory holds another ``pynsqd/`` package: Spark's Python
    workers (``python -m pyspark.daemon`` there) still run the installed code."""
    decoy = tmp_path / "checkout"
    imported = decoy_checkout(decoy)
    nsqd = nsqd_factory("--max-rdy-count=30000")
    total = 40_000
    publish(nsqd, "events", (b"e%05d" % i for i in range(total)))
    command = readme_command().replace("127.0.0.1:4150", addr(nsqd)).replace("/data/", f"{tmp_path}/")
    args = [*shlex.split(command)[1:], "--msg-timeout=3s", "--progress-interval=1s", "--max-in-flight=15000"]
    out = tmp_path / "events"
    log = tmp_path / "pipeline.log"
    first = Pipeline(args, log, cwd=decoy)
    try:
        wait_for(lambda: rows_committed(out) or first.proc.poll() is not None, timeout=120,
                 interval=0.3, what="the first committed batch")
    finally:
        first.kill()  # the driver and its JVM die mid-stream
    assert committed_count(spark, out) < total, first.output()
    second = Pipeline(args, log, cwd=decoy)
    try:
        def all_there() -> bool:
            assert second.proc.poll() is None, second.output()
            df = committed(spark, out)
            return df is not None and df.select("line").distinct().count() == total
        wait_for(all_there, timeout=180, interval=1.0, what="every message after the restart")
        wait_for(lambda: re.search(r"batch \d+ rows \d+ rows/s [\d,]+ lag", second.output()), timeout=30,
                 interval=0.2, what="a progress line")
        assert re.search(r"first rows committed [\d.]+s after start \(batch \d+, \d+ rows\)", second.output())
    finally:
        code = second.interrupt()
    assert code == 0, second.output()
    assert "nsq_spark_pipeline: stopped" in second.output()
    result = committed(spark, out)
    assert {r.line for r in result.select("line").distinct().collect()} == {f"e{i:05d}" for i in range(total)}
    assert "date" in result.columns  # partitioned by date
    assert not imported.exists(), imported.read_text()


def test_pipeline_with_a_dedupe_window_writes_each_message_once_across_a_crash_between_commit_and_fin(
        spark: Any, nsqd_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    """The driver dies after a batch's rows were committed and before its FIN: nsqd delivers
    those messages again after the restart, and ``--dedupe-window`` drops them."""
    nsqd = nsqd_factory("--max-rdy-count=30000")
    total = 20_000
    publish(nsqd, "orders", (b"d%05d" % i for i in range(total)))
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    args = [f"--nsqd-tcp-address={addr(nsqd)}", "--topic=orders", "--dedupe-window=10m",
            "--sql=SELECT id, attempts, timestamp, CAST(body AS STRING) AS line FROM nsq",
            f"--output-dir={out}", f"--checkpoint-dir={ckpt}", "--max-batch=3000", "--max-in-flight=10000",
            "--msg-timeout=3s", "--trigger-interval=2s"]
    log = tmp_path / "pipeline.log"
    first = Pipeline(args, log)
    try:
        kill_between_commit_and_fin(first, ckpt, data_batches=2)
    finally:
        first.kill()
    assert 0 < committed_count(spark, out) < total
    second = Pipeline(args, log)
    try:
        def all_there() -> bool:
            assert second.proc.poll() is None, second.output()
            stats = channel_stats(nsqd, "orders", "nsq_spark_pipeline")
            return (stats.get("depth") == 0 and stats.get("in_flight_count") == 0
                    and committed_count(spark, out) >= total)
        wait_for(all_there, timeout=180, interval=1.0, what="every message committed after the restart")
    finally:
        second.kill()
    result = committed(spark, out)
    assert result.filter("attempts > 1").count() > 0  # messages did come back from nsqd
    assert result.count() == total
    assert {r.line for r in result.select("line").collect()} == {f"d{i:05d}" for i in range(total)}


def test_nsq_to_file_archives_are_read_by_sparks_native_text_json_and_file_stream(
        spark: Any, nsqd_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    import json
    import signal
    import subprocess
    import sys

    nsqd = nsqd_factory()
    total = 5000
    publish(nsqd, "archive", (json.dumps({"n": i, "text": f"line {i}"}).encode() for i in range(total)))
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    work.mkdir()
    tool = subprocess.Popen([sys.executable, "-m", "pynsqd.tools.nsq_to_file", f"--nsqd-tcp-address={addr(nsqd)}",
                             "--topic=archive", f"--output-dir={out}", f"--work-dir={work}", "--gzip",
                             "--rotate-size=20000", "--max-in-flight=1000"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def written() -> bool:
            stats = channel_stats(nsqd, "archive", "nsq_to_file")
            return stats.get("depth") == 0 and stats.get("in_flight_count") == 0 and stats["finish_count"] == total
        wait_for(written, timeout=60, interval=0.2, what="nsq_to_file to write every message")
    finally:
        tool.send_signal(signal.SIGINT)
        code = tool.wait(60)
    assert code == 0
    files = sorted(out.glob("*.gz"))
    assert len(files) > 1  # rotated: several complete files
    text = spark.read.text(str(out))
    assert text.count() == total
    rows = spark.read.json(str(out)).select("n").collect()
    assert sorted(r.n for r in rows) == list(range(total))
    query = (spark.readStream.format("text").load(str(out)).writeStream.format("parquet")
             .option("path", str(tmp_path / "copy")).option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(120)
    assert committed_count(spark, tmp_path / "copy") == total
