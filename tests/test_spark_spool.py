"""The spool file format between the source's driver runner and its executors (no Spark run)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyarrow", reason="the spark extra is not installed")

from pynsqd.client.batch import FrameSplitter, MessageRun
from pynsqd.spark.options import SinkOptions, SourceOptions
from pynsqd.spark.spool import SEGMENT, SpoolError, arrow_batches, read_spool, runner_dir, write_spool
from pynsqd.wire.frames import FRAME_MESSAGE, HEARTBEAT_FRAME, encode_frame
from pynsqd.wire.message import encode_message


def runs(messages: list[tuple[int, int, bytes, bytes]]) -> list[MessageRun]:
    """The runs a client's ``FrameSplitter`` makes of these messages (a heartbeat after the
    second one), read in pieces of 50,000 bytes."""
    frames = [encode_frame(FRAME_MESSAGE, encode_message(*m)) for m in messages]
    stream = b"".join(frames[:2]) + HEARTBEAT_FRAME + b"".join(frames[2:])
    splitter = FrameSplitter()
    out = []
    for i in range(0, len(stream), 50_000):
        out += [item for item in splitter.feed(stream[i:i + 50_000]) if isinstance(item, MessageRun)]
    return out


def test_frames_round_trip_into_arrow_with_any_bytes_in_bodies(tmp_path: Path) -> None:
    bodies = [b"", b"line\nbreak", bytes(range(256)), b"x" * 70000, b"last"]
    messages = [(1_700_000_000_123_456_789 + i, i + 1, b"%016x" % i, body) for i, body in enumerate(bodies)]
    got = runs(messages)
    assert len(got) > 1 and got[1].offsets[0] > 0  # later runs point into the middle of their bytes
    segments = [(i % 2, run.frames, run.offsets) for i, run in enumerate(got)]
    path = str(tmp_path / "a.spool")
    assert write_spool(path, "t", "c", ["n1:4150", "n2:4150"], segments) == len(bodies)
    rows = [row for batch in arrow_batches(path) for row in batch.to_pylist()]
    assert [r["body"] for r in rows] == bodies
    per_run = [len(run.offsets) - 1 for run in got]
    assert [r["nsqd"] for r in rows] == [f"n{i % 2 + 1}:4150" for i, n in enumerate(per_run) for _ in range(n)]
    assert [r["attempts"] for r in rows] == [1, 2, 3, 4, 5]
    assert [r["id"] for r in rows] == [f"{i:016x}" for i in range(5)]
    assert {(r["topic"], r["channel"]) for r in rows} == {("t", "c")}
    assert rows[0]["timestamp"].timestamp() == pytest.approx(1_700_000_000.123456)


def test_a_slice_of_a_run_spools_only_its_messages(tmp_path: Path) -> None:
    run = runs([(i, 1, b"%016x" % i, b"m-%d" % i) for i in range(12)])[1]  # messages 2-11
    path = str(tmp_path / "s.spool")
    write_spool(path, "t", "c", ["n:1"], [(0, run.frames, run.offsets[3:8])])
    assert [r["body"] for b in arrow_batches(path) for r in b.to_pylist()] == [b"m-5", b"m-6", b"m-7", b"m-8"]
    (_, segs) = read_spool(path)
    assert len(segs[0][3]) == run.offsets[7] - run.offsets[3]  # only the slice's bytes were written


def test_bad_spool_files_are_clear_errors(tmp_path: Path) -> None:
    (run,) = runs([(1, 1, b"0" * 16, b"body"), (2, 1, b"1" * 16, b"more")])[:1]
    path = tmp_path / "b.spool"
    write_spool(str(path), "t", "c", ["n:1"], [(0, run.frames, run.offsets)])
    data = path.read_bytes()
    path.write_bytes(data[:-2])
    with pytest.raises(SpoolError, match="bad segment"):
        read_spool(str(path))
    header_end = data.index(b"\n", 10) + 1
    offsets_at = header_end + SEGMENT.size
    first, second = data[offsets_at:offsets_at + 4], data[offsets_at + 4:offsets_at + 8]
    swapped = data[:offsets_at] + second + first + data[offsets_at + 8:]
    path.write_bytes(swapped)  # offsets out of order: an error, never a crash in Arrow
    with pytest.raises(SpoolError):
        list(arrow_batches(str(path)))
    path.write_bytes(b"garbage")
    with pytest.raises(SpoolError, match="not a spool file"):
        read_spool(str(path))
    with pytest.raises(SpoolError, match="missing"):
        read_spool(str(tmp_path / "absent.spool"))


def test_options_are_checked_with_their_names() -> None:
    base = {"nsqdTCPAddresses": "127.0.0.1:4150", "topic": "t"}
    opts = SourceOptions.parse(base)
    assert opts.channel == "spark" and opts.max_in_flight == 2500 and opts.max_batch == 833
    with pytest.raises(ValueError, match="option topic is required"):
        SourceOptions.parse({"nsqdTCPAddresses": "127.0.0.1:4150"})
    with pytest.raises(ValueError, match="nsqdTCPAddresses or lookupdHTTPAddresses"):
        SourceOptions.parse({"topic": "t"})
    with pytest.raises(ValueError, match="maxInFlight=100 must exceed 2 x maxBatch=50"):
        SourceOptions.parse({**base, "maxInFlight": "100", "maxBatch": "50"})
    with pytest.raises(ValueError, match="maxBatch='x' is not an integer"):
        SourceOptions.parse({**base, "maxBatch": "x"})
    with pytest.raises(ValueError, match="not a valid NSQ topic name"):
        SourceOptions.parse({**base, "topic": "bad topic"})
    assert opts.min_batch == 0
    with_min = SourceOptions.parse({**base, "minBatch": "500"})
    assert with_min.min_batch == 500 and with_min.max_batch_delay_ms == 1000
    with pytest.raises(ValueError, match="minBatch=900 must not exceed maxBatch=833"):
        SourceOptions.parse({**base, "minBatch": "900"})
    with pytest.raises(ValueError, match="maxBatchDelay=-1 must be >= 0"):
        SourceOptions.parse({**base, "minBatch": "5", "maxBatchDelay": "-1"})
    with pytest.raises(ValueError, match="exactly one nsqd"):
        SinkOptions.parse({"topic": "t"})


_RUNNER = r"""
import sys
from pynsqd.spark.spool import runner_dir
print(runner_dir(sys.argv[1], "t.c"), flush=True)
sys.stdin.read()  # alive until the test closes stdin or kills it
"""


def test_a_runner_removes_the_spool_dirs_of_dead_runners_only(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    spool = str(tmp_path / "spool")
    procs = [subprocess.Popen([sys.executable, "-c", _RUNNER, spool], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    try:
        dead, alive = (Path(p.stdout.readline().strip()) for p in procs if p.stdout is not None)
        (dead / "000000000001-000.spool").write_bytes(b"left by a killed runner")
        procs[0].kill()
        procs[0].wait()
        foreign = tmp_path / "spool" / "made-by-hand"  # no lock file: not ours to judge
        foreign.mkdir()
        mine = Path(runner_dir(spool, "t.c"))
        assert not dead.exists()
        assert alive.is_dir() and foreign.is_dir() and mine.is_dir()
        assert sorted(p.name for p in (tmp_path / "spool").iterdir()) == sorted(
            [alive.name, foreign.name, mine.name])  # no dot-named directory left over
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            for stream in (p.stdin, p.stdout):
                if stream is not None:
                    stream.close()
