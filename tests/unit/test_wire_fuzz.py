"""Fuzz both parsers against one rule: parse, or report a documented ProtocolError — nothing
else — and the way the input is chunked never changes the outcome."""

from __future__ import annotations

import struct
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pynsqd.wire import commands as c
from pynsqd.wire.errors import CODES, ProtocolError
from pynsqd.wire.frames import FrameParser, encode_frame

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

SMALL = {"max_msg_size": 64, "max_body_size": 256, "max_req_timeout_ms": 1000, "max_line": 64}


def size(n: int) -> bytes:
    return struct.pack(">i", n)


# Pieces that make the parser take its interesting paths, mixed with noise.
_PIECES = st.one_of(
    st.sampled_from([
        b"NOP\n", b"RDY 1\r\n", b"\n", b"PUB t\n", b"MPUB t\n", b"DPUB t 10\n", b"DPUB t x\n",
        b"IDENTIFY\n", b"AUTH\n", b"AUTH x\n", b"PUB bad:t\n", b"FIN 0123456789abcdef\n",
        b"DPUB t 99999999999999999999999\n", b"PUB \xff\n",
    ]),
    st.integers(-(2**31), 2**31 - 1).map(size),
    st.integers(-2, 300).map(size),
    st.binary(max_size=40),
    st.integers(55, 75).map(lambda n: b"X" * n + b"\n"),  # around max_line
    st.builds(c.encode_pub, st.sampled_from(["t", "t#ephemeral"]), st.binary(max_size=70)),
    st.builds(c.encode_mpub, st.just("t"), st.lists(st.binary(max_size=70), max_size=5)),
    st.builds(c.encode_dpub, st.just("t"), st.integers(0, 2000), st.binary(max_size=70)),
)
STREAMS = st.lists(_PIECES, max_size=12).map(b"".join)


def chunkings(data: bytes) -> st.SearchStrategy[list[bytes]]:
    cuts = st.lists(st.integers(0, len(data)), max_size=8).map(sorted)
    return cuts.map(lambda points: [data[a:b] for a, b in zip([0, *points], [*points, len(data)])])


def outcome(items: list[Any]) -> list[Any]:
    """Check the rule on one result and make it comparable."""
    out: list[Any] = []
    for n, item in enumerate(items):
        if isinstance(item, ProtocolError):
            assert n == len(items) - 1, "an error must be the last item"
            assert item.code in CODES, item
            assert item.fatal
            item.encode_text()  # an error frame can always be built
            out.append(("ERROR", item.code, item.description))
        else:
            out.append(item)
    return out


def run_commands(chunks: list[bytes]) -> list[Any]:
    parser = c.CommandParser(**SMALL)
    items: list[Any] = []
    for chunk in chunks:
        got = parser.feed(chunk)  # any other exception fails the test
        if items and isinstance(items[-1], ProtocolError):
            assert got == [], "nothing may follow an error"
        items.extend(got)
        assert parser.buffered <= SMALL["max_line"] + SMALL["max_body_size"] + 4
    for name, params, body in (i for i in items if not isinstance(i, ProtocolError)):
        assert isinstance(name, bytes) and params[0] == name
        if name == b"MPUB":
            assert isinstance(body, list) and body and all(0 < len(b) <= 64 for b in body)
        elif name in (b"PUB", b"DPUB"):
            assert isinstance(body, bytes) and 0 < len(body) <= 64
    return outcome(items)


@FUZZ
@given(st.data(), STREAMS)
def test_command_parser_structured(data: st.DataObject, stream: bytes) -> None:
    whole = run_commands([stream])
    assert run_commands(data.draw(chunkings(stream))) == whole


@FUZZ
@given(st.data(), st.binary(max_size=400))
def test_command_parser_random_bytes(data: st.DataObject, stream: bytes) -> None:
    whole = run_commands([stream])
    assert run_commands(data.draw(chunkings(stream))) == whole


@settings(max_examples=60, deadline=None)
@given(STREAMS)
def test_command_parser_byte_at_a_time(stream: bytes) -> None:
    assert run_commands([stream[i:i + 1] for i in range(len(stream))]) == run_commands([stream])


def run_frames(chunks: list[bytes]) -> list[Any]:
    parser = FrameParser(max_frame_size=200)
    items: list[Any] = []
    for chunk in chunks:
        got = parser.feed(chunk)
        if items and isinstance(items[-1], ProtocolError):
            assert got == []
        items.extend(got)
        assert parser.buffered <= 204
    return outcome(items)


_FRAME_PIECES = st.one_of(
    st.builds(encode_frame, st.integers(-3, 5), st.binary(max_size=60)),
    st.integers(-(2**31), 2**31 - 1).map(size),
    st.integers(-2, 260).map(size),
    st.binary(max_size=30),
)


@FUZZ
@given(st.data(), st.lists(_FRAME_PIECES, max_size=10).map(b"".join))
def test_frame_parser_structured(data: st.DataObject, stream: bytes) -> None:
    whole = run_frames([stream])
    assert run_frames(data.draw(chunkings(stream))) == whole


@FUZZ
@given(st.data(), st.binary(max_size=300))
def test_frame_parser_random_bytes(data: st.DataObject, stream: bytes) -> None:
    whole = run_frames([stream])
    assert run_frames(data.draw(chunkings(stream))) == whole


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["t", "a.b_c-d", "x#ephemeral"]),
                          st.binary(min_size=1, max_size=64)), max_size=6))
def test_encoders_round_trip(pubs: list[tuple[str, bytes]]) -> None:
    wire = b"".join(c.encode_pub(t, b) for t, b in pubs)
    if pubs:
        wire += c.encode_mpub(pubs[0][0], [b for _, b in pubs])
    expected: list[Any] = [(b"PUB", [b"PUB", t.encode()], b) for t, b in pubs]
    if pubs:
        expected.append((b"MPUB", [b"MPUB", pubs[0][0].encode()], [b for _, b in pubs]))
    assert run_commands([wire]) == expected
