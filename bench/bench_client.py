"""Consumer throughput: pynsqd.client vs pynsq (PyPI), and nsq_to_file, in the same run.

Starts its own node (``--mem-queue-size=1000000``), preloads ``--count`` messages of
``--size`` bytes per contender (MPUB, each contender its own topic), then starts the
contender as a separate process and measures from its start until the node's /stats show
the channel drained (every message FINed). Contenders:

  client      pynsqd.client.Consumer, handler returns at once (auto FIN), max_in_flight 2500
  client-snappy / client-deflate / client-tls / client-tls-snappy
              the same over a negotiated feature (the node gets a trustme certificate)
  pynsq       nsq.Reader (tornado), handler returns True, max_in_flight 2500
  to_file     nsq_to_file --max-in-flight=2500 writing to a temp dir (fsync per batch)

Each prints msgs/s (wall time including process start-up, ~0.5 s, the same for all) and,
for the two libraries, the rate between their first and last message. ``--repeat 3`` prints
the median of each figure.

  .venv/bin/python bench/bench_client.py --count 200000 --repeat 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import Figures, count_size_parser, report, running_node, write_certs  # noqa: E402

BIN = Path(sys.executable).parent

_CLIENT_WORKER = """
import asyncio, sys, time, json, uvloop
from pynsqd.client import Consumer, TLSOptions
addr, topic, n, features = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
if "tls_options" in features:
    features["tls_options"] = TLSOptions(root_ca_file=features["tls_options"])
async def main():
    seen = 0; first = 0.0; done = asyncio.Event()
    def handler(m):
        nonlocal seen, first
        if seen == 0: first = time.perf_counter()
        seen += 1
        if seen == n: done.set()
    c = Consumer(topic, "bench", handler, nsqd_tcp_addresses=[addr], max_in_flight=2500, **features)
    await c.start(); await done.wait(); last = time.perf_counter(); await c.stop()
    print(json.dumps({"inner": n / (last - first)}))
uvloop.run(main())
"""

_PYNSQ_WORKER = """
import sys, time, json, nsq, tornado.ioloop
addr, topic, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
state = {"seen": 0, "first": 0.0}
loop = tornado.ioloop.IOLoop.current()
def handler(m):
    if state["seen"] == 0: state["first"] = time.perf_counter()
    state["seen"] += 1
    if state["seen"] == n:
        print(json.dumps({"inner": n / (time.perf_counter() - state["first"])}), flush=True)
        loop.call_later(0.3, loop.stop)
    return True
nsq.Reader(topic=topic, channel="bench", message_handler=handler, nsqd_tcp_addresses=[addr],
           max_in_flight=2500, max_tries=0)
nsq.run()
"""


def preload(tcp_port: int, topic: str, count: int, size: int) -> None:
    from pynsqd.client import Producer

    async def go() -> None:
        async with Producer(f"127.0.0.1:{tcp_port}") as p:
            body = b"x" * size
            for i in range(0, count, 500):
                await p.multi_publish(topic, [body] * min(500, count - i))
    asyncio.run(go())


def drained(http_port: int, topic: str, count: int) -> bool:
    data = httpx.get(f"http://127.0.0.1:{http_port}/stats", params={"format": "json", "topic": topic},
                     timeout=5).json()
    for t in data["topics"] or []:  # null: no such topic (yet)
        for c in t["channels"]:
            if c["channel_name"] in ("bench", "nsq_to_file"):
                return bool(c["message_count"] >= count and c["depth"] == 0 and c["in_flight_count"] == 0)
    return False


CONTENDERS = ["client", "client-snappy", "client-deflate", "client-tls", "client-tls-snappy", "pynsq", "to_file"]


def features(name: str, ca_file: str) -> dict[str, object]:
    """The Consumer keyword options of a ``client-*`` contender."""
    parts = name.split("-")[1:]
    out: dict[str, object] = {part: True for part in parts if part in ("snappy", "deflate")}
    if "tls" in parts:
        out.update(tls_v1=True, tls_options=ca_file)
    return out


def make_certs(where: str) -> tuple[str, list[str]]:
    """A CA file and the node's TLS flags."""
    paths = write_certs(where, "127.0.0.1")
    return paths["ca"], [f"--tls-cert={paths['cert']}", f"--tls-key={paths['key']}", "--https-address=127.0.0.1:0"]


def contender(name: str, tcp_port: int, http_port: int, topic: str, count: int, out_dir: str,
              ca_file: str = "") -> Figures:
    addr = f"127.0.0.1:{tcp_port}"
    if name.startswith("client"):
        cmd = [sys.executable, "-c", _CLIENT_WORKER, addr, topic, str(count), json.dumps(features(name, ca_file))]
    elif name == "pynsq":
        cmd = [sys.executable, "-c", _PYNSQ_WORKER, addr, topic, str(count)]
    else:
        cmd = [str(BIN / "nsq_to_file"), f"--topic={topic}", f"--nsqd-tcp-address={addr}",
               f"--output-dir={out_dir}", "--max-in-flight=2500", "--log-level=warn"]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT)
    while not drained(http_port, topic, count):
        time.sleep(0.05)
    wall = time.perf_counter() - start
    figures = {"msgs/s": count / wall}
    if name == "to_file":
        proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    if name != "to_file":
        figures["inner msgs/s"] = float(json.loads(out.decode().strip().splitlines()[-1])["inner"])
    else:
        total = sum(os.path.getsize(os.path.join(out_dir, f)) for f in os.listdir(out_dir))
        figures["MB written"] = total / 1e6
    return {name: figures}


def one_run(args: argparse.Namespace) -> Figures:
    with tempfile.TemporaryDirectory() as data, tempfile.TemporaryDirectory() as out:
        ca_file, tls_flags = make_certs(data) if any("tls" in n for n in args.contenders) else ("", [])
        with running_node(data, "--mem-queue-size=1000000", *tls_flags) as (_, tcp_port, http_port):
            figures: Figures = {}
            for i, name in enumerate(args.contenders):
                topic = f"bench_{name.replace('-', '_')}_{i}"
                preload(tcp_port, topic, args.count, args.size)
                figures.update(contender(name, tcp_port, http_port, topic, args.count, out, ca_file))
            return figures


def main() -> None:
    parser = count_size_parser(__doc__, 200_000, "messages per contender")
    parser.add_argument("--contenders", nargs="+", default=["client", "pynsq", "to_file"],
                        choices=CONTENDERS)
    args = parser.parse_args()
    report(one_run, args, f"{args.count} x {args.size} B messages, one nsqd, 2-core shared machine")


if __name__ == "__main__":
    main()
