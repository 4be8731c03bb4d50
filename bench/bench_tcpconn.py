"""In-process CPU per TCP command of one shard's connection protocol, without sockets.

    PYTHONPATH=$PWD python bench/bench_tcpconn.py [--phases pub,mpub1,mpub,fin]
        [--count 200000] [--connections 2] [--size 200] [--repeat 5] [--profile PHASE]

``--connections`` ``ClientV2`` connections (as a shard adopts them: magic read) over a
transport that keeps what is written, served by a real ``Broker`` (one topic with one
channel, shared-memory logs in a temp dir). Each loop turn, every connection receives one
command as a client that waits for each answer sends it (one read), then the loop turns once.

  pub    PUB of one message
  mpub1  MPUB of one message (what NSQ's bench_writer sends with --batch-size=1)
  mpub   MPUB of 200 messages (µs a message)
  fin    a subscribed connection with RDY 2500 receives what the channel holds and FINs
         every message in one read per loop turn, as NSQ's bench_reader does (µs a message)

What is measured is the Python a shard spends between the read and the write — parsing,
checks, storing, the answer, delivery — not the kernel's send, receive and wake-ups, which
a real socket adds (``bench_nsqd.py`` measures the node). Process CPU µs per command (per
message for mpub and fin), the median of ``--repeat`` runs; ``--profile PHASE`` prints the
cProfile of one run of that phase instead.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import statistics
import struct
import tempfile
import time
from collections.abc import Callable, Coroutine
from typing import Any

import uvloop

from pynsqd.node.config import NsqdOptions
from pynsqd.shard.broker import Broker
from pynsqd.shard.node import make_broker
from pynsqd.shard.protocol import ClientV2
from pynsqd.shm.segment import list_segments, unlink_segment
from pynsqd.wire.commands import encode_mpub, encode_pub
from pynsqd.wire.frames import FRAME_MESSAGE

_FRAME = struct.Struct(">ii")
TOPIC = "bench"
BATCH = 200


class KeepingTransport:
    """A connection's transport that keeps what is written, for the bench to read."""

    def __init__(self) -> None:
        self.writes = 0
        self.data = bytearray()

    def write(self, data: bytes | bytearray) -> None:
        self.writes += 1
        self.data += data

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def message_ids(self) -> list[bytes]:
        """The ids of the message frames written since the last call (the rest dropped)."""
        data, self.data = self.data, bytearray()
        ids, pos = [], 0
        while pos + 8 <= len(data):
            size, kind = _FRAME.unpack_from(data, pos)
            if kind == FRAME_MESSAGE:
                ids.append(bytes(data[pos + 18:pos + 34]))
            pos += 4 + size
        return ids


def connect(broker: Broker, opts: NsqdOptions) -> tuple[ClientV2, KeepingTransport]:
    client = ClientV2(broker, opts)
    transport = KeepingTransport()
    client.connection_made(transport)  # type: ignore[arg-type]
    client.data_received(b"  V2")
    return client, transport


async def publish(broker: Broker, opts: NsqdOptions, args: argparse.Namespace, request: bytes,
                  per_request: int) -> float:
    """CPU seconds per message for ``args.count`` messages sent as ``request``s."""
    conns = [connect(broker, opts) for _ in range(args.connections)]
    turns = max(1, args.count // per_request // args.connections)
    cpu0 = time.process_time()
    for _ in range(turns):
        for client, _ in conns:
            client.data_received(request)
        await asyncio.sleep(0)
    cpu = time.process_time() - cpu0
    answered = sum(t.writes for _, t in conns)
    if answered != turns * args.connections:
        raise SystemExit(f"{answered} answers to {turns * args.connections} requests")
    return cpu / (answered * per_request)


async def consume(broker: Broker, opts: NsqdOptions, args: argparse.Namespace) -> float:
    """CPU seconds per message delivered and FINed (what one MPUB connection stored first)."""
    body = b"a" * args.size
    stored = args.count // BATCH * BATCH
    for _ in range(stored // BATCH):
        broker.publish(TOPIC, [body] * BATCH)
    conns = [connect(broker, opts) for _ in range(args.connections)]
    for client, _ in conns:
        client.data_received(b"SUB %s ch\nRDY 2500\n" % TOPIC.encode())
    done = 0
    cpu0 = time.process_time()
    while done < stored:
        await asyncio.sleep(0)
        for client, transport in conns:
            ids = transport.message_ids()
            if ids:
                client.data_received(b"".join(b"FIN %s\n" % i for i in ids))
                done += len(ids)
    cpu = time.process_time() - cpu0
    return cpu / done


PHASES: dict[str, Callable[[Broker, NsqdOptions, argparse.Namespace], Coroutine[Any, Any, float]]] = {
    "pub": lambda b, o, a: publish(b, o, a, encode_pub(TOPIC, b"a" * a.size), 1),
    "mpub1": lambda b, o, a: publish(b, o, a, encode_mpub(TOPIC, [b"a" * a.size]), 1),
    "mpub": lambda b, o, a: publish(b, o, a, encode_mpub(TOPIC, [b"a" * a.size] * BATCH), BATCH),
    "fin": consume,
}


async def serve(phase: str, args: argparse.Namespace, data: str) -> float:
    opts = NsqdOptions(data_path=data, mem_queue_size=args.count + BATCH)
    broker = make_broker(opts)
    broker.start(asyncio.get_running_loop())
    try:
        broker.get_channel(broker.get_topic(TOPIC), "ch")
        return await PHASES[phase](broker, opts, args)
    finally:
        broker.close()
        for name in list_segments(data):
            unlink_segment(name)


def one_run(phase: str, args: argparse.Namespace) -> float:
    with tempfile.TemporaryDirectory() as data, asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(serve(phase, args, data))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--phases", type=lambda s: s.split(","), default=list(PHASES))
    parser.add_argument("--count", type=int, default=200_000, help="messages a run")
    parser.add_argument("--connections", type=int, default=2, help="commands read per loop turn")
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--profile", choices=list(PHASES))
    args = parser.parse_args()
    if args.profile:
        profiler = cProfile.Profile()
        profiler.runcall(one_run, args.profile, args)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
        return
    for phase in args.phases:
        runs = [one_run(phase, args) * 1e6 for _ in range(args.repeat)]
        unit = "a message" if phase in ("mpub", "fin") else "a command"
        print(f"{phase:6s} {statistics.median(runs):6.3f} µs CPU {unit} "
              f"(runs: {', '.join(f'{r:.3f}' for r in runs)})", flush=True)


if __name__ == "__main__":
    main()
