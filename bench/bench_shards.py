"""Many topics over all shards: the multi-shard node against one shard, in the same run.

For each ``--shards`` value (default ``1,2``) a fresh node is started with 32 topics x 1
channel (the channels exist before publishing), then:

  pub    publishers (``--workers`` processes, one connection each) send MPUB batches of
         ``--batch`` x ``--size`` B, cycling over all 32 topics, one MPUB outstanding each:
         a connection lives on one shard, so with 2 shards half of its batches cross shards
  sub    one consumer connection per topic (RDY 2500, FIN each message), spread over
         ``--workers`` processes, drains what the pub phase stored
  local  (2+ shards) MPUB only to topics owned by the publisher connection's shard
  cross  (2+ shards) MPUB only to topics owned by another shard: every batch goes through an
         inbound shared-memory ring; ``cross_us_per_msg`` = its server CPU per message minus
         the local one's — the cost of a cross-shard publish

Server CPU is the supervisor plus every shard process (psutil, children included). Each figure
is msgs/s, MB/s, server CPU µs per message (and, for sub, the load processes' own CPU µs per
message: when server plus client CPU fill both cores, the client is part of the limit);
``--repeat 3`` prints medians. ``--phases pub,sub`` skips the local/cross phases;
``--profile DIR`` records each shard process with py-spy during the sub phase (py-spy is in
the ``dev`` extra, a tool, not a dependency).

  .venv/bin/python bench/bench_shards.py --runfor 8 --repeat 3
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_tcp import _connect, _read_response, create_channels, fin_frames  # noqa: E402
from bench.common import Figures, Meter, add_load_args, report, running_node  # noqa: E402
from pynsqd.wire.commands import encode_mpub, encode_rdy, encode_sub  # noqa: E402

TOPICS = [f"many{i:02d}" for i in range(32)]


def publisher(addr: tuple[str, int], topics: list[str], size: int, batch: int, runfor: float,
              start: float, out: mp.Queue) -> None:  # type: ignore[type-arg]
    sock = _connect(addr)
    frames = [encode_mpub(t, [b"a" * size] * batch) for t in topics]
    while time.time() < start:
        time.sleep(0.001)
    end = time.monotonic() + runfor
    count = 0
    i = 0
    while time.monotonic() < end:
        sock.sendall(frames[i % len(frames)])
        _read_response(sock)
        count += batch
        i += 1
    out.put(count)
    sock.close()


def consumers(addr: tuple[str, int], topics: list[str], runfor: float, total: int, start: float,
              out: mp.Queue) -> None:  # type: ignore[type-arg]
    sel = selectors.DefaultSelector()
    bufs: dict[socket.socket, bytearray] = {}
    for t in topics:
        sock = _connect(addr)
        sock.sendall(encode_sub(t, "ch"))
        _read_response(sock)
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ)
        bufs[sock] = bytearray()
    while time.time() < start:
        time.sleep(0.001)
    for sock in bufs:
        sock.sendall(encode_rdy(2500))
    count = 0
    end = time.monotonic() + runfor
    first = last = 0.0
    # stop 2 s after the backlog ran dry (the rate, first to last message, excludes that)
    while time.monotonic() < end and count < total and (not last or time.time() - last < 2.0):
        events = sel.select(0.1)
        if events:
            last = time.time()
            first = first or last
        for key, _ in events:
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            try:
                data = sock.recv(1 << 20)
            except BlockingIOError:
                continue
            buf = bufs[sock]
            buf += data
            answer, messages = fin_frames(buf)
            if answer:
                count += messages
                sock.setblocking(True)
                sock.sendall(answer)
                sock.setblocking(False)
    cpu = os.times()
    out.put((count, first, last, cpu.user + cpu.system))
    for sock in bufs:
        sock.close()


def _phase(name: str, procs: list[mp.Process], q: mp.Queue, meter: Meter,  # type: ignore[type-arg]
           size: int) -> dict[str, float]:
    cpu0 = meter.cpu()
    t0 = time.monotonic()
    for p in procs:
        p.start()
    results = [q.get() for _ in procs]
    for p in procs:
        p.join()
    elapsed = time.monotonic() - t0 - 0.5
    if isinstance(results[0], tuple):  # consumers: from the first message to the last one
        elapsed = max(r[2] for r in results) - min(r[1] for r in results if r[1])
    count = sum(r[0] if isinstance(r, tuple) else r for r in results)
    cpu = meter.cpu() - cpu0
    figures = {"msgs": count, "msgs_s": count / elapsed, "mb_s": count * size / elapsed / 2**20,
               "cpu_us_per_msg": cpu / max(count, 1) * 1e6}
    if isinstance(results[0], tuple):
        figures["client_us_per_msg"] = sum(r[3] for r in results) / max(count, 1) * 1e6
    return figures


def _profile(meter: Meter, out_dir: str | None, seconds: float) -> list[subprocess.Popen[bytes]]:
    """py-spy recorders, one per shard process, for ``seconds`` (none without ``--profile``)."""
    if not out_dir:
        return []
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    os.makedirs(out_dir, exist_ok=True)
    return [subprocess.Popen([spy, "record", "-p", str(p.pid), "-d", str(max(1, int(seconds))), "-r", "200",
                              "-f", "raw", "-o", f"{out_dir}/shard-{p.pid}.txt"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for p in meter.proc.children(recursive=True)]


def _owners(data: str) -> dict[str, int]:
    table = {}
    for line in Path(data, "pynsqd.placement").read_text().splitlines():
        shard, _, topic = line.partition(" ")
        table[topic] = int(shard)
    return table


def one_node(args: argparse.Namespace, shards: int) -> Figures:
    ctx = mp.get_context("spawn")
    figures: Figures = {}
    with tempfile.TemporaryDirectory() as data, running_node(
            data, f"--shards={shards}", f"--mem-queue-size={args.mem_queue_size}", "--log-level=info",
            stop_timeout=60) as node:
        proc, tcp_port, _ = node
        addr = ("127.0.0.1", tcp_port)
        meter = Meter(proc.pid)
        create_channels(addr, TOPICS)  # the channels exist before publishing
        q = ctx.Queue()
        tag = f"s{shards}"
        start = time.time() + 0.5
        pubs = [ctx.Process(target=publisher, args=(addr, TOPICS[w:] + TOPICS[:w], args.size, args.batch,
                                                     args.runfor, start, q)) for w in range(args.workers)]
        figures[f"{tag}_pub"] = _phase("pub", pubs, q, meter, args.size)
        total = int(figures[f"{tag}_pub"]["msgs"])
        start = time.time() + 0.5
        per = len(TOPICS) // args.workers
        subs = [ctx.Process(target=consumers, args=(addr, TOPICS[w * per:(w + 1) * per], args.runfor * 3,
                                                     total, start, q)) for w in range(args.workers)]
        spies = _profile(meter, args.profile and f"{args.profile}/s{shards}", args.runfor)
        figures[f"{tag}_sub"] = _phase("sub", subs, q, meter, args.size)
        for spy in spies:
            spy.wait(60)
        if shards > 1 and "local" in args.phases:
            owners = _owners(data)
            home = [t for t in TOPICS if owners[t] == owners[TOPICS[0]]]
            away = [t for t in TOPICS if owners[t] != owners[TOPICS[0]]]
            for name, topics in (("local", home), ("cross", [TOPICS[0], *away])):
                start = time.time() + 0.5
                # the first MPUB decides the connection's shard: always TOPICS[0]'s owner
                pubs = [ctx.Process(target=publisher, args=(addr, topics, args.size, args.batch,
                                                             args.runfor / 2, start, q))
                        for _ in range(args.workers)]
                figures[f"{tag}_{name}"] = _phase(name, pubs, q, meter, args.size)
            local = figures[f"{tag}_local"]["cpu_us_per_msg"]
            cross = figures[f"{tag}_cross"]["cpu_us_per_msg"]
            n = len(away) + 1
            figures[f"{tag}_cross"]["cross_us_per_msg"] = (cross - local) * n / len(away)
    return figures


def one_run(args: argparse.Namespace) -> Figures:
    figures: Figures = {}
    for shards in args.shards:
        figures.update(one_node(args, shards))
    if len(args.shards) >= 2:
        one, two = (figures[f"s{args.shards[0]}_pub"], figures[f"s{args.shards[1]}_pub"])
        sub1, sub2 = (figures[f"s{args.shards[0]}_sub"], figures[f"s{args.shards[1]}_sub"])
        figures["ratio"] = {"pub_cpu": two["cpu_us_per_msg"] / one["cpu_us_per_msg"],
                            "sub_cpu": sub2["cpu_us_per_msg"] / sub1["cpu_us_per_msg"]}
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runfor", type=float, default=8.0, help="seconds of the pub phase")
    add_load_args(parser)
    parser.add_argument("--shards", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2])
    parser.add_argument("--phases", type=lambda s: s.split(","), default=["pub", "sub", "local", "cross"],
                        help="pub,sub always run; add local,cross for the cross-shard figures")
    parser.add_argument("--profile", default="", help="directory for py-spy profiles of the sub phase")
    args = parser.parse_args()
    report(one_run, args, f"32 topics x 1 channel, {args.size}-byte messages, MPUB batch {args.batch}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
