"""HTTP publish benchmark: ``/pub`` over keep-alive connections, and ``/mpub`` batches.

Starts its own node (``--shards``, default the node's: one per CPU) and drives it from
separate load processes, each holding some of the keep-alive connections and sending
pre-encoded requests (one outstanding per connection, as a client waiting for ``OK``
would). Prints requests/s, msgs/s, MB/s, latency p50/p99 and the server's CPU seconds
(supervisor and shards) per million messages.

  .venv/bin/python bench/bench_http.py --runfor 10 --connections 50 --repeat 3
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path

import uvloop

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_tcp import Meter  # noqa: E402
from bench.common import Figures, report, start_node  # noqa: E402


class Conn(asyncio.Protocol):
    """One keep-alive connection sending the same request again after each response."""

    def __init__(self, request: bytes, end: float, done: asyncio.Future[None]) -> None:
        self.request = request
        self.end = end
        self.done = done
        self.buf = b""
        self.count = 0
        self.latencies: list[float] = []
        self.sent_at = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self._send()

    def _send(self) -> None:
        self.sent_at = time.perf_counter()
        self.transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buf[:head_end]
            if not head.startswith(b"HTTP/1.1 200"):
                raise SystemExit(f"unexpected response: {head[:80]!r}")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            if len(self.buf) < head_end + 4 + length:
                return
            self.buf = self.buf[head_end + 4 + length:]
            now = time.perf_counter()
            self.count += 1
            if self.count % 16 == 0:
                self.latencies.append(now - self.sent_at)
            if time.monotonic() < self.end:
                self._send()
            else:
                self.transport.close()
                if not self.done.done():
                    self.done.set_result(None)


async def load(port: int, request: bytes, conns: int, runfor: float, start: float) -> tuple[int, list[float]]:
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, start - time.time()))
    end = time.monotonic() + runfor
    protocols = []
    waits = []
    for _ in range(conns):
        done: asyncio.Future[None] = loop.create_future()
        _, proto = await loop.create_connection(lambda d=done: Conn(request, end, d), "127.0.0.1", port)
        protocols.append(proto)
        waits.append(done)
    await asyncio.gather(*waits)
    return sum(p.count for p in protocols), [x for p in protocols for x in p.latencies]


def worker(port: int, request: bytes, conns: int, runfor: float, start: float, out: mp.Queue) -> None:  # type: ignore[type-arg]
    out.put(uvloop.run(load(port, request, conns, runfor, start)))


def phase(port: int, request: bytes, per_request: int, args: argparse.Namespace, server: Meter,
          size: int) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = args.procs
    start = time.time() + 1.0
    workers = [ctx.Process(target=worker, args=(port, request, args.connections // procs, args.runfor, start, q))
               for _ in range(procs)]
    cpu0 = server.cpu()
    for w in workers:
        w.start()
    results = [q.get() for _ in workers]
    for w in workers:
        w.join()
    cpu = server.cpu() - cpu0
    requests = sum(r[0] for r in results)
    lat = sorted(x for r in results for x in r[1])
    msgs = requests * per_request
    return {"req_s": requests / args.runfor, "msgs_s": msgs / args.runfor,
            "mb_s": msgs * size / args.runfor / 2**20, "p50_ms": lat[len(lat) // 2] * 1e3,
            "p99_ms": lat[int(len(lat) * 0.99)] * 1e3, "cpu_s_per_M": cpu / max(msgs, 1) * 1e6}


def one_run(args: argparse.Namespace) -> Figures:
    body = b"a" * args.size
    pub = (b"POST /pub?topic=bench HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)) + body
    mbody = b"\n".join([body] * args.batch)
    mpub = (b"POST /mpub?topic=bench HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(mbody)) + mbody
    with tempfile.TemporaryDirectory() as data:
        flags = [f"--shards={args.shards}"] if args.shards else []
        proc, _, port = start_node(data, "--mem-queue-size=10000000", "--log-level=info", *flags)
        server = Meter(proc.pid)  # the supervisor and every shard
        try:
            out = {"pub": phase(port, pub, 1, args, server, args.size)}
            small = argparse.Namespace(**{**vars(args), "connections": max(args.procs, 4)})
            out["mpub"] = phase(port, mpub, args.batch, small, server, args.size)
            out["rss"] = {"mb": server.rss() / 2**20}
        finally:
            proc.terminate()
            proc.wait(30)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runfor", type=float, default=10.0)
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--procs", type=int, default=2, help="load processes")
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--batch", type=int, default=200, help="messages per /mpub")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--shards", type=int, default=0, help="shard processes (default: the node's)")
    args = parser.parse_args()
    report(one_run, args, f"/pub with {args.connections} keep-alive connections, "
                          f"/mpub of {args.batch} x {args.size} B")

if __name__ == "__main__":
    main()
