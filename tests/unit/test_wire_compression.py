"""The sans-IO stream codecs alone: round trips whole, byte by byte and in odd pieces; a
deflate bomb is inflated in bounded pieces; corrupt input raises CompressionError."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pynsqd.wire.compression import MAX_PIECE, CompressionError, DeflateCodec, make_codec


def decode_all(codec_name: str, wire: bytes, step: int) -> bytes:
    codec = make_codec(codec_name)
    return b"".join(b"".join(codec.decode(wire[i:i + step])) for i in range(0, len(wire), step))


@pytest.mark.parametrize("name", ["snappy", "deflate"])
@pytest.mark.parametrize("step", [1, 7, 4096, 1 << 30])
def test_round_trip_in_any_pieces(name: str, step: int) -> None:
    enc = make_codec(name)
    chunks = [b"OK", bytes(range(256)) * 300, b"", b"x" * 70000]
    wire = b"".join(enc.encode(c) for c in chunks)
    assert decode_all(name, wire, step) == b"".join(chunks)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.binary(max_size=3000), max_size=8), st.sampled_from(["snappy", "deflate"]),
       st.integers(1, 5000))
def test_round_trip_property(chunks: list[bytes], name: str, step: int) -> None:
    enc = make_codec(name)
    wire = b"".join(enc.encode(c) for c in chunks)
    assert decode_all(name, wire, step) == b"".join(chunks)


def test_each_encode_is_decodable_at_once() -> None:
    """A sync flush per write: the peer can decode every write without waiting for more."""
    enc, dec = DeflateCodec(9), DeflateCodec()
    for msg in (b"first", b"second" * 1000):
        assert b"".join(dec.decode(enc.encode(msg))) == msg


def test_deflate_bomb_comes_out_in_bounded_pieces() -> None:
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)
    bomb = comp.compress(b"\0" * (20 * MAX_PIECE)) + comp.flush(zlib.Z_SYNC_FLUSH)
    pieces = list(DeflateCodec().decode(bomb))
    assert len(bomb) < 100_000 and all(len(p) <= MAX_PIECE for p in pieces)
    assert sum(map(len, pieces)) == 20 * MAX_PIECE


@pytest.mark.parametrize(("name", "wire"), [
    ("snappy", b"\xff\x06\x00\x00sNaPpY\x00\x08\x00\x00\x00\x00\x00\x00zzzz"),  # bad CRC/body
    ("deflate", b"\xff" * 32),
])
def test_corrupt_input_raises(name: str, wire: bytes) -> None:
    with pytest.raises(CompressionError):
        list(make_codec(name).decode(wire))
