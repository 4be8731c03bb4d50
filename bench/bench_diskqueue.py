"""Disk queue throughput: put_many and read_many of 226-byte records (an nsqd message with a
200-byte body), plus one put run with nsqd's default sync_every=2500.

    PYTHONPATH=$PWD python bench/bench_diskqueue.py [--records 2000000] [--batch 200] [--dir DIR]

Prints records/s and MB/s (payload + 4-byte header) per phase. fsync is excluded from the
first two lines (sync_every larger than the run); the last line includes every fsync.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

from pynsqd.shm.diskqueue import DiskQueue

RECORD_SIZE = 226


def _queue(path: str, sync_every: int) -> DiskQueue:
    return DiskQueue("bench", path, max_bytes_per_file=100 * 1024 * 1024, min_msg_size=26,
                     max_msg_size=1024 * 1024 + 26, sync_every=sync_every, sync_timeout_ns=2_000_000_000)


def _report(label: str, count: int, seconds: float) -> None:
    mb = count * (RECORD_SIZE + 4) / 1e6
    print(f"{label:<28} {count / seconds:>12,.0f} records/s {mb / seconds:>9.1f} MB/s  ({seconds:.2f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--dir", default=None, help="where to put the files (default: a temp dir)")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="bench-dq-", dir=args.dir)
    try:
        batch = [os.urandom(RECORD_SIZE) for _ in range(args.batch)]
        rounds = args.records // args.batch
        total = rounds * args.batch

        queue = _queue(root, sync_every=1 << 62)
        start = time.perf_counter()
        for _ in range(rounds):
            queue.put_many(batch)
        _report(f"put_many (batch {args.batch})", total, time.perf_counter() - start)

        start = time.perf_counter()
        got = 0
        while records := queue.read_many(args.batch):
            got += len(records)
        _report(f"read_many (batch {args.batch})", got, time.perf_counter() - start)
        assert got == total and queue.depth == 0, (got, queue.depth)
        queue.close()

        synced = _queue(root, sync_every=2500)
        start = time.perf_counter()
        for _ in range(rounds):
            synced.put_many(batch)
        _report("put_many sync_every=2500", total, time.perf_counter() - start)
        synced.close()
    finally:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
