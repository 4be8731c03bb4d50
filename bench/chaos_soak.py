"""Chaos soak: mixed load on a node while faults are injected at seeded moments; every
acknowledged publish and every delivery is recorded and judged at the end.

Load: TCP producers (PUB, MPUB, DPUB) and HTTP producers (/pub, /mpub, /pub?defer=) over
``--topics`` topics with two or three channels each; consumers FIN, REQ (at once and with a
delay), hold with TOUCH, and on some channels pause so a backlog spills to disk.

Faults (``--faults`` of them, every kind once in each run of seven, in a seeded order): kill -9
of one shard; kill -9 of the whole tree and a restart on the same data path; SIGSTOP of a
shard past the heartbeat deadline, then SIGCONT; a full disk (the data path is a tmpfs of
``--tmpfs-size``, filled, held, freed); descriptor exhaustion (the node runs under ``prlimit
--nofile``; idle connections are opened until a publish is no longer served, held, closed);
a rolling restart (SIGHUP); an upgrade of the supervisor (SIGUSR2, then a rolling restart).
The last two are no crashes: a duplicate, a consumer disconnected or a publish failed while
they run misses the target.

Report: acknowledged, delivered, lost (acknowledged and never delivered, or never finished,
after the final drain), early (deferred and REQ'd messages delivered before their due time),
duplicates by cause (explained: in flight at a crash, with attempts >= 2), shards not serving
at the end, RSS of the node's process tree (max, first and last window's median, max per
minute), consumer connections ended and publish errors during reloads and upgrades, and the
publish stall then (send to acknowledgement: p50, p99, longest). The exit status is 1 when a
target is missed. Needs root (mount, prlimit).

  .venv/bin/python bench/chaos_soak.py --duration 600 --faults 24 --seed 1
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.chaos.soak import SoakConfig, run, summary  # noqa: E402


def main() -> int:
    d = SoakConfig()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=d.duration, help="seconds of load and faults")
    parser.add_argument("--faults", type=int, default=d.faults)
    parser.add_argument("--seed", type=int, default=None, help="default: a random one (printed)")
    parser.add_argument("--rate", type=float, default=d.rate, help="messages/s published over all producers")
    parser.add_argument("--topics", type=int, default=d.topics)
    parser.add_argument("--shards", type=int, default=d.shards)
    parser.add_argument("--nofile", type=int, default=d.nofile, help="the node's descriptor limit")
    parser.add_argument("--shard-timeout", type=float, default=d.shard_timeout, help="heartbeat deadline, seconds")
    parser.add_argument("--tmpfs-size", default=d.tmpfs_size)
    parser.add_argument("--mem-queue-size", type=int, default=d.mem_queue_size)
    parser.add_argument("--drain-timeout", type=float, default=d.drain_timeout)
    parser.add_argument("--workdir", default=None, help="where the data path's mount point is made")
    parser.add_argument("--json", type=Path, default=None, help="also write the full report here")
    parser.add_argument("--node-log", default=None, help="write the node's output here")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    print(f"chaos soak: seed {seed}, {args.duration:.0f} s, {args.faults} faults", flush=True)
    cfg = SoakConfig(duration=args.duration, faults=args.faults, seed=seed, rate=args.rate, topics=args.topics,
                     shards=args.shards, nofile=args.nofile, shard_timeout=args.shard_timeout,
                     tmpfs_size=args.tmpfs_size, mem_queue_size=args.mem_queue_size,
                     drain_timeout=args.drain_timeout, workdir=args.workdir, node_log=args.node_log)
    report = run(cfg)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str))
    print(summary(report))
    return 1 if report["missed"] else 0


if __name__ == "__main__":
    sys.exit(main())
