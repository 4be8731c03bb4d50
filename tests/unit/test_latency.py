"""The e2e latency window alone: quantiles, reservoir weighting, the half-window rotation."""

from __future__ import annotations

import struct
import time

from pynsqd.shard.latency import RESERVOIR, LatencyWindow, merged, summarize
from testbed.harness import wait_for


def record(published_ns: int) -> bytes:
    return struct.pack(">qH", published_ns, 1) + b"0" * 16 + b"body"


def test_quantiles_of_known_samples() -> None:
    w = LatencyWindow(60 * 10**9, [0.5, 0.99])
    now = time.time_ns()
    for ms in range(1, 101):
        w.add_record(record(now - ms * 10**6), wall_now=now)
    result = w.result()
    assert result["count"] == 100
    assert [p["quantile"] for p in result["percentiles"]] == [0.5, 0.99]
    assert result["percentiles"][0]["value"] == 50e6 and result["percentiles"][1]["value"] == 99e6


def test_reservoir_keeps_memory_bounded_and_counts_everything() -> None:
    w = LatencyWindow(60 * 10**9, [0.5])
    now = time.time_ns()
    for _ in range(RESERVOIR * 5):
        w.add_record(record(now - 10**6), wall_now=now)
    assert w.count() == RESERVOIR * 5 and len(w.weighted()) == RESERVOIR
    assert w.result()["percentiles"][0]["value"] == 1e6


def test_old_samples_leave_after_the_window() -> None:
    w = LatencyWindow(200 * 10**6, [0.99])  # halves of 100ms
    w.add_record(record(time.time_ns() - 5 * 10**9))
    assert w.count() == 1
    wait_for(lambda: w.count() == 0, timeout=2)
    assert w.result() == {"count": 0, "percentiles": [{"quantile": 0.99, "value": 0.0}]}


def test_topic_merges_its_channels_weighted_by_count() -> None:
    a, b = LatencyWindow(60 * 10**9, [0.5]), LatencyWindow(60 * 10**9, [0.5])
    now = time.time_ns()
    for _ in range(30):
        a.add_record(record(now - 10**6), wall_now=now)
    for _ in range(10):
        b.add_record(record(now - 9 * 10**6), wall_now=now)
    topic = merged([a, b, None])
    assert topic["count"] == 40 and topic["percentiles"][0]["value"] == 1e6
    assert merged([None]) == {"count": 0, "percentiles": None}
    assert summarize([0.9], 0, []) == {"count": 0, "percentiles": [{"quantile": 0.9, "value": 0.0}]}
