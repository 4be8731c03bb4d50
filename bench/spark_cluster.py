"""``nsq_spark_pipeline`` rows/s: a standalone cluster of isolated workers against local[2],
with and without ``--dedupe-window``.

    .venv/bin/python bench/spark_cluster.py [--messages 600000] [--max-batch 50000] [--repeat 2]

As ``tests/test_spark_cluster.py`` sets it up (root: ``unshare -m``): two nsqlookupd, three
pynsqd nodes registered with both, a Spark master and two workers (2 cores each), each in a
mount namespace of its own with an empty tmpfs on ``/tmp``, so executors fetch every batch
from the driver over TCP and share only the output directory (under ``/var/tmp``). Each run
publishes ``--messages`` 100-byte messages spread over the three nodes into a channel that
exists, then runs the pipeline (``--sql`` selecting id, timestamp and the body as a string,
Parquet output, reading through the lookupds) until every node reports every message FINed:

- ``cluster``: ``spark-submit --master spark://…`` with two executors of one core (one per
  worker); ``local``: ``--master=local[2]``, the same two task slots in the driver's JVM;
- ``+dedupe``: with ``--dedupe-window=10m``.

``rows_s`` runs from the pipeline's start (JVM and Spark start-up included) to the last FIN;
``steady_rows_s`` from the first FIN seen to the last. Each configuration runs ``--repeat``
times, the configurations interleaved; medians are printed.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Figures
from testbed.harness import Daemon
from testbed.spark_helpers import Pipeline, publish, start_standalone

CONFIGS = {"cluster": False, "cluster+dedupe": True, "local": False, "local+dedupe": True}
SUBMIT = ["--conf", "spark.executor.cores=1", "--conf", "spark.cores.max=2", "--conf", "spark.executor.memory=1g",
          "--conf", "spark.ui.enabled=false"]


def channel_totals(nodes: list[Daemon], topic: str, channel: str) -> tuple[int, bool]:
    """FINs summed over the nodes' clients, and whether every node's channel is drained."""
    from testbed.spark_helpers import channel_stats

    fin, drained = 0, True
    for node in nodes:
        stats = channel_stats(node, topic, channel)
        fin += stats.get("finish_count", 0)
        drained = drained and stats.get("depth") == 0 and stats.get("in_flight_count") == 0
    return fin, drained


def one_run(name: str, n: int, args: argparse.Namespace, nodes: list[Daemon], lookupds: list[Daemon], url: str,
            work: Path) -> Figures:
    import httpx

    topic = f"bench{n}"
    for node in nodes:
        httpx.post(f"{node.http_url}/topic/create", params={"topic": topic}).raise_for_status()
        httpx.post(f"{node.http_url}/channel/create", params={"topic": topic, "channel": "spark"}).raise_for_status()
    share = -(-args.messages // len(nodes))
    for node in nodes:
        publish(node, topic, (b"x" * args.size for _ in range(share)), chunk=10_000)
    total = share * len(nodes)
    flags = [*(f"--lookupd-http-address={lk.http_url.removeprefix('http://')}" for lk in lookupds),
             f"--topic={topic}", "--channel=spark", "--sql=SELECT id, timestamp, CAST(body AS STRING) AS line FROM nsq",
             f"--output-dir={work / topic}", f"--checkpoint-dir={work / (topic + '.ckpt')}",
             f"--max-batch={args.max_batch}", f"--max-in-flight={3 * args.max_batch}", "--progress-interval=60s"]
    if CONFIGS[name]:
        flags.append("--dedupe-window=10m")
    log = work / f"{topic}.log"
    t0 = time.perf_counter()
    if name.startswith("cluster"):
        pipeline = Pipeline(flags, log, submit=["--master", url, *SUBMIT])
    else:
        pipeline = Pipeline([*flags, "--master=local[2]"], log)
    first: tuple[float, int] | None = None
    try:
        while True:
            fin, drained = channel_totals(nodes, topic, "spark")
            now = time.perf_counter()
            if first is None and fin > 0:
                first = (now, fin)
            if fin >= total and drained:
                break
            if pipeline.proc.poll() is not None:
                raise SystemExit(f"{name}: the pipeline exited: {pipeline.output()[-3000:]}")
            time.sleep(0.05)
    finally:
        pipeline.kill()
    assert first is not None
    return {"rows_s": total / (now - t0), "steady_rows_s": (total - first[1]) / max(now - first[0], 1e-9),
            "secs": now - t0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=600_000)
    parser.add_argument("--size", type=int, default=100, help="body bytes")
    parser.add_argument("--max-batch", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--only", choices=sorted(CONFIGS), action="append", help="run only these configurations")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-spark-cluster-"))
    work = Path(tempfile.mkdtemp(prefix="bench-spark-cluster-", dir="/var/tmp"))
    daemons: list[Daemon] = []
    cluster = []
    try:
        lookupds = [Daemon("pynsqd.lookupd", ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                                              "--broadcast-address=127.0.0.1"]).start() for _ in range(2)]
        daemons += lookupds
        held = args.messages + 3 * args.max_batch
        nodes = []
        for i in range(3):
            nodes.append(Daemon("pynsqd.supervisor", [
                "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", f"--data-path={tmp / f'nsqd{i}'}",
                "--broadcast-address=127.0.0.1", *(f"--lookupd-tcp-address=127.0.0.1:{lk.tcp[1]}" for lk in lookupds),
                f"--max-rdy-count={3 * args.max_batch}", f"--mem-queue-size={held}",
                f"--mem-queue-bytes={max(32 << 20, held * (args.size + 96))}"]).start())
            daemons.append(nodes[-1])
        url, cluster = start_standalone(tmp / "cluster", workers=2, isolated=True)
        names = args.only or list(CONFIGS)
        results: dict[str, list[Figures]] = {name: [] for name in names}
        counter = 0
        for round_ in range(args.repeat):
            for name in names if round_ % 2 == 0 else names[::-1]:
                figures = one_run(name, counter, args, nodes, lookupds, url, work)
                counter += 1
                results[name].append(figures)
                print(f"run {round_ + 1} {name}: " + ", ".join(f"{k}={v:,.1f}" for k, v in figures.items()),
                      flush=True)
        print(f"\nmedians of {args.repeat}, {args.messages:,} x {args.size} B, maxBatch {args.max_batch:,}, "
              "machine shared with other work:")
        for name, runs in results.items():
            row = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            print(f"  {name:15s} " + "  ".join(f"{k}={v:,.0f}" for k, v in row.items()))
    finally:
        for proc in reversed(cluster):
            proc.stop()
        for daemon in daemons:
            daemon.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
