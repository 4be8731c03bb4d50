"""Consume throughput with TLS, snappy, deflate (and TLS + each) against plain, in one run.

Starts its own node with a certificate made for the run (trustme), preloads one topic per
mode with the same messages (MPUB, plain), then drains each topic with one consumer process
(SUB + RDY 2500, one FIN per message, FINs of one read sent together) negotiating that
mode. Bodies are JSON-like text, so compression has something to do. Each mode prints
msgs/s, MB/s of message bodies, MB/s on the wire (after compression) and server CPU
seconds per million messages. ``--repeat 3`` prints the median of each figure.

  .venv/bin/python bench/bench_features.py --count 200000 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import Figures, count_size_parser, negotiate, read_frame, report, running_node, write_certs  # noqa: E402
from pynsqd.wire.commands import encode_fin, encode_mpub, encode_rdy, encode_sub  # noqa: E402
from pynsqd.wire.errors import ProtocolError  # noqa: E402
from pynsqd.wire.frames import FRAME_MESSAGE, FrameParser  # noqa: E402

MODES = {"plain": {}, "tls": {"tls_v1": True}, "snappy": {"snappy": True}, "deflate": {"deflate": True},
         "tls+snappy": {"tls_v1": True, "snappy": True}, "tls+deflate": {"tls_v1": True, "deflate": True}}


def body(i: int, size: int) -> bytes:
    text = json.dumps({"id": i, "user": f"user-{i % 977}", "event": "page_view", "path": "/products/item",
                       "ua": "Mozilla/5.0 (X11; Linux x86_64)", "pad": ""})
    return (text * (size // len(text) + 1))[:size].encode()


def preload(port: int, topic: str, count: int, size: int) -> None:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"  V2" + encode_sub(topic, "ch"))
    read_frame(sock)
    sock.close()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"  V2")
    for start in range(0, count, 200):
        sock.sendall(encode_mpub(topic, [body(i, size) for i in range(start, min(start + 200, count))]))
        read_frame(sock)
    sock.close()


def consumer(port: int, topic: str, mode: str, count: int, ca_file: str, q: Any) -> None:
    sock, codec = negotiate(("127.0.0.1", port), MODES[mode], ca_file)
    parser = FrameParser()
    out = encode_sub(topic, "ch") + encode_rdy(2500)
    sock.sendall(codec.encode(out) if codec else out)
    got = wire = 0
    started = time.perf_counter()
    while got < count:
        raw = sock.recv(1 << 20)
        if not raw:
            break
        wire += len(raw)
        data = b"".join(codec.decode(raw)) if codec else raw
        fins = []
        for item in parser.feed(data):
            if isinstance(item, ProtocolError):
                raise item
            frame_type, frame = item
            if frame_type == FRAME_MESSAGE:
                fins.append(encode_fin(bytes(frame[10:26])))
        got += len(fins)
        if fins:
            out = b"".join(fins)
            sock.sendall(codec.encode(out) if codec else out)
    q.put((got, wire, time.perf_counter() - started))
    sock.close()


def one_run(args: argparse.Namespace) -> Figures:
    ctx = mp.get_context("spawn")
    figures: Figures = {}
    with tempfile.TemporaryDirectory() as data:
        paths = write_certs(data, "localhost", "127.0.0.1")
        with running_node(data, f"--tls-cert={paths['cert']}", f"--tls-key={paths['key']}", "--https-address=",
                          "--mem-queue-size=10000000", "--log-level=info") as (proc, tcp_port, _):
            meter = psutil.Process(proc.pid)
            for mode in MODES:
                preload(tcp_port, f"f-{mode.replace('+', '-')}", args.count, args.size)
            for mode in MODES:
                q = ctx.Queue()
                cpu0 = sum(meter.cpu_times()[:2])
                p = ctx.Process(target=consumer, args=(tcp_port, f"f-{mode.replace('+', '-')}", mode,
                                                       args.count, paths["ca"], q))
                p.start()
                got, wire, secs = q.get(timeout=600)
                p.join()
                cpu = sum(meter.cpu_times()[:2]) - cpu0
                figures[mode] = {"msgs_per_s": got / secs, "body_MB_s": got * args.size / secs / 1e6,
                                 "wire_MB_s": wire / secs / 1e6, "cpu_s_per_M": cpu / got * 1e6}
    return figures


def main() -> None:
    parser = count_size_parser(__doc__, 200_000, "messages consumed per mode")
    args = parser.parse_args()
    report(one_run, args, f"{args.count} x {args.size}-byte messages per mode, one consumer")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
