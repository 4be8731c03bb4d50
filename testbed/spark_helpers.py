"""Helpers for the Spark tests: one SparkSession per module, a standalone cluster, NSQ I/O.

Everything here runs real parts: Spark from the pip install (local mode, or a master and a
worker started with ``spark-class``), a real nsqd, and ``pynsqd.client`` to publish and
consume. Processes are started on free ports and stopped by pid.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx

from pynsqd.client import Consumer, Message, SyncProducer
from testbed.harness import Daemon, scaled, wait_for
from testbed.loop import run_async

ROOT = str(Path(__file__).resolve().parents[1])  # the checkout


def make_session() -> Any:
    """A local[2] SparkSession sized for tests (UI off, few shuffle partitions)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("pynsqd-tests")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.streaming.stopTimeout", "30s")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def committed(spark: Any, path: Path) -> Any:
    """What the Parquet file sink committed (its metadata log hides uncommitted files)."""
    log = path / "_spark_metadata"
    if not log.exists() or not any(f.name.isdigit() for f in log.iterdir()):
        return None
    from pyspark.errors import AnalysisException

    try:
        return spark.read.parquet(str(path))
    except AnalysisException:  # the logged batches wrote no file yet (empty heartbeat batches)
        return None


def rows_committed(path: Path) -> bool:
    """The Parquet file sink committed a batch with rows (its metadata log names a file):
    a directory listing, not a Spark job, so a kill right after it comes mid-stream."""
    log = path / "_spark_metadata"
    return log.exists() and any(f.name.isdigit() and len(f.read_text().splitlines()) > 1 for f in log.iterdir())


def committed_count(spark: Any, path: Path) -> int:
    df = committed(spark, path)
    return 0 if df is None else int(df.count())


def publish(nsqd: Daemon, topic: str, bodies: Iterable[bytes], chunk: int = 5000) -> int:
    """MPUB ``bodies`` to ``topic`` on ``nsqd``; returns how many."""
    host, port = nsqd.tcp
    n = 0
    batch: list[bytes] = []
    with SyncProducer(f"{host}:{port}") as producer:
        for body in bodies:
            batch.append(body)
            if len(batch) == chunk:
                producer.multi_publish(topic, batch)
                n += len(batch)
                batch = []
        if batch:
            producer.multi_publish(topic, batch)
            n += len(batch)
    return n


def consume(nsqd: Daemon, topic: str, channel: str, count: int, timeout: float = 60.0) -> list[bytes]:
    """Consume (and FIN) ``count`` messages; returns their bodies."""
    host, port = nsqd.tcp
    bodies: list[bytes] = []

    async def main() -> None:
        import asyncio

        done = asyncio.Event()

        def handler(message: Message) -> None:
            bodies.append(message.body)
            if len(bodies) >= count:
                done.set()

        consumer = Consumer(topic, channel, handler, nsqd_tcp_addresses=[f"{host}:{port}"], max_in_flight=2500)
        await consumer.start()
        try:
            await asyncio.wait_for(done.wait(), scaled(timeout))
        finally:
            await consumer.stop(grace=5.0)

    run_async(main())
    return bodies


def channel_stats(nsqd: Daemon, topic: str, channel: str) -> dict[str, Any]:
    """The channel's /stats entry, plus ``finish_count`` summed over its clients."""
    data = httpx.get(f"{nsqd.http_url}/stats", params={"format": "json", "topic": topic}).json()
    for t in data["topics"] or []:  # null: no such topic (yet)
        for c in t["channels"]:
            if t["topic_name"] == topic and c["channel_name"] == channel:
                c["finish_count"] = sum(client["finish_count"] for client in c["clients"] or [])
                return dict(c)
    return {}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SparkProcess:
    """A JVM started with ``spark-class`` (master or worker), in its own process group."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str], isolated: bool = False) -> None:
        from pyspark.find_spark_home import _find_spark_home

        command = [str(Path(_find_spark_home()) / "bin" / "spark-class"), *args]
        self.log = log
        self._out = open(log, "wb")
        self.proc = subprocess.Popen(private_tmp(command) if isolated else command, stdout=self._out,
                                     stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def executors(self, application: str = "") -> list[int]:
        """The pids of the executor JVMs this worker started (for ``application`` only)."""
        import psutil

        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        found = []
        for child in children:
            try:
                cmdline = child.cmdline()
                if "org.apache.spark.executor.CoarseGrainedExecutorBackend" in cmdline and (
                        not application or application in cmdline):
                    found.append(child.pid)
            except psutil.NoSuchProcess:
                continue
        return found

    def wait_for_log(self, pattern: str, timeout: float = 60.0) -> None:
        rx = re.compile(pattern)
        wait_for(lambda: rx.search(self.log.read_text(errors="replace")) or self.proc.poll() is not None,
                 timeout, interval=0.1, what=f"{pattern!r} in {self.log}")
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.log} exited: {self.log.read_text(errors='replace')[-2000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(scaled(20))
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._out.close()


# run as ``sh -c`` in the new mount namespace: the old /tmp stays reachable at /mnt (this
# namespace only) while the checkout and the virtualenv, when they live under /tmp, are bound
# back into the empty tmpfs; then /mnt is let go
_PRIVATE_TMP = """set -e
keep="$1"; shift
[ -n "$keep" ] && mount --bind /tmp /mnt
mount -t tmpfs -o size=4g pynsqd-private-tmp /tmp
for path in $keep; do mkdir -p "$path"; mount --bind "/mnt/${path#/tmp/}" "$path"; done
[ -n "$keep" ] && umount -l /mnt
exec "$@"
"""


def _kept_under_tmp() -> list[str]:
    """The paths under /tmp a private /tmp must still show: this checkout and the virtualenv
    the processes run from (each once, the outermost), so a clone in /tmp runs too."""
    paths = sorted({os.path.realpath(p) for p in (ROOT, sys.prefix)})
    under = [p for p in paths if p.startswith("/tmp/")]
    return [p for p in under if not any(p != q and p.startswith(q + "/") for q in under)]


def private_tmp(command: list[str]) -> list[str]:
    """``command`` in a mount namespace of its own with an empty tmpfs on ``/tmp`` (needs root):
    it and its children see none of the other processes' temporary files, as on another host
    (only the checkout and the virtualenv are still seen where they live under /tmp)."""
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", _PRIVATE_TMP, "private-tmp",
            " ".join(_kept_under_tmp()), *command]


def start_standalone(tmp: Path, workers: int = 1, isolated: bool = False,
                     cores: int = 2) -> tuple[str, list[SparkProcess]]:
    """A standalone master and ``workers`` workers on free ports; returns the master URL and
    processes (master first). ``isolated``: each in its own private ``/tmp`` (``private_tmp``),
    where its work and local directories are, so they share no temporary storage with each
    other or the driver, and each worker on an address of its own."""
    tmp.mkdir(parents=True, exist_ok=True)
    scratch = Path("/tmp/spark") if isolated else tmp
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_NO_DAEMONIZE="1",
               SPARK_WORKER_DIR=str(scratch / "work"), SPARK_LOCAL_DIRS=str(scratch / "local"),
               SPARK_DAEMON_JAVA_OPTS="-XX:TieredStopAtLevel=1")  # master and workers: C1 is plenty
    port, webui = free_port(), free_port()
    master = SparkProcess(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                           "--webui-port", str(webui)], tmp / "master.log", env, isolated)
    procs = [master]
    try:
        master.wait_for_log(r"I have been elected leader")
        url = f"spark://127.0.0.1:{port}"
        for i in range(workers):
            # isolated: a loopback address each (127.0.0.2, ...), so Spark takes them for separate
            # hosts and fetches shuffle blocks over the network instead of from a "local" disk
            host = f"127.0.0.{2 + i}" if isolated else "127.0.0.1"
            procs.append(SparkProcess(["org.apache.spark.deploy.worker.Worker", "--host", host,
                                       "--port", str(free_port()), "--webui-port", str(free_port()),
                                       "--cores", str(cores), "--memory", "1g", url],
                                      tmp / f"worker{i}.log", env, isolated))
        for worker in procs[1:]:
            worker.wait_for_log(r"Successfully registered with master")
    except BaseException:
        for proc in procs:
            proc.stop()
        raise
    return url, procs


class Pipeline:
    """``nsq_spark_pipeline`` as a subprocess (its own process group, so its JVM dies with it)."""

    def __init__(self, args: list[str], log: Path, submit: list[str] | None = None,
                 cwd: Path | None = None) -> None:
        """``submit``: launch it with ``spark-submit`` and these options (the script is
        ``pynsqd/spark/pipeline.py``), else as the installed ``nsq_spark_pipeline`` command
        (in ``cwd``, if given)."""
        self.log = log
        self._out = open(log, "ab")
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
        if submit is None:
            command = [str(Path(sys.executable).parent / "nsq_spark_pipeline"), *args]
        else:
            from pyspark.find_spark_home import _find_spark_home

            import pynsqd.spark.pipeline

            command = [str(Path(_find_spark_home()) / "bin" / "spark-submit"), *submit,
                       pynsqd.spark.pipeline.__file__, *args]
        self.proc = subprocess.Popen(command, stdout=self._out, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True, cwd=cwd)
        self.lock = threading.Lock()

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def application(self) -> str:
        """The Spark application id the pipeline printed when its query started ("" before)."""
        match = re.search(r"in application (\S+)", self.output())
        return match.group(1) if match else ""

    def kill(self) -> None:
        """SIGKILL the whole process group: the driver and its JVM die at once, a crash."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._out.close()

    def interrupt(self, timeout: float = 60.0) -> int:
        self.proc.send_signal(signal.SIGINT)
        try:
            code = self.proc.wait(scaled(timeout))
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            self._out.close()
        return code


def _data_batch(ckpt: Path, batch: int) -> bool:
    """Whether the logged batch carried messages: its end offset is a new ``seq`` (``hb`` 0),
    not a heartbeat."""
    lines = (ckpt / "offsets" / str(batch)).read_text().splitlines()
    return bool(json.loads(lines[-1]).get("hb") == 0)


def kill_between_commit_and_fin(pipeline: Pipeline, ckpt: Path, data_batches: int = 1,
                                timeout: float = 120.0) -> int:
    """SIGKILL ``pipeline`` right after Spark logged the commit of a batch with messages (the
    ``data_batches``-th or later), before it planned the next one: the source FINs a batch only
    when the next is planned, so that batch's messages are in the output *and* come back from
    nsqd. Fails unless the kill landed there; returns the batch id."""
    commits = ckpt / "commits"

    def committed_data_batch() -> tuple[int] | None:
        assert pipeline.proc.poll() is None, pipeline.output()
        done = sorted(int(f.name) for f in commits.iterdir() if f.name.isdigit()) if commits.is_dir() else []
        if not done or (ckpt / "offsets" / str(done[-1] + 1)).exists():
            return None
        data = [batch for batch in done if _data_batch(ckpt, batch)]
        return (done[-1],) if len(data) >= data_batches and data[-1] == done[-1] else None

    (batch,) = wait_for(committed_data_batch, timeout, interval=0.02, what="a committed batch with messages")
    pipeline.kill()
    assert not (ckpt / "offsets" / str(batch + 1)).exists(), (
        f"batch {batch + 1} was planned (and batch {batch} FINed) before the kill landed")
    return int(batch)
