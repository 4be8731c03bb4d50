"""In-process CPU per HTTP ``/pub`` of one shard's connection protocol, without sockets.

    PYTHONPATH=$PWD python bench/bench_httpconn.py [--requests 200000] [--connections 25]
        [--size 200] [--repeat 5] [--pipeline 1] [--profile]

``--connections`` keep-alive connections of an nsqd shard (``shard/httppub.PublishConnection``,
as its HTTP server makes them) over a transport that only counts its writes, served by a real
``NsqdHTTP`` on a real ``Broker`` (one topic, no channel, shared-memory log in a temp dir):
each loop turn, every connection receives one ``POST /pub`` as wrk sends it (one read), then
the loop turns once. ``--pipeline N`` sends N requests in each read (pipelined), which takes
them through the request parser (``httpparse.py``) instead of the plain-publish match.
What is measured is the Python a shard spends per request between the read and the write —
parsing, checks, the publish, the answer — not the kernel's send, receive and wake-ups
(about as much again on a real socket: docs/benchmarks.md). Process CPU µs per request, the
median of ``--repeat`` runs; ``--profile`` prints the cProfile of one run instead.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import statistics
import tempfile
import time
from typing import Any

import uvloop

from pynsqd.httpconn import Connections
from pynsqd.node.config import NsqdOptions
from pynsqd.shard.http import NsqdHTTP
from pynsqd.shard.httppub import PublishConnection
from pynsqd.shard.node import make_broker
from pynsqd.shm.segment import list_segments, unlink_segment


class CountingTransport:
    """A connection's transport that keeps nothing: it counts the answers written."""

    def __init__(self) -> None:
        self.writes = 0

    def write(self, data: bytes) -> None:
        self.writes += 1

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def serve(args: argparse.Namespace, data: str) -> float:
    """CPU seconds for ``args.requests`` requests."""
    opts = NsqdOptions(data_path=data, mem_queue_size=args.requests + 1)
    broker = make_broker(opts)
    try:
        app = NsqdHTTP(broker, opts, {}, lambda: None, lambda _: None)
        connections = Connections()
        conns = []
        for _ in range(args.connections):
            conn = PublishConnection(app, app, connections)
            transport = CountingTransport()
            conn.connection_made(transport)  # type: ignore[arg-type]
            conns.append((conn, transport))
        body = b"a" * args.size
        request = (b"POST /pub?topic=bench HTTP/1.1\r\nHost: 127.0.0.1:4151\r\nContent-Length: %d\r\n"
                   b"Content-Type: application/octet-stream\r\n\r\n%s" % (len(body), body)) * args.pipeline
        turns = args.requests // (args.connections * args.pipeline)
        cpu0 = time.process_time()
        for _ in range(turns):
            for conn, _ in conns:
                conn.data_received(request)
            for _ in range(args.pipeline):  # a turn for each request a connection holds
                await asyncio.sleep(0)
        await asyncio.sleep(0)
        cpu = time.process_time() - cpu0
        answered = sum(t.writes for _, t in conns)
        if answered != turns * args.connections * args.pipeline or broker.topics["bench"].message_count != answered:
            raise SystemExit(f"{answered} answers, {broker.topics['bench'].message_count} stored")
        return cpu / answered
    finally:
        broker.close()
        for name in list_segments(data):
            unlink_segment(name)


def one_run(args: argparse.Namespace) -> float:
    with tempfile.TemporaryDirectory() as data, asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(serve(args, data))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--connections", type=int, default=25, help="requests read per loop turn")
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--pipeline", type=int, default=1, help="requests in each read (2 and more: parsed)")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    if args.profile:
        profiler = cProfile.Profile()
        profiler.runcall(one_run, args)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
        return
    runs = [one_run(args) * 1e6 for _ in range(args.repeat)]
    print(f"/pub, {args.connections} per loop turn, {args.pipeline} a read, {args.size} B: "
          f"{statistics.median(runs):.2f} µs CPU a request (runs: {', '.join(f'{r:.2f}' for r in runs)})")


if __name__ == "__main__":
    main()
