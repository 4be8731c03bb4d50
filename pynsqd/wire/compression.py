"""Stream codecs NSQ negotiates in IDENTIFY: snappy's framing format and raw deflate.

Theory of operation
-------------------
After IDENTIFY both directions of a connection may switch to a compressed byte stream
(nsqd: ``snappy.NewBufferedWriter``/``NewReader``, ``flate.NewWriter``/``NewReader``). The
codecs here are sans-IO: ``encode(data)`` returns the compressed bytes for ``data`` in a
form the peer can decode *now* (a complete snappy chunk, or deflate output followed by a
sync flush), and ``decode(data)`` returns the plain bytes recovered so far, keeping partial
input inside. The server (``pynsqd.shard.transport``) and the client library both use them.

Bounds: snappy framing chunks carry at most 64 KiB of plain data each; raw deflate is
inflated in pieces of at most ``MAX_PIECE`` bytes per step, so a small "deflate bomb"
costs the reader no more than the command parser's own limits allow (the caller feeds
pieces to the parser, which fails an oversize command long before memory runs out).
A stream that cannot be decoded raises ``CompressionError``; nsqd closes such a connection.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from pynsqd.lazyimport import lazy_module

if TYPE_CHECKING:
    import cramjam
    import snappy
else:  # loaded by the first connection that asks for snappy
    cramjam = lazy_module("cramjam")
    snappy = lazy_module("snappy")

MAX_PIECE = 256 * 1024
DEFAULT_DEFLATE_LEVEL = 6


class CompressionError(Exception):
    """The compressed stream is corrupt."""


class Codec(Protocol):
    name: str

    def encode(self, data: bytes) -> bytes: ...

    def decode(self, data: bytes) -> Iterator[bytes]: ...


class SnappyCodec:
    """Snappy framing format (stream identifier, then CRC-checked chunks)."""

    name = "snappy"

    def __init__(self) -> None:
        self._enc = snappy.StreamCompressor()
        self._dec = snappy.StreamDecompressor()

    def encode(self, data: bytes) -> bytes:
        return bytes(self._enc.add_chunk(data))

    def decode(self, data: bytes) -> Iterator[bytes]:
        try:
            out = self._dec.decompress(data)
        except (cramjam.DecompressionError, ValueError, OSError) as exc:
            raise CompressionError(f"snappy: {exc}") from None
        if out:
            yield bytes(out)


class DeflateCodec:
    """Raw deflate (no zlib header, RFC 1951), sync-flushed after every write."""

    name = "deflate"

    def __init__(self, level: int = DEFAULT_DEFLATE_LEVEL) -> None:
        self._enc = zlib.compressobj(level, zlib.DEFLATED, -15)
        self._dec = zlib.decompressobj(-15)

    def encode(self, data: bytes) -> bytes:
        return self._enc.compress(data) + self._enc.flush(zlib.Z_SYNC_FLUSH)

    def decode(self, data: bytes) -> Iterator[bytes]:
        dec = self._dec
        try:
            while data:
                out = dec.decompress(data, MAX_PIECE)
                data = dec.unconsumed_tail
                if out:
                    yield out
                if dec.eof:
                    raise CompressionError("deflate: unexpected end of stream")
        except zlib.error as exc:
            raise CompressionError(f"deflate: {exc}") from None


def make_codec(name: str, deflate_level: int = DEFAULT_DEFLATE_LEVEL) -> Codec:
    """``"snappy"`` or ``"deflate"`` → a fresh codec for one connection."""
    if name == "snappy":
        return SnappyCodec()
    if name == "deflate":
        return DeflateCodec(deflate_level)
    raise ValueError(f"unknown compression {name!r}")
