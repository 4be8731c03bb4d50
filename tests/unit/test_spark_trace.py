"""The source's opt-in timeline (``PYNSQD_SPARK_TRACE``) and the tool that reads it (no Spark run)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.spark_timeline import cycles, load, pick_runner
from pynsqd.spark import trace


@pytest.fixture
def fresh_trace(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    trace.reset()
    yield monkeypatch
    monkeypatch.delenv(trace.ENV, raising=False)
    trace.reset()


def test_events_go_to_a_file_per_process_only_when_the_variable_is_set(
        fresh_trace: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fresh_trace.delenv(trace.ENV, raising=False)
    trace.event("latest.in", start=0)
    assert not trace.enabled() and list(tmp_path.iterdir()) == []

    trace.reset()
    fresh_trace.setenv(trace.ENV, str(tmp_path / "t"))
    trace.event("latest.in", start=3)
    trace.event("latest.out", end=4, hb=0)
    lines = (tmp_path / "t" / f"{os.getpid()}.trace").read_text().splitlines()
    assert [line.split()[1:] for line in lines] == [["latest.in", "start=3"], ["latest.out", "end=4", "hb=0"]]
    assert float(lines[0].split()[0]) <= float(lines[1].split()[0])


def write(path: Path, events: list[tuple[float, str]]) -> None:
    path.write_text("".join(f"{t:.6f} {what}\n" for t, what in events))


def test_timeline_splits_each_micro_batch_into_its_phases(tmp_path: Path) -> None:
    # runner 100: batch 1 planned at 10.000; Spark commits batch 0 at 10.050, plans at 10.080,
    # executors (200, 201) read 10.100-10.180, the next latestOffset comes at 10.300.
    write(tmp_path / "100.trace", [
        (10.000, "latest.in start=0"), (10.001, "latest.took rows=500 batches=3"),
        (10.010, "served seq=1"), (10.010, "latest.out end=1 hb=0"),
        (10.050, "commit.in end=0"), (10.060, "commit.out end=0"), (10.080, "partitions start=0 end=1"),
        (10.200, "recv n=300 inflight=800 buffered=300"),
        (10.300, "latest.in start=1"), (10.301, "latest.took rows=0 batches=0"), (10.301, "latest.out end=1 hb=1"),
    ])
    write(tmp_path / "200.trace", [(10.100, "read.in part=000000000001-000"),
                                   (10.150, "read.out part=000000000001-000 rows=250")])
    write(tmp_path / "201.trace", [(10.110, "read.in part=000000000001-001"),
                                   (10.180, "read.out part=000000000001-001 rows=250")])
    # a later query's runner (300) numbers its batches from 1 too: its reads are not this batch's
    write(tmp_path / "300.trace", [(12.000, "latest.in start=0"), (12.300, "latest.in start=1")])
    write(tmp_path / "301.trace", [(12.100, "read.in part=000000000001-000"),
                                   (12.200, "read.out part=000000000001-000 rows=9")])
    events = load(str(tmp_path))
    assert pick_runner(events) in (100, 300)
    [row] = cycles(events, 100)
    expected = {"seq": 1, "rows": 500, "received": 300, "take": 10, "offlog": 40, "fin": 10, "plan": 20,
                "sched": 20, "read": 80, "done": 120, "cycle": 300}
    assert row == pytest.approx(expected, abs=0.01)
