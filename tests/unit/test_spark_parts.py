"""Batch parts between the source's driver runner and its executors: the format and the server (no Spark run)."""

from __future__ import annotations

import socket
import threading

import pytest

pytest.importorskip("pyarrow", reason="the spark extra is not installed")

from pynsqd.client.batch import FrameSplitter, MessageRun
from pynsqd.spark.options import SinkOptions, SourceOptions
from pynsqd.spark.parts import HEADER, MAGIC, SEGMENT, PartError, arrow_batches, decode, encode
from pynsqd.spark.server import FetchError, PartServer, default_host, fetch
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


def part(*args: object) -> bytes:
    return b"".join(encode(*args))  # type: ignore[arg-type]


def test_frames_round_trip_into_arrow_with_any_bytes_in_bodies() -> None:
    bodies = [b"", b"line\nbreak", bytes(range(256)), b"x" * 70000, b"last"]
    messages = [(1_700_000_000_123_456_789 + i, i + 1, b"%016x" % i, body) for i, body in enumerate(bodies)]
    got = runs(messages)
    assert len(got) > 1 and got[1].offsets[0] > 0  # later runs point into the middle of their bytes
    segments = [(i % 2, run.frames, run.offsets) for i, run in enumerate(got)]
    data = part("t", "c", ["n1:4150", "n2:4150"], segments)
    rows = [row for batch in arrow_batches("p", bytearray(data)) for row in batch.to_pylist()]
    assert [r["body"] for r in rows] == bodies
    per_run = [len(run.offsets) - 1 for run in got]
    assert [r["nsqd"] for r in rows] == [f"n{i % 2 + 1}:4150" for i, n in enumerate(per_run) for _ in range(n)]
    assert [r["attempts"] for r in rows] == [1, 2, 3, 4, 5]
    assert [r["id"] for r in rows] == [f"{i:016x}" for i in range(5)]
    assert {(r["topic"], r["channel"]) for r in rows} == {("t", "c")}
    assert rows[0]["timestamp"].timestamp() == pytest.approx(1_700_000_000.123456)


def test_a_slice_of_a_run_frames_only_its_messages() -> None:
    run = runs([(i, 1, b"%016x" % i, b"m-%d" % i) for i in range(12)])[1]  # messages 2-11
    buffers = encode("t", "c", ["n:1"], [(0, run.frames, run.offsets[3:8])])
    assert isinstance(buffers[-1], memoryview) and buffers[-1].obj is run.frames  # the frames are not copied
    data = b"".join(buffers)
    assert [r["body"] for b in arrow_batches("s", data) for r in b.to_pylist()] == [b"m-5", b"m-6", b"m-7", b"m-8"]
    (_, segs) = decode("s", data)
    assert len(segs[0][3]) == run.offsets[7] - run.offsets[3]  # only the slice's bytes were framed


def test_bad_parts_are_clear_errors() -> None:
    (run,) = runs([(1, 1, b"0" * 16, b"body"), (2, 1, b"1" * 16, b"more")])[:1]
    data = part("t", "c", ["n:1"], [(0, run.frames, run.offsets)])
    with pytest.raises(PartError, match="bad segment"):
        decode("b", data[:-2])
    (header_length,) = HEADER.unpack_from(data, len(MAGIC))
    offsets_at = len(MAGIC) + HEADER.size + header_length + SEGMENT.size
    first, second = data[offsets_at:offsets_at + 4], data[offsets_at + 4:offsets_at + 8]
    swapped = data[:offsets_at] + second + first + data[offsets_at + 8:]
    with pytest.raises(PartError):  # offsets out of order: an error, never a crash in Arrow
        list(arrow_batches("b", swapped))
    with pytest.raises(PartError, match="truncated header"):
        decode("b", data[:len(MAGIC) + HEADER.size + 3])
    with pytest.raises(PartError, match="not a batch part"):
        decode("b", b"garbage")


def test_options_are_checked_with_their_names() -> None:
    base = {"nsqdTCPAddresses": "127.0.0.1:4150", "topic": "t"}
    opts = SourceOptions.parse(base)
    assert opts.channel == "spark" and opts.max_batch == 100_000 and opts.max_in_flight == 300_000
    assert opts.min_batch == 100_000 and opts.max_batch_delay_ms == 1000  # full batches, or after a second
    small = SourceOptions.parse({**base, "maxInFlight": "2500"})
    assert (small.max_batch, small.min_batch) == (833, 833)
    assert SourceOptions.parse({**base, "maxBatch": "10"}).max_in_flight == 30
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
    with_min = SourceOptions.parse({**base, "minBatch": "0"})
    assert with_min.min_batch == 0 and with_min.max_batch_delay_ms == 1000
    with pytest.raises(ValueError, match="minBatch=900 must not exceed maxBatch=833"):
        SourceOptions.parse({**base, "maxInFlight": "2500", "minBatch": "900"})
    with pytest.raises(ValueError, match="maxBatchDelay=-1 must be >= 0"):
        SourceOptions.parse({**base, "minBatch": "5", "maxBatchDelay": "-1"})
    assert opts.driver_host == "" and opts.driver_port == 0
    served = SourceOptions.parse({**base, "driverHost": "spark-driver-0", "driverPort": "7078"})
    assert (served.driver_host, served.driver_port) == ("spark-driver-0", 7078)
    with pytest.raises(ValueError, match="driverPort=70000 is not a TCP port"):
        SourceOptions.parse({**base, "driverPort": "70000"})
    with pytest.raises(ValueError, match="exactly one nsqd"):
        SinkOptions.parse({"topic": "t"})


def test_the_runner_serves_each_part_until_it_is_dropped_to_any_number_of_fetches() -> None:
    run = runs([(i, 1, b"%016x" % i, b"x" * 1000 + b"%d" % i) for i in range(3000)])
    segments = [(0, r.frames, r.offsets) for r in run]
    server = PartServer("127.0.0.1")
    try:
        assert server.address.startswith("127.0.0.1:")
        key = server.key("000000000001-000")
        server.add(key, encode("t", "c", ["n:1"], segments))
        got: list[bytes] = []
        threads = [threading.Thread(target=lambda: got.append(bytes(fetch(server.address, key)))) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert got == [part("t", "c", ["n:1"], segments)] * 4  # a retried task gets the same part
        server.drop(key)
        with pytest.raises(FetchError, match=r"no part .*000000000001-000: its batch was committed"):
            fetch(server.address, key)
        other = PartServer("127.0.0.1")  # a restarted runner: another token, so never a predecessor's key
        try:
            assert other.key("000000000001-000") != key
        finally:
            other.close()
        with socket.create_connection(("127.0.0.1", int(server.address.rsplit(":", 1)[1]))) as sock:
            sock.sendall(b"PUT x\n")
            assert sock.recv(100).endswith(b"bad request")
    finally:
        server.close()
    with pytest.raises(FetchError, match=r"cannot get batch part .* set the source's driverHost"):
        fetch(server.address, key)  # nobody listens there any more


def test_the_default_driver_host_is_what_spark_would_choose(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARK_LOCAL_IP", "10.1.2.3")
    assert default_host() == "10.1.2.3"
    monkeypatch.delenv("SPARK_LOCAL_IP")
    host = default_host()
    with socket.socket() as probe:  # an address of this host: something here can listen on it
        probe.bind((host, 0))


class Held:
    """What ``_serve`` reads of a ``MessageBatch``: its frames, offsets and nsqd."""

    def __init__(self, run: MessageRun, nsqd: str) -> None:
        self.frames, self.offsets, self.nsqd_address = run.frames, run.offsets, nsqd

    def __len__(self) -> int:
        return len(self.offsets) - 1


@pytest.mark.parametrize(("messages", "partitions", "parts"), [
    (1, 2, 1), (5_000, 2, 1), (19_999, 2, 1), (20_000, 2, 2), (100_000, 2, 2), (30_000, 4, 3), (100_000, 4, 4)])
def test_a_batch_is_served_in_parts_of_at_least_ten_thousand_messages(messages: int, partitions: int,
                                                                        parts: int) -> None:
    from pynsqd.spark.source import NSQStreamReader

    held = [Held(run, "n:1") for run in runs([(i, 1, b"%016x" % i, b"b") for i in range(messages)])]
    reader = NSQStreamReader(SourceOptions.parse({"nsqdTCPAddresses": "n:1", "topic": "t",
                                                  "partitions": str(partitions)}))
    reader._server = PartServer("127.0.0.1")
    try:
        keys = reader._serve(1, held)
        assert len(keys) == parts
        sizes = [sum(b.num_rows for b in arrow_batches(key, fetch(reader._server.address, key))) for key in keys]
        assert sum(sizes) == messages and max(sizes) - min(sizes) <= 1
    finally:
        reader._server.close()
