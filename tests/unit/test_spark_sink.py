"""The ``nsq`` sink's columnar MPUB building, against the wire codec's own MPUB (no Spark run)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("pyarrow", reason="the spark extra is not installed")

import pyarrow as pa

from pynsqd.spark.options import SinkOptions
from pynsqd.spark.sink import _as_binary, _by_topic, chunks, framed
from pynsqd.wire.commands import CommandParser, encode_mpub


def options(max_body: int, max_msg: int = 1024, topic: str = "t") -> SinkOptions:
    return SinkOptions.parse({"nsqdTCPAddress": "127.0.0.1:4150", "topic": topic, "maxBodySize": str(max_body),
                              "maxMsgSize": str(max_msg)})


def commands(topic: str, column: object, opts: SinkOptions) -> list[bytes]:
    """The MPUB commands the sink sends for ``column``, as bytes on the wire."""
    out = []
    for count, payload in chunks(framed(_as_binary(column), opts), opts):
        body = count.to_bytes(4, "big") + bytes(payload)
        out.append(b"MPUB " + topic.encode() + b"\n" + len(body).to_bytes(4, "big") + body)
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=300), max_size=80), st.integers(1024, 4096), st.integers(0, 20),
       st.booleans())
def test_framed_chunks_are_greedy_mpubs_within_nsqds_limits(bodies: list[bytes], max_body: int, cut: int,
                                                             as_string: bool) -> None:
    opts = options(max_body, max_msg=300)
    column = pa.array(bodies, pa.binary())[cut:]  # a slice: offsets that do not start at 0
    if as_string:
        column = pa.array([b.hex() for b in bodies], pa.string())[cut:]
        bodies = [b.hex().encode() for b in bodies]
    bodies = bodies[cut:]
    sent = commands("t", column, opts)
    want: list[bytes] = []
    chunk: list[bytes] = []
    for body in bodies:  # greedy, as nsqd's --max-body-size allows
        if chunk and 4 + sum(4 + len(b) for b in [*chunk, body]) > max_body:
            want.append(encode_mpub("t", chunk))
            chunk = []
        chunk.append(body)
    if chunk:
        want.append(encode_mpub("t", chunk))
    assert sent == want
    parser = CommandParser()
    parsed = [event for command in sent for event in parser.feed(command)]
    assert [b for event in parsed for b in event[2]] == bodies


def test_bad_bodies_and_topics_are_clear_errors() -> None:
    opts = options(4096, max_msg=64)
    with pytest.raises(ValueError, match="a body of 65 bytes exceeds maxMsgSize=64"):
        framed(_as_binary(pa.array([b"x", b"y" * 65])), opts)
    with pytest.raises(ValueError, match="must be binary or string, not int64"):
        _as_binary(pa.array([1, 2]))
    batch = pa.RecordBatch.from_pydict({"body": ["a", "b", "c", "d"], "topic": ["x", "", None, "y"]})
    groups = _by_topic(batch, _as_binary(batch.column(0)), opts)
    assert [(topic, bodies.to_pylist()) for topic, bodies in groups] == [("x", [b"a"]), ("t", [b"b", b"c"]),
                                                                          ("y", [b"d"])]
    with pytest.raises(ValueError, match="a row has no topic and the topic option is not set"):
        _by_topic(batch, _as_binary(batch.column(0)), options(4096, topic=""))
    with pytest.raises(ValueError, match="needs the topic option or a 'topic' column"):
        _by_topic(batch.drop_columns(["topic"]), _as_binary(batch.column(0)), options(4096, topic=""))
