"""Backlog benchmark: publish far more than ``--mem-queue-size`` holds, then drain it.

Starts its own node (one shard, ``--mem-queue-size=10000`` unless told otherwise) with one
channel, publishes ``--count`` messages (MPUB batches from separate processes; the first
100,000 (or all, when fewer) alone so the server's RSS can be read at that backlog), reads the RSS again with
everything queued (and how many of them are on disk), then drains the channel with FIN-ing
consumers. Messages beyond ``--mem-queue-size`` spill to the disk queue and come back
through the log before delivery, so the server's RSS stays bounded by ``--mem-queue-size``
messages however large the backlog.

  .venv/bin/python bench/bench_backlog.py --count 2000000 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_tcp import _connect, _read_response, consumer, create_channels  # noqa: E402
from bench.common import Figures, Meter, gather_results, report, running_node  # noqa: E402
from pynsqd.wire.commands import encode_mpub  # noqa: E402


def publish_count(addr: tuple[str, int], topic: str, size: int, batch: int, count: int,
                  out: mp.Queue) -> None:  # type: ignore[type-arg]
    sock = _connect(addr)
    frame = encode_mpub(topic, [b"a" * size] * batch)
    sent = 0
    while sent < count:
        sock.sendall(frame)
        _read_response(sock)
        sent += batch
    sock.close()
    out.put((sent, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))


def _phase(procs: list[mp.Process], q: mp.Queue, meter: Meter) -> tuple[int, float, float]:  # type: ignore[type-arg]
    """Run ``procs``; (messages, seconds, largest load-process RSS in MiB)."""
    t0 = time.monotonic()
    results = gather_results(procs, q, meter.rss)
    elapsed = time.monotonic() - t0
    count = sum(r[0] for r in results)
    load_rss = max((r[1] for r in results if not isinstance(r[1], list)), default=0.0)
    return count, elapsed, float(load_rss)


def _finished(http_port: int) -> int:
    """Messages FINed on the channel so far (from /stats): those that reached it minus those
    still queued or in flight. Not the clients' ``finish_count``: a consumer that got its
    ``total`` alone (a small backlog) disconnects, and its count leaves the stats with it."""
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/stats?format=json&topic=backlog") as r:
        stats = json.loads(r.read())
    return sum(ch["message_count"] - ch["depth"] - ch["in_flight_count"] - ch["deferred_count"]
               for t in stats["topics"] or [] for ch in t["channels"])


def _on_disk(http_port: int) -> int:
    """Messages of the channel in its disk queue (not in shared memory)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/stats?format=json&topic=backlog") as r:
        stats = json.loads(r.read())
    return sum(ch["backend_depth"] for t in stats["topics"] or [] for ch in t["channels"])


def one_run(args: argparse.Namespace) -> Figures:
    ctx = mp.get_context("spawn")
    figures: Figures = {}
    flags = (f"--mem-queue-size={args.mem_queue_size}", "--log-level=info")
    with tempfile.TemporaryDirectory() as data, running_node(data, *flags, stop_timeout=60) as node:
        proc, tcp_port, http_port = node
        addr = ("127.0.0.1", tcp_port)
        meter = Meter(proc.pid)
        time.sleep(0.5)
        figures["idle"] = {"rss_mb": meter.rss() / 2**20}
        create_channels(addr, ["backlog"])
        q = ctx.Queue()
        first = min(100_000, args.count)  # the RSS at this backlog, then the rest
        n1, t1, _ = _phase([ctx.Process(target=publish_count, args=(addr, "backlog", args.size, args.batch,
                                                                    first, q))], q, meter)
        figures[f"at_{n1 // 1000}k"] = {"rss_mb": meter.rss() / 2**20}
        rest = max(0, args.count - n1) // args.workers
        n2, t2, pub_rss = _phase([ctx.Process(target=publish_count, args=(
            addr, "backlog", args.size, args.batch, rest, q)) for _ in range(args.workers)], q, meter)
        figures["pub"] = {"msgs": n1 + n2, "msgs_s": (n1 + n2) / (t1 + t2), "load_rss_mb": pub_rss,
                          "on_disk": _on_disk(http_port)}
        figures[f"at_{(n1 + n2) // 1000}k"] = {"rss_mb": meter.rss() / 2**20}
        total = n1 + n2
        # consumers share the backlog unevenly: the drain ends when the channel is empty
        subs = [ctx.Process(target=consumer, args=(addr, "backlog", "ch", 2500, 3600.0, total,
                                                    time.time() + 0.5, q)) for _ in range(args.workers)]
        t0 = time.monotonic()
        for p in subs:
            p.start()
        finished = 0
        while finished < total:
            time.sleep(0.2)
            meter.rss()
            finished = _finished(http_port)
        t3 = time.monotonic() - t0 - 0.5
        for p in subs:
            p.terminate()
            p.join()
        figures["sub"] = {"msgs": finished, "msgs_s": finished / t3}
        figures["drained"] = {"rss_mb": meter.rss() / 2**20}
        figures["peak"] = {"rss_mb": meter.peak_rss / 2**20}
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=2_000_000, help="messages to publish, then consume")
    parser.add_argument("--size", type=int, default=200, help="message size in bytes")
    parser.add_argument("--batch", type=int, default=200, help="messages per MPUB")
    parser.add_argument("--workers", type=int, default=2, help="load processes per phase")
    parser.add_argument("--mem-queue-size", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    report(one_run, args, f"{args.count:,} x {args.size} B, --mem-queue-size={args.mem_queue_size}, "
                          "one shard, shared 2-core machine")


if __name__ == "__main__":
    main()
