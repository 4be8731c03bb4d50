"""Helpers for the Spark tests: one SparkSession per module, a standalone cluster, NSQ I/O.

Everything here runs real parts: Spark from the pip install (local mode, or a master and a
worker started with ``spark-class``), a real nsqd, and ``pynsqd.client`` to publish and
consume. Processes are started on free ports and stopped by pid.
"""

from __future__ import annotations

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
from tests.conftest import run_async
from tests.support.harness import Daemon, scaled, wait_for


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

    def __init__(self, args: list[str], log: Path, env: dict[str, str]) -> None:
        from pyspark.find_spark_home import _find_spark_home

        spark_class = Path(_find_spark_home()) / "bin" / "spark-class"
        self.log = log
        self._out = open(log, "wb")
        self.proc = subprocess.Popen([str(spark_class), *args], stdout=self._out, stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True)

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


def start_standalone(tmp: Path) -> tuple[str, list[SparkProcess]]:
    """A standalone master and one worker on free ports; returns the master URL and processes."""
    tmp.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_NO_DAEMONIZE="1",
               SPARK_WORKER_DIR=str(tmp / "work"), SPARK_LOCAL_DIRS=str(tmp / "local"))
    port, webui = free_port(), free_port()
    master = SparkProcess(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                           "--webui-port", str(webui)], tmp / "master.log", env)
    procs = [master]
    try:
        master.wait_for_log(r"I have been elected leader")
        url = f"spark://127.0.0.1:{port}"
        worker = SparkProcess(["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                               "--port", str(free_port()), "--webui-port", str(free_port()),
                               "--cores", "2", "--memory", "1g", url], tmp / "worker.log", env)
        procs.append(worker)
        worker.wait_for_log(r"Successfully registered with master")
    except BaseException:
        for proc in procs:
            proc.stop()
        raise
    return url, procs


class Pipeline:
    """``nsq_spark_pipeline`` as a subprocess (its own process group, so its JVM dies with it)."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.log = log
        self._out = open(log, "ab")
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
        self.proc = subprocess.Popen([sys.executable, "-m", "pynsqd.spark.pipeline", *args], stdout=self._out,
                                     stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.lock = threading.Lock()

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL the whole process group: the driver and its JVM die at once, a crash."""
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
