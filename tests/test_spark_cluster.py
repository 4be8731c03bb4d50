"""``nsq_spark_pipeline`` on a Spark standalone cluster whose hosts share no temporary storage.

The master and two workers each run in a mount namespace of their own with an empty tmpfs on
``/tmp`` (``unshare -m``, as root), so no executor sees another's temporary files or the
driver's, as on separate hosts; the topic is on three nodes found through two lookupds. Two
pipelines — one with ``--dedupe-window``, one without — are started with ``spark-submit``,
each on its own channel of the topic (so each gets every message). In each, one executor is
killed with SIGKILL mid-run, then the driver right after a batch's commit and before its FIN,
and the driver is restarted on its checkpoint. Spark then reads the committed Parquet output:
every published body exactly once with the window, at least once (and some twice) without.
The output and the checkpoints are the only shared storage, as HDFS or S3 would be.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

pytest.importorskip("pyspark", reason="the spark extra is not installed")

from testbed.harness import Daemon, wait_for
from testbed.spark_helpers import (
    Pipeline,
    SparkProcess,
    channel_stats,
    committed,
    kill_between_commit_and_fin,
    make_session,
    publish,
    start_standalone,
)
from tests.test_discovery import lookupd_factory, registered_nsqd  # noqa: F401  (the fixture)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.spark,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                       reason="private /tmp namespaces need root and unshare"),
]

TOPIC = "clicks"
BACKLOG = 1000  # messages per node before the pipelines start
RATE = 300  # messages/s published (over the nodes) until both drivers were killed and restarted
CHANNELS = {"exactly": ["--dedupe-window=10m"], "atleast": []}
C1_ONLY = "-XX:TieredStopAtLevel=1"  # a short run: the JIT's C2 compiler would take CPU for little gain
SUBMIT = ["--conf", "spark.executor.cores=1", "--conf", "spark.cores.max=2", "--conf", "spark.executor.memory=512m",
          "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=2",
          "--conf", f"spark.driver.extraJavaOptions={C1_ONLY}", "--conf", f"spark.executor.extraJavaOptions={C1_ONLY}"]


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """Storage the driver and every executor see (outside /tmp), as HDFS or S3 would be."""
    path = Path(tempfile.mkdtemp(prefix="pynsqd-spark-shared-", dir="/var/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


class Publisher(threading.Thread):
    """MPUBs numbered bodies to the nodes in turn, ``RATE`` a second, until ``stop``."""

    def __init__(self, nodes: list[Daemon]) -> None:
        super().__init__(daemon=True)
        self.nodes = nodes
        self.bodies: set[str] = set()
        self._halt = threading.Event()
        self._next = 0

    def send(self, per_node: int) -> None:
        for node in self.nodes:
            batch = [f"m{self._next + i:06d}" for i in range(per_node)]
            self._next += per_node
            publish(node, TOPIC, (b.encode() for b in batch))
            self.bodies.update(batch)

    def run(self) -> None:
        while not self._halt.wait(0.1):  # pacing the stream, not waiting for anything
            self.send(max(1, RATE // 10 // len(self.nodes)))

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join()


def kill_an_executor(worker: SparkProcess, pipeline: Pipeline) -> int:
    """SIGKILL one of ``pipeline``'s executors on ``worker``; returns its pid."""
    app = wait_for(pipeline.application, timeout=60, interval=0.2, what="the application id")
    (pid, *_) = wait_for(lambda: worker.executors(app), timeout=60, interval=0.2, what=f"an executor of {app}")
    os.kill(pid, signal.SIGKILL)
    return int(pid)


def left(nodes: list[Daemon], channel: str) -> int:
    """Messages of ``channel`` not FINed yet, over the nodes."""
    return sum(stats.get("depth", 0) + stats.get("in_flight_count", 0)
               for stats in (channel_stats(node, TOPIC, channel) for node in nodes))


@pytest.mark.timeout(600)  # ~3 minutes alone on the 2-core machine; much more when it is shared
def test_pipeline_on_an_isolated_cluster_through_lookupds_survives_executor_and_driver_kills(
        tmp_path: Path, shared_dir: Path, nsqd_factory: Callable[..., Daemon],
        lookupd_factory: Callable[..., Daemon]) -> None:  # noqa: F811
    lookupds = [lookupd_factory(), lookupd_factory()]
    nodes = [registered_nsqd(nsqd_factory, lookupds, "--max-rdy-count=20000") for _ in range(3)]
    for node in nodes:
        httpx.post(f"{node.http_url}/topic/create", params={"topic": TOPIC}).raise_for_status()
        for channel in CHANNELS:  # before publishing: each channel gets every message
            httpx.post(f"{node.http_url}/channel/create", params={"topic": TOPIC, "channel": channel}
                       ).raise_for_status()
    publisher = Publisher(nodes)
    publisher.send(BACKLOG)
    url, cluster = start_standalone(tmp_path / "cluster", workers=2, isolated=True)
    pipelines: dict[str, Pipeline] = {}

    def args(channel: str) -> list[str]:
        return [*(f"--lookupd-http-address={lk.http_url.removeprefix('http://')}" for lk in lookupds),
                f"--topic={TOPIC}", f"--channel={channel}", *CHANNELS[channel],
                "--sql=SELECT id, attempts, timestamp, CAST(body AS STRING) AS line FROM nsq",
                f"--output-dir={shared_dir / channel}", f"--checkpoint-dir={shared_dir / (channel + '.ckpt')}",
                "--max-batch=1500", "--max-in-flight=12000", "--msg-timeout=5s", "--trigger-interval=2s",
                "--progress-interval=2s"]

    def start(channel: str) -> Pipeline:
        pipelines[channel] = Pipeline(args(channel), tmp_path / f"{channel}.log",
                                      submit=["--master", url, *SUBMIT])
        return pipelines[channel]

    publisher.start()
    try:
        for channel in CHANNELS:
            start(channel)
        for channel, pipeline in pipelines.items():
            # mid-run: after its first batch with messages, one executor of each dies
            log = shared_dir / channel / "_spark_metadata"
            wait_for(lambda log=log: log.is_dir() and any(f.name.isdigit() for f in log.iterdir()), timeout=240,
                     interval=0.2, what=f"{channel}: a committed batch")
            kill_an_executor(cluster[1], pipeline)
        for channel, pipeline in pipelines.items():
            # then the driver, after a batch's rows were committed and before its FIN
            kill_between_commit_and_fin(pipeline, shared_dir / f"{channel}.ckpt", data_batches=2, timeout=240)
        for channel in CHANNELS:
            assert left(nodes, channel) > 0  # killed mid-run
            start(channel)
        publisher.stop()

        def drained() -> bool:
            for pipeline in pipelines.values():
                assert pipeline.proc.poll() is None, pipeline.output()
            return all(left(nodes, channel) == 0 for channel in CHANNELS)
        wait_for(drained, timeout=300, interval=1.0, what="every message committed and FINed on every node")
    finally:
        try:
            for pipeline in pipelines.values():
                pipeline.kill()
        finally:
            for proc in reversed(cluster):
                proc.stop()
            publisher.stop()
    spark = make_session()  # Spark reads what the file sinks committed
    try:
        exactly = committed(spark, shared_dir / "exactly")
        assert exactly.count() == len(publisher.bodies)
        assert {r.line for r in exactly.select("line").collect()} == publisher.bodies
        atleast = [r.line for r in committed(spark, shared_dir / "atleast").select("line").collect()]
    finally:
        spark.stop()
    assert set(atleast) == publisher.bodies
    assert len(atleast) > len(publisher.bodies)  # without the window, the batch committed but not FINed came back
