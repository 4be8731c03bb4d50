"""Cost as topics grow: creating many topics and channels, then scraping the node's stats.

Each of ``--topics`` topics (default 2,000) is created by its first ``POST /mpub`` of
``--batch`` messages of ``--size`` B (10 x 200 B), followed by ``POST /channel/create``,
sequentially over one keep-alive connection. Then ``GET /metrics`` (Prometheus) and
``GET /stats?format=json`` are each timed ``--scrapes`` times. Figures: ``create_s`` (wall
time of all the creating requests), ``metrics_ms`` and ``stats_ms`` (medians), ``rss_mb``
(the node's process tree after the scrapes, shared memory touched included). With
``--idle SECONDS``, ``idle_cpu_pct``: the CPU time (user + system) of the node's whole process
tree while it then sits idle for that long, in percent of one core.

``--trees A,B`` starts one node per tree (``bench.common.start_node``'s ``tree``: another
checkout's code runs), interleaved per run, for A/B comparisons:

  .venv/bin/python bench/bench_topics.py --repeat 3 --trees /path/to/base,.

``measure(http_address, count, pid)`` is the workload alone, for a node someone else runs.
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import Meter, running_node  # noqa: E402


def _request(conn: http.client.HTTPConnection, method: str, path: str, body: bytes | None = None) -> bytes:
    conn.request(method, path, body=body)
    resp = conn.getresponse()
    data = resp.read()
    if resp.status != 200:
        raise RuntimeError(f"{method} {path}: {resp.status} {data[:200]!r}")
    return data


def tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and every process under it."""
    root = psutil.Process(pid)
    total = 0
    for p in [root, *root.children(recursive=True)]:
        try:
            total += int(p.memory_info().rss)
        except psutil.NoSuchProcess:
            continue
    return total


def idle_cpu(pid: int, seconds: float) -> float:
    """Percent of one core the process tree of ``pid`` uses over ``seconds`` of no requests."""
    meter = Meter(pid)
    t0, cpu0 = time.perf_counter(), meter.cpu()
    time.sleep(seconds)
    return (meter.cpu() - cpu0) / (time.perf_counter() - t0) * 100


def measure(http_address: tuple[str, int], count: int, pid: int | None = None, *, batch: int = 10,
            size: int = 200, scrapes: int = 9, prefix: str = "bench-topic") -> dict[str, float]:
    """Create ``count`` topics (``/mpub`` then ``/channel/create`` each) on the node at
    ``http_address``, then time ``/metrics`` and ``/stats``; with ``pid`` (the node's top
    process) also its tree's RSS. Returns ``create_s``, ``metrics_ms``, ``stats_ms`` and
    ``rss_mb``."""
    body = b"\n".join([b"x" * size] * batch)
    conn = http.client.HTTPConnection(*http_address, timeout=60)
    try:
        t0 = time.perf_counter()
        for i in range(count):
            topic = f"{prefix}-{i:05d}"
            _request(conn, "POST", f"/mpub?topic={topic}", body)
            _request(conn, "POST", f"/channel/create?topic={topic}&channel=ch")
        create_s = time.perf_counter() - t0
        timings: dict[str, list[float]] = {"metrics_ms": [], "stats_ms": []}
        for _ in range(scrapes):
            for key, path in (("metrics_ms", "/metrics"), ("stats_ms", "/stats?format=json")):
                t1 = time.perf_counter()
                _request(conn, "GET", path)
                timings[key].append((time.perf_counter() - t1) * 1e3)
    finally:
        conn.close()
    figures = {"create_s": create_s, **{k: statistics.median(v) for k, v in timings.items()}}
    if pid is not None:
        figures["rss_mb"] = tree_rss(pid) / 2**20
    return figures


def one_node(tree: Path, args: argparse.Namespace) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-topics-") as data, \
            running_node(data, *args.flag, stop_timeout=60, tree=tree) as (proc, _, http_port):
        figures = measure(("127.0.0.1", http_port), args.topics, proc.pid, batch=args.batch,
                          size=args.size, scrapes=args.scrapes)
        if args.idle:
            figures["idle_cpu_pct"] = idle_cpu(proc.pid, args.idle)
        return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topics", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=10, help="messages in each topic's first /mpub")
    parser.add_argument("--size", type=int, default=200, help="message size in bytes")
    parser.add_argument("--scrapes", type=int, default=9, help="timed /metrics and /stats requests")
    parser.add_argument("--idle", type=float, default=0.0,
                        help="then measure the idle node's CPU over this many seconds")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--trees", default=str(ROOT), help="comma-separated source trees to compare")
    parser.add_argument("--flag", action="append", default=[], help="an extra nsqd flag (repeatable)")
    args = parser.parse_args()
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    runs: dict[Path, list[dict[str, float]]] = {t: [] for t in trees}
    for i in range(args.repeat):
        for tree in trees:
            figures = one_node(tree, args)
            runs[tree].append(figures)
            print(f"run {i + 1} {tree}: " + "  ".join(f"{k}={v:,.2f}" for k, v in figures.items()), flush=True)
    print(f"\nmedian of {args.repeat} run(s), {args.topics} topics:")
    for tree, figs in runs.items():
        print(f"  {tree}: " + "  ".join(f"{k}={statistics.median(f[k] for f in figs):,.2f}" for k in figs[0]))


if __name__ == "__main__":
    main()
