"""TCP benchmark in the shape of NSQ's bench.sh: publish for a while, then consume.

Starts its own node (``--mem-queue-size=1000000`` and, unless ``--shards`` says otherwise, one
shard per CPU) and runs the load from separate processes with pre-encoded frames, so the
figures measure the server (``--phases`` picks which of these run):

  pub     MPUB batches (default 200 x 200 B), one outstanding MPUB per connection
  pub1    PUB one message per round trip
  sub     SUB + RDY 2500, FIN per message (drains what the publish phases left)
  latency publisher and consumer at once at a fixed rate: publish->deliver percentiles

Each phase prints msgs/s, MB/s, server CPU seconds per million messages and the server's
RSS; the run ends with idle and peak RSS. ``--repeat 3`` runs everything three times and
prints the median of each figure.

  .venv/bin/python bench/bench_tcp.py --runfor 10 --repeat 3
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import struct
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import Figures, Meter, add_load_args, report, running_node  # noqa: E402
from pynsqd.wire.commands import encode_identify, encode_mpub, encode_pub, encode_rdy, encode_sub  # noqa: E402

_HDR = struct.Struct(">ii")


def _connect(addr: tuple[str, int]) -> socket.socket:
    sock = socket.create_connection(addr)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(b"  V2" + encode_identify(b'{"client_id":"bench","user_agent":"pynsqd-bench"}'))
    _read_response(sock)
    return sock


def _read_response(sock: socket.socket) -> bytes:
    head = _recv_exact(sock, 8)
    size, frame_type = _HDR.unpack(head)
    data = _recv_exact(sock, size - 4)
    if frame_type == 1:
        raise RuntimeError(data.decode())
    return data


def create_channels(addr: tuple[str, int], topics: list[str], channel: str = "ch") -> None:
    """Make ``topic``/``channel`` exist before publishing (a SUB, then close), as bench.sh does."""
    for topic in topics:
        sock = _connect(addr)
        sock.sendall(encode_sub(topic, channel))
        _read_response(sock)
        sock.close()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return bytes(buf)


def publisher(addr: tuple[str, int], topic: str, size: int, batch: int, runfor: float,
              start: float, out: mp.Queue) -> None:  # type: ignore[type-arg]
    sock = _connect(addr)
    body = b"a" * size
    frame = encode_mpub(topic, [body] * batch) if batch > 1 else encode_pub(topic, body)
    while time.time() < start:
        time.sleep(0.001)
    end = time.monotonic() + runfor
    count = 0
    while time.monotonic() < end:
        sock.sendall(frame)
        _read_response(sock)
        count += batch
    out.put(count)
    sock.close()


def consumer(addr: tuple[str, int], topic: str, channel: str, rdy: int, runfor: float, total: int,
             start: float, out: mp.Queue) -> None:  # type: ignore[type-arg]
    sock = _connect(addr)
    sock.sendall(encode_sub(topic, channel))
    _read_response(sock)
    while time.time() < start:
        time.sleep(0.001)
    sock.sendall(encode_rdy(rdy))
    buf = bytearray()
    count = 0
    latencies: list[int] = []
    end = time.monotonic() + runfor
    sock.settimeout(0.5)
    while time.monotonic() < end and count < total:
        try:
            data = sock.recv(1 << 20)
        except TimeoutError:
            continue
        if not data:
            break
        buf += data
        now = time.time_ns()
        fins, stamps = answer_frames(buf)
        latencies.extend(now - ts for ts in stamps[::64])
        if fins:
            count += len(fins)
            sock.sendall(b"".join(fins))
    out.put((count, latencies))
    sock.close()


def answer_frames(buf: bytearray) -> tuple[list[bytes], list[int]]:
    """Consume the complete frames in ``buf``: a FIN per message, a NOP per heartbeat;
    also returns the messages' timestamps."""
    unpack = _HDR.unpack_from
    pos = 0
    out: list[bytes] = []
    stamps: list[int] = []
    n = len(buf)
    while n - pos >= 8:
        size, frame_type = unpack(buf, pos)
        if n - pos - 4 < size:
            break
        if frame_type == 2:
            out.append(b"FIN " + bytes(buf[pos + 18:pos + 34]) + b"\n")
            stamps.append(int.from_bytes(buf[pos + 8:pos + 16], "big"))
        elif buf[pos + 8:pos + 4 + size] == b"_heartbeat_":
            out.append(b"NOP\n")
        pos += 4 + size
    del buf[:pos]
    return out, stamps


def fin_frames(buf: bytearray) -> tuple[bytes, int]:
    """``answer_frames`` without timestamps, as cheap as Python allows: consume the complete
    frames in ``buf``; the answer (a FIN per message, a NOP per heartbeat) and the number of
    messages."""
    unpack = _HDR.unpack_from
    pos = 0
    ids: list[bytearray] = []
    nops = 0
    n = len(buf)
    while n - pos >= 8:
        size, frame_type = unpack(buf, pos)
        if n - pos - 4 < size:
            break
        if frame_type == 2:
            ids.append(buf[pos + 18:pos + 34])
        elif buf[pos + 8:pos + 4 + size] == b"_heartbeat_":
            nops += 1
        pos += 4 + size
    del buf[:pos]
    answer = b"FIN " + b"\nFIN ".join(ids) + b"\n" if ids else b""
    return answer + b"NOP\n" * nops, len(ids)


def rate_publisher(addr: tuple[str, int], topic: str, size: int, rate: int, runfor: float, start: float,
                   out: mp.Queue) -> None:  # type: ignore[type-arg]
    sock = _connect(addr)
    batch = 20
    frame = encode_mpub(topic, [b"a" * size] * batch)
    while time.time() < start:
        time.sleep(0.001)
    began = time.monotonic()
    count = 0
    while time.monotonic() - began < runfor:
        due = began + count / rate
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        sock.sendall(frame)
        _read_response(sock)
        count += batch
    out.put(count)
    sock.close()


def run_phase(name: str, procs: list[mp.Process], q: mp.Queue, meter: Meter,  # type: ignore[type-arg]
              size: int) -> dict[str, float]:
    cpu0 = meter.cpu()
    t0 = time.monotonic()
    for p in procs:
        p.start()
    results = []
    while len(results) < len(procs):
        try:
            results.append(q.get(timeout=0.2))
        except Exception:
            meter.rss()
    for p in procs:
        p.join()
    elapsed = time.monotonic() - t0 - 0.5  # workers start together 0.5 s after launch
    cpu = meter.cpu() - cpu0
    lat: list[int] = []
    count = 0
    for r in results:
        if isinstance(r, tuple):
            count += r[0]
            lat.extend(r[1])
        else:
            count += r
    fig = {"msgs": count, "msgs_s": count / elapsed, "mb_s": count * size / elapsed / 2**20,
           "cpu_s_per_M": cpu / max(count, 1) * 1e6, "rss_mb": meter.rss() / 2**20}
    if lat and name == "latency":  # in the drain phase "latency" is only time spent queued
        lat.sort()
        for p in (50, 99, 99.9):
            fig[f"p{p}_ms"] = lat[min(len(lat) - 1, int(len(lat) * p / 100))] / 1e6
    return fig


def one_run(args: argparse.Namespace) -> Figures:
    ctx = mp.get_context("spawn")
    figures: dict[str, dict[str, float]] = {}
    flags = [f"--mem-queue-bytes={args.mem_queue_bytes}"] if args.mem_queue_bytes else []
    if args.shards:
        flags.append(f"--shards={args.shards}")
    with tempfile.TemporaryDirectory() as data, running_node(
            data, f"--mem-queue-size={args.mem_queue_size}", "--log-level=info", *flags) as node:
        proc, tcp_port, _ = node
        addr = ("127.0.0.1", tcp_port)
        meter = Meter(proc.pid)
        time.sleep(0.5)
        figures["idle"] = {"rss_mb": meter.rss() / 2**20}
        create_channels(addr, ["bench"])  # one topic, one channel, as bench.sh means it
        q = ctx.Queue()
        total = 0
        if "pub" in args.phases:
            start = time.time() + 0.5
            pubs = [ctx.Process(target=publisher, args=(addr, "bench", args.size, args.batch, args.runfor,
                                                         start, q)) for _ in range(args.workers)]
            figures["pub"] = run_phase("pub", pubs, q, meter, args.size)
            total += int(figures["pub"]["msgs"])
        if "pub1" in args.phases:
            start = time.time() + 0.5
            pubs = [ctx.Process(target=publisher, args=(addr, "bench", args.size, 1, args.runfor, start, q))
                    for _ in range(2)]
            figures["pub1"] = run_phase("pub1", pubs, q, meter, args.size)
            total += int(figures["pub1"]["msgs"])
        if "sub" in args.phases and total:
            start = time.time() + 0.5
            subs = [ctx.Process(target=consumer, args=(addr, "bench", "ch", 2500, args.runfor,
                                                        total // args.workers + 1, start, q))
                    for _ in range(args.workers)]
            figures["sub"] = run_phase("sub", subs, q, meter, args.size)
        if "latency" in args.phases:
            start = time.time() + 0.5
            procs = [ctx.Process(target=rate_publisher, args=(addr, "lat", args.size, args.rate, 5, start, q)),
                     ctx.Process(target=consumer, args=(addr, "lat", "ch", 2500, 6, 1 << 60, start, q))]
            lat = run_phase("latency", procs, q, meter, args.size)
            figures["latency"] = {k: v for k, v in lat.items() if k.startswith("p")}
        figures["peak"] = {"rss_mb": meter.peak_rss / 2**20}
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runfor", type=float, default=10.0, help="seconds per publish/consume phase")
    add_load_args(parser)
    parser.add_argument("--mem-queue-bytes", type=int, default=0,
                        help="shared memory per queue (pynsqd flag; 0: the node's default, 32 MiB)")
    parser.add_argument("--rate", type=int, default=20_000, help="msgs/s during the latency phase")
    parser.add_argument("--shards", type=int, default=0, help="shard processes (0: the node's default, one per CPU)")
    parser.add_argument("--phases", type=lambda s: s.split(","), default=["pub", "pub1", "sub", "latency"],
                        help="comma-separated phases to run (sub drains what the publish phases stored)")
    args = parser.parse_args()
    report(one_run, args, f"{args.size}-byte messages, MPUB batch {args.batch}")

if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
