"""What disk syncs cost the other clients of a shard: round-trip latency of a memory-only
topic while another topic of the same shard writes to disk and syncs.

Starts its own node (one shard, ``--mem-queue-size=0``, ``--sync-every`` as given, default 1:
a sync per write) on ``--data-path`` (default: a temporary directory under the working
directory, so on the disk a node would use; removed afterwards). ``--writers`` processes publish MPUBs of
``--batch`` x ``--size`` bytes to the disk topic as fast as the node answers; meanwhile one
process sends ``PUB`` to an ``#ephemeral`` topic (never touches the disk), one per round
trip, and records each round trip. Printed: PUB round trips done, their p50, p99, p99.9 and
maximum in ms, and disk messages/s. ``--repeat 3`` prints the median of each figure.

  .venv/bin/python bench/bench_fsync.py --runfor 10 --repeat 3
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

from bench.common import Figures, gather_results, report, running_node  # noqa: E402
from pynsqd.wire.commands import encode_mpub, encode_pub  # noqa: E402

_HDR = struct.Struct(">ii")


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(b"  V2")
    return sock


def _read_ok(sock: socket.socket) -> None:
    head = b""
    while len(head) < 8:
        head += sock.recv(8 - len(head))
    size, frame_type = _HDR.unpack(head)
    data = b""
    while len(data) < size - 4:
        data += sock.recv(size - 4 - len(data))
    if frame_type != 0:
        raise RuntimeError(data.decode())


def _writer(port: int, batch: int, size: int, until: float, q: mp.Queue) -> None:  # type: ignore[type-arg]
    sock = _connect(port)
    frame = encode_mpub("disk", [b"x" * size] * batch)
    sent = 0
    while time.monotonic() < until:
        sock.sendall(frame)
        _read_ok(sock)
        sent += batch
    q.put(("writer", sent))


def _pinger(port: int, until: float, q: mp.Queue) -> None:  # type: ignore[type-arg]
    sock = _connect(port)
    frame = encode_pub("mem#ephemeral", b"ping")
    times = []
    while time.monotonic() < until:
        start = time.perf_counter()
        sock.sendall(frame)
        _read_ok(sock)
        times.append(time.perf_counter() - start)
    q.put(("pinger", times))


def _pct(times: list[float], p: float) -> float:
    return sorted(times)[min(len(times) - 1, int(len(times) * p))] * 1000


def one_run(args: argparse.Namespace) -> Figures:
    with (tempfile.TemporaryDirectory(prefix="bench-fsync-", dir=args.data_path or os.getcwd()) as data,
          running_node(data, "--shards=1", "--mem-queue-size=0", f"--sync-every={args.sync_every}") as (_, tcp, _h)):
        setup = _connect(tcp)
        setup.sendall(encode_pub("disk", b"setup"))
        _read_ok(setup)
        setup.close()
        ctx = mp.get_context("spawn")
        q: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
        until = time.monotonic() + 2 + args.runfor
        procs = [ctx.Process(target=_writer, args=(tcp, args.batch, args.size, until, q))
                 for _ in range(args.writers)]
        procs.append(ctx.Process(target=_pinger, args=(tcp, until, q)))
        results = gather_results(procs, q, lambda: None)
    times = next(r for kind, r in results if kind == "pinger")
    written = sum(r for kind, r in results if kind == "writer")
    return {"pub round trip on the same shard": {
        "count": len(times), "p50 ms": _pct(times, 0.5), "p99 ms": _pct(times, 0.99),
        "p99.9 ms": _pct(times, 0.999), "max ms": max(times) * 1000,
        "disk msgs/s": written / (args.runfor + 2)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runfor", type=float, default=10)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--writers", type=int, default=1)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--size", type=int, default=1000)
    parser.add_argument("--sync-every", type=int, default=1)
    parser.add_argument("--data-path", default="", help="where to make the node's data directory")
    report(one_run, parser.parse_args(), "fsync and the shard's loop")


if __name__ == "__main__":
    main()
