"""In-process CPU per message of the shared-memory hot path, without sockets or event loop.

    PYTHONPATH=$PWD python bench/bench_publish.py [--messages 200000] [--batch 100] [--size 200]
        [--repeat 5] [--shards 1] [--profile publish|deliver]

One shard's ``Broker`` with one topic and one channel on shared-memory logs (a data
directory in a temp dir): ``publish`` is ``Broker.publish`` of MPUB-sized batches (the
message records, the topic log, the pump to the channel's log); ``pub`` the same with one
message per call (PUB, HTTP /pub); ``deliver+fin`` is the channel queue's ``deliver``
(READY → IN_FLIGHT, NSQ frames into an output buffer, ids) then ``finish_many`` of the
positions (FIN, with the release of the log's front); ``mpub parse`` is the TCP command
parser splitting MPUB bodies. With ``--shards N`` (N > 1) the broker is shard 0 of N and
owns the topic, with its real inbound rings from the other shards, empty: each publish
first looks at them (``Inbound.catch_up``), as an owner's own publishes do; and ``cross`` is
the owner storing what shard 1 published: records of one message each (a cross-shard PUB or
``/pub``), for two topics in turn so that no two are stored together, drained from its ring
(the drain alone is timed). Each figure is
process CPU time (``time.process_time``) per message, in µs, the median of ``--repeat`` runs.
``PYNSQD_PURE=1`` in the environment runs the pure-Python path where compiled kernels are
built (``pynsqd.shm.kernels.COMPILED`` says which ran). ``--profile`` prints the cProfile of
one run of that phase instead.
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
from pynsqd.node.crossrecord import encode_batch
from pynsqd.node.rings import create_rings, release_rings, ring_name
from pynsqd.shard.broker import Broker
from pynsqd.shard.inbound import Inbound
from pynsqd.shard.node import make_broker
from pynsqd.shm.ring import ByteRing
from pynsqd.shm.segment import Segment, list_segments, unlink_segment
from pynsqd.wire.commands import CommandParser

try:
    from pynsqd.shm import kernels
    _KIND = "compiled" if kernels.COMPILED else "pure"
except ImportError:  # a tree without the kernels module
    _KIND = "baseline"


class _Owner:
    """The router of shard 0 of a multi-shard node that owns every topic (``--shards``)."""

    def __init__(self) -> None:
        self.inbound: Inbound | None = None  # built on the broker, after it

    def owner(self, topic: str) -> int:
        return 0

    def forward(self, topic: str, records: list[bytes], body_bytes: int, delay_ns: int) -> None:
        raise AssertionError("shard 0 owns every topic here")

    def catch_up(self) -> None:
        if self.inbound is not None:
            self.inbound.catch_up()

    def relay(self, client: object, owner: int, unread: bytes) -> None:
        raise AssertionError("no connections here")


def _broker(data: str, shards: int, wake: int) -> Broker:
    opts = NsqdOptions(data_path=data, mem_queue_size=1_000_000)
    if shards == 1:
        return make_broker(opts)
    owner = _Owner()
    broker = make_broker(opts, shards=shards, router=owner)
    owner.inbound = Inbound(data, 0, shards, wake, broker)
    return broker


def _phases(args: argparse.Namespace, broker: Broker) -> dict[str, Callable[[], int]]:
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


def _cross(args: argparse.Namespace, data: str, broker: Broker) -> float:
    """CPU µs a message of the owner's drain of one-message records (see the module doc)."""
    router = broker.router
    assert isinstance(router, _Owner)
    for name in ("cross0", "cross1"):
        broker.get_channel(broker.get_topic(name), "c")
    segment = Segment.open(ring_name(data, 1, 0), 0, create=False)
    ring = ByteRing(segment.buf, init=False)
    message = broker.ids.next_records(b"\0" * 10, [os.urandom(args.size)])[0]
    sent = time.monotonic_ns() - 10**9
    done = 0
    spent = 0.0
    try:
        for _ in range(args.messages // 4 // 1000):
            for k in range(1000):
                sent += 1
                ring.put(encode_batch(f"cross{k & 1}", [message], args.size, 0, sent_ns=sent))
            start = time.process_time()
            done += router.inbound.drain(None)
            spent += time.process_time() - start
    finally:
        ring.close()
        segment.close()
    return spent / max(done, 1) * 1e6


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
    parser.add_argument("--shards", type=int, default=1, help="the broker is shard 0 of this many")
    parser.add_argument("--profile", choices=["publish", "pub", "deliver"], default=None)
    args = parser.parse_args()
    figures: dict[str, list[float]] = {}
    wake = os.eventfd(0)
    with tempfile.TemporaryDirectory(prefix="bench-publish-") as data:
        rings = create_rings(data, args.shards)
        try:
            for _ in range(1 if args.profile else args.repeat):
                broker = _broker(data, args.shards, wake)
                phases = _phases(args, broker)
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
                if args.shards > 1:
                    figures.setdefault("cross", []).append(_cross(args, data, broker))
        finally:
            release_rings(rings)
            for name in list_segments(data):
                unlink_segment(name)
            os.close(wake)
    print(f"kernels: {_KIND}; {args.messages} messages of {args.size} bytes, batch {args.batch}, "
          f"shard 0 of {args.shards}, median of {args.repeat} (CPU µs per message)")
    for name, values in figures.items():
        print(f"  {name:<12} {statistics.median(values):7.3f}")


if __name__ == "__main__":
    main()
