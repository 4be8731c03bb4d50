"""NSQ's own load generators, ``bench_writer`` and ``bench_reader``, as a load for bench_nsqd.py.

They are NSQ's ``bench/bench_writer`` and ``bench/bench_reader`` built from NSQ's public
source (``go build`` in each directory; nothing of them is in this repository), found in the
directory given to ``bench_nsqd.py --nsq-tools``. Each opens ``GOMAXPROCS`` connections:
bench_writer sends ``MPUB`` of ``--batch-size`` messages (an MPUB of one message with
``--batch-size=1``) and waits for each answer; bench_reader subscribes with ``RDY 2500``,
FINs every message and flushes its FINs once three quarters of its RDY are answered. Both run
``--runfor`` and print ``duration: … - <MB/s> - <ops/s> - <µs/op>``, the messages a second
over the whole run.

One topic is loaded by one process with ``GOMAXPROCS=2`` (bench.sh's shape, two connections);
many topics by one process per topic with ``GOMAXPROCS=1`` (one connection each), started
together by the tools' ``--deadline`` (a whole second of the UTC clock), their rates summed.
"""

from __future__ import annotations

import datetime
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

_RESULT = re.compile(r"duration: \S+ - [0-9.]+mb/s - ([0-9.]+)ops/s")
TOOLS = ("bench_writer", "bench_reader")


def check(directory: str) -> Path:
    """The directory, if both tools are executables in it; else SystemExit with what is missing."""
    path = Path(directory).resolve()
    missing = [t for t in TOOLS if not os.access(path / t, os.X_OK)]
    if missing:
        raise SystemExit(f"bench_nsqd.py: no {' or '.join(missing)} in {path} (build them from NSQ's "
                         "bench/bench_writer and bench/bench_reader)")
    return path


def _deadline(seconds_ahead: float) -> str:
    """A start time the tools accept (``2006-01-02 15:04:05``, read as UTC), ``seconds_ahead``
    or up to a second more from now."""
    at = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=seconds_ahead + 1)
    return at.strftime("%Y-%m-%d %H:%M:%S")


def run(directory: Path, tool: str, tcp: tuple[str, int], topics: list[str], runfor: float, size: int,
        batch: int = 0, while_waiting: Callable[[], object] = lambda: None) -> float:
    """Run ``tool`` against ``topics`` (one process, two connections, for one topic; one
    process with one connection per topic for several) for ``runfor`` s; the messages a
    second of all of them. SystemExit if a tool fails."""
    procs = 1 if len(topics) == 1 else len(topics)
    common = [f"--nsqd-tcp-address={tcp[0]}:{tcp[1]}", f"--runfor={runfor}s", f"--size={size}"]
    if tool == "bench_writer":
        common.append(f"--batch-size={batch}")
    else:
        common.append("--channel=ch")
    if procs > 1:
        common.append(f"--deadline={_deadline(1.0 + procs * 0.02)}")
    env = {**os.environ, "GOMAXPROCS": "2" if procs == 1 else "1"}
    running = [subprocess.Popen([str(directory / tool), *common, f"--topic={t}"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for t in topics]
    outputs = []
    for proc in running:
        while True:
            try:
                outputs.append(proc.communicate(timeout=0.2)[0])
                break
            except subprocess.TimeoutExpired:
                while_waiting()
    total = 0.0
    for proc, out in zip(running, outputs):
        found = _RESULT.search(out)
        if proc.returncode or not found:
            raise SystemExit(f"{tool} failed (exit status {proc.returncode}):\n{out[-2000:]}")
        total += float(found.group(1))
    return total
