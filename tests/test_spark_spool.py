"""The spool file format between the source's driver runner and its executors (no Spark run)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pyarrow", reason="the spark extra is not installed")

from pynsqd.spark.options import SinkOptions, SourceOptions
from pynsqd.spark.spool import SpoolError, arrow_batches, read_spool, write_spool
from pynsqd.wire.message import encode_message


def test_records_round_trip_into_arrow_with_any_bytes_in_bodies(tmp_path: Path) -> None:
    bodies = [b"", b"line\nbreak", bytes(range(256)), b"x" * 70000]
    records = [(i % 2, encode_message(1_700_000_000_123_456_789 + i, i + 1, b"%016x" % i, body))
               for i, body in enumerate(bodies)]
    path = str(tmp_path / "a.spool")
    write_spool(path, "t", "c", ["n1:4150", "n2:4150"], records)
    assert read_spool(path)[1] == records
    (batch,) = list(arrow_batches(path))
    rows = batch.to_pylist()
    assert [r["body"] for r in rows] == bodies
    assert [r["nsqd"] for r in rows] == ["n1:4150", "n2:4150", "n1:4150", "n2:4150"]
    assert [r["attempts"] for r in rows] == [1, 2, 3, 4]
    assert rows[0]["id"] == "0000000000000000" and rows[0]["topic"] == "t" and rows[0]["channel"] == "c"
    assert rows[0]["timestamp"].timestamp() == pytest.approx(1_700_000_000.123456)


def test_bad_spool_files_are_clear_errors(tmp_path: Path) -> None:
    path = tmp_path / "b.spool"
    write_spool(str(path), "t", "c", ["n:1"], [(0, encode_message(1, 1, b"0" * 16, b"body"))])
    data = path.read_bytes()
    path.write_bytes(data[:-2])
    with pytest.raises(SpoolError, match="bad record length"):
        read_spool(str(path))
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
    with pytest.raises(ValueError, match="exactly one nsqd"):
        SinkOptions.parse({"topic": "t"})
