"""The chaos soak, short: a minute and a half of mixed load (TCP PUB/MPUB/DPUB, HTTP /pub, /mpub
and deferred /pub; consumers that FIN, REQ with and without a delay, and hold with TOUCH) over
six topics on two shards, while one fault of every kind hits the node at seeded moments:
kill -9 of a shard, kill -9 of the whole tree and a restart, SIGSTOP of a shard past the
heartbeat deadline, a full data path (a tmpfs), descriptor exhaustion (``prlimit --nofile``),
a rolling restart (SIGHUP) and an upgrade of the supervisor (SIGUSR2). The same invariants as
``bench/chaos_soak.py``: nothing acknowledged lost, nothing deferred delivered early, every
duplicate explained by a crash (in flight at it, delivered again with attempts >= 2), no
consumer disconnected and no publish failed by a reload or an upgrade, every shard serving at
the end, RSS bounded."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.chaos.faults import KINDS
from bench.chaos.soak import SoakConfig, run, summary

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs for the data path: needs root")]

SEED = 20261126


def test_a_minute_of_chaos_loses_nothing_and_repeats_only_what_a_crash_had_in_flight(tmp_path: Path) -> None:
    report = run(SoakConfig(duration=90, faults=len(KINDS), seed=SEED, rate=100, topics=6, drain_timeout=60,
                            workdir=str(tmp_path), node_log=str(tmp_path / "node.log")))
    assert not report["missed"], f"{summary(report)}\n(the node's output: {tmp_path / 'node.log'})"
    assert sorted(f["kind"] for f in report["faults"]) == sorted(KINDS), report["faults"]
    assert report["acknowledged"] > 1000 and report["node_starts"] == 2
    assert not [line for line in Path("/proc/mounts").read_text().splitlines() if str(tmp_path) in line]
