"""HTTP publish benchmark: ``/pub`` over keep-alive connections, and ``/mpub`` batches.

Starts its own node (``--shards``, default the node's: one per CPU) and drives it from
separate load processes, each holding some of the keep-alive connections on plain sockets
under one epoll and sending pre-encoded requests (one outstanding per connection, as a client
waiting for ``OK`` would). Prints requests/s, msgs/s, MB/s, latency p50/p99, the server's CPU
seconds (supervisor and shards) per million messages, and the load generator's own CPU
microseconds per request (if that is high, the generator is taking cores from the server).

``--loadgen wrk`` (the default when ``wrk`` is installed: ``apt-get install wrk``) drives the
same requests from wrk instead (``bench/wrk.py``), the standard C tool, as a cross-check of the
Python generator. wrk runs one thread unless ``--procs`` says otherwise: its connections under
one epoll cost less CPU per request than spread over two threads, and on a small host the
generator shares the server's cores, so the leaner one leaves more of them to the server
(docs/benchmarks.md). At the end the node's ``/stats`` must hold at least as many messages
as were answered ``OK``.

  .venv/bin/python bench/bench_http.py --runfor 10 --connections 50 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import select
import socket
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import wrk  # noqa: E402
from bench.common import Figures, Meter, report, running_node  # noqa: E402


def load(port: int, request: bytes, conns: int, runfor: float, start: float,
         sample_every: int = 16) -> tuple[int, list[float]]:
    """Drive ``conns`` keep-alive connections until ``runfor`` seconds after ``start``: each sends
    the pre-encoded ``request`` again as soon as its previous answer is complete (one
    outstanding per connection). Plain non-blocking sockets under one ``epoll``: the load
    generator should cost as little CPU per request as Python allows, so that the cores go to
    the server. Returns (answers, the latency of every ``sample_every``-th answer)."""
    socks = {}
    for _ in range(conns):
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setblocking(False)
        socks[s.fileno()] = s
    poll = select.epoll()
    for fd in socks:
        poll.register(fd, select.EPOLLIN)
    time.sleep(max(0.0, start - time.time()))
    end = time.monotonic() + runfor
    sent_at = dict.fromkeys(socks, 0.0)
    bufs = dict.fromkeys(socks, b"")
    count = 0
    latencies: list[float] = []
    for fd, s in socks.items():
        sent_at[fd] = time.perf_counter()
        s.send(request)
    live = len(socks)
    while live:
        for fd, _ in poll.poll(1.0):
            s = socks[fd]
            data = bufs[fd] + s.recv(65536)
            if not data:
                raise SystemExit("the server closed a connection")
            while True:
                head_end = data.find(b"\r\n\r\n")
                if head_end < 0:
                    break
                if not data.startswith(b"HTTP/1.1 200 "):
                    raise SystemExit(f"unexpected response: {data[:80]!r}")
                at = data.find(b"ength: ", 0, head_end) + 7  # Content-Length or content-length
                total = head_end + 4 + int(data[at:data.find(b"\r\n", at)])
                if len(data) < total:
                    break
                data = data[total:]
                count += 1
                if count % sample_every == 0:
                    latencies.append(time.perf_counter() - sent_at[fd])
                if time.monotonic() < end:
                    sent_at[fd] = time.perf_counter()
                    s.send(request)
                else:
                    poll.unregister(fd)
                    live -= 1
            bufs[fd] = data
    for s in socks.values():
        s.close()
    return count, latencies


def worker(port: int, request: bytes, conns: int, runfor: float, start: float, out: mp.Queue,  # type: ignore[type-arg]
           sample_every: int = 16) -> None:
    cpu0 = time.process_time()
    count, latencies = load(port, request, conns, runfor, start, sample_every)
    out.put((count, latencies, time.process_time() - cpu0))


def wrk_phase(url: str, body: bytes, per_request: int, args: argparse.Namespace, server: Meter,
              size: int) -> dict[str, float]:
    cpu0 = server.cpu()
    result = wrk.run(url, body, args.connections, args.procs, args.runfor)
    cpu = server.cpu() - cpu0
    msgs = result.requests * per_request
    return {"req_s": result.requests / result.seconds, "msgs_s": msgs / result.seconds,
            "mb_s": msgs * size / result.seconds / 2**20, "p50_ms": result.p50_ms, "p99_ms": result.p99_ms,
            "cpu_s_per_M": cpu / max(msgs, 1) * 1e6,
            "load_cpu_us_per_req": result.cpu_s / max(result.requests, 1) * 1e6}


def stored(http_port: int) -> int:
    """Messages the node's ``/stats`` counts for the bench topic."""
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/stats?format=json&topic=bench", timeout=30) as r:
        topics = json.load(r)["topics"] or []  # null: no such topic (yet)
    return sum(t["message_count"] for t in topics if t["topic_name"] == "bench")


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
            "p99_ms": lat[int(len(lat) * 0.99)] * 1e3, "cpu_s_per_M": cpu / max(msgs, 1) * 1e6,
            "load_cpu_us_per_req": sum(r[2] for r in results) / max(requests, 1) * 1e6}


def one_run(args: argparse.Namespace) -> Figures:
    body = b"a" * args.size
    pub = (b"POST /pub?topic=bench HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)) + body
    mbody = b"\n".join([body] * args.batch)
    mpub = (b"POST /mpub?topic=bench HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(mbody)) + mbody
    with tempfile.TemporaryDirectory() as data:
        flags = [f"--shards={args.shards}"] if args.shards else []
        small = argparse.Namespace(**{**vars(args), "connections": max(args.procs, 4)})
        with running_node(data, "--mem-queue-size=10000000", "--log-level=info", *flags) as (proc, _, port):
            server = Meter(proc.pid)  # the supervisor and every shard
            if args.loadgen == "wrk":
                out = {"pub": wrk_phase(f"http://127.0.0.1:{port}/pub?topic=bench", body, 1, args, server, args.size),
                       "mpub": wrk_phase(f"http://127.0.0.1:{port}/mpub?topic=bench", mbody, args.batch, small,
                                         server, args.size)}
            else:
                out = {"pub": phase(port, pub, 1, args, server, args.size),
                       "mpub": phase(port, mpub, args.batch, small, server, args.size)}
            out["rss"] = {"mb": server.rss() / 2**20}
            answered = round(sum(out[ph]["msgs_s"] for ph in ("pub", "mpub")) * args.runfor)
            if stored(port) < answered * 0.99:  # the figures' seconds are wrk's, not exactly runfor
                raise SystemExit(f"the node stored {stored(port)} messages, fewer than the {answered} answered OK")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runfor", type=float, default=10.0)
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--procs", type=int, default=0,
                        help="load processes, or wrk threads (default: 2 processes, 1 wrk thread)")
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--batch", type=int, default=200, help="messages per /mpub")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--shards", type=int, default=0, help="shard processes (default: the node's)")
    parser.add_argument("--loadgen", choices=("wrk", "python"), default="wrk" if wrk.available() else "python",
                        help="load generator (default: wrk when installed)")
    args = parser.parse_args()
    args.procs = args.procs or (1 if args.loadgen == "wrk" else 2)
    report(one_run, args, f"/pub with {args.connections} keep-alive connections, "
                          f"/mpub of {args.batch} x {args.size} B, load from {args.loadgen}")

if __name__ == "__main__":
    main()
