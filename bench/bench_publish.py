"""In-process CPU per message of the shared-memory hot path, without sockets or event loop.

    PYTHONPATH=$PWD python bench/bench_publish.py [--messages 200000] [--batch 100] [--size 200]
        [--repeat 5] [--profile publish|deliver]

One shard's ``Broker`` with one topic and one channel on shared-memory logs (a data
directory in a temp dir): ``publish`` is ``Broker.publish`` of MPUB-sized batches (the
message records, the topic log, the pump to the channel's log); ``pub`` the same with one
message per call (PUB, HTTP /pub); ``deliver+fin`` is the channel queue's ``deliver``
(READY → IN_FLIGHT, NSQ frames into an output buffer, ids) then ``finish_many`` of the
positions (FIN, with the release of the log's front); ``mpub parse`` is the TCP command
parser splitting MPUB bodies. Each figure is process CPU time (``time.process_time``) per
message, in µs, the median of ``--repeat`` runs. ``PYNSQD_PURE=1`` in the environment runs the
pure-Python path where compiled kernels are built (``pynsqd.shm.kernels.COMPILED`` says which
ran). ``--profile`` prints the cProfile of one run of that phase instead.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import struct
import tempfile
import time
from collections.abc import Callable

from pynsqd.node.config import NsqdOptions
from pynsqd.shard.broker import Broker
from pynsqd.shard.node import make_broker
from pynsqd.shm.segment import list_segments, unlink_segment
from pynsqd.wire.commands import CommandParser

try:
    from pynsqd.shm import kernels
    _KIND = "compiled" if kernels.COMPILED else "pure"
except ImportError:  # a tree without the kernels module
    _KIND = "baseline"


def _broker(data: str) -> Broker:
    opts = NsqdOptions(data_path=data, mem_queue_size=1_000_000)
    return make_broker(opts)


def _phases(args: argparse.Namespace, data: str) -> dict[str, Callable[[], int]]:
    broker = _broker(data)
    topic = broker.get_topic("bench")
    channel = broker.get_channel(topic, "c")
    queue = channel.queue
    bodies = [os.urandom(args.size) for _ in range(args.batch)]
    rounds = args.messages // args.batch

    def publish() -> int:
        for _ in range(rounds):
            broker.publish("bench", bodies)
        return rounds * args.batch

    def pub() -> int:
        one = bodies[:1]
        for _ in range(rounds * args.batch // 4):
            broker.publish("bench", one)
        return rounds * args.batch // 4

    def deliver_fin() -> int:
        done = 0
        while True:
            out = bytearray()
            ids: list[bytes] = []
            positions = queue.deliver(args.batch, out, ids)
            if not positions:
                return done
            queue.finish_many(positions)
            done += len(positions)

    body = struct.pack(">I", len(bodies)) + b"".join(struct.pack(">I", len(b)) + b for b in bodies)
    command = b"MPUB bench\n" + struct.pack(">I", len(body)) + body

    def mpub_parse() -> int:
        parser = CommandParser()
        for _ in range(rounds):
            parser.feed(command)
        return rounds * args.batch

    return {"publish": publish, "pub": pub, "deliver+fin": deliver_fin, "mpub parse": mpub_parse}


def _cpu(run: Callable[[], int]) -> float:
    start = time.process_time()
    count = run()
    return (time.process_time() - start) / max(count, 1) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--profile", choices=["publish", "pub", "deliver"], default=None)
    args = parser.parse_args()
    figures: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-publish-") as data:
        try:
            for _ in range(1 if args.profile else args.repeat):
                phases = _phases(args, data)
                if args.profile:
                    phases["publish"]()
                    if args.profile == "pub":
                        phases["deliver+fin"]()
                    name = {"publish": "publish", "pub": "pub", "deliver": "deliver+fin"}[args.profile]
                    profile = cProfile.Profile()
                    profile.runcall(phases[name])
                    pstats.Stats(profile).sort_stats("tottime").print_stats(18)
                    return
                for name in ("publish", "deliver+fin", "pub", "drain", "mpub parse"):
                    if name == "drain":  # what pub stored, so every run starts from an empty log
                        phases["deliver+fin"]()
                    else:
                        figures.setdefault(name, []).append(_cpu(phases[name]))
        finally:
            for name in list_segments(data):
                unlink_segment(name)
    print(f"kernels: {_KIND}; {args.messages} messages of {args.size} bytes, batch {args.batch}, "
          f"median of {args.repeat} (CPU µs per message)")
    for name, values in figures.items():
        print(f"  {name:<12} {statistics.median(values):7.3f}")


if __name__ == "__main__":
    main()
