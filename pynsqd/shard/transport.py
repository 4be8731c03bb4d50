"""Upgrading a V2 connection after IDENTIFY: TLS, then snappy or deflate.

Theory of operation
-------------------
nsqd upgrades in a fixed order once the IDENTIFY response has been written: TLS (handshake,
then an ``OK`` frame over TLS), then snappy or deflate (switch both directions, then an
``OK`` frame in the compressed stream). A client waits for each ``OK`` before it sends
anything else, so nothing may be pending in the plain stream when an upgrade starts
(``ClientV2`` refuses an IDENTIFY followed by early bytes).

Compression is a synchronous swap: ``CompressedTransport`` wraps the connection's transport
(plain or TLS) and compresses every ``write``; the connection passes received bytes through
the codec's ``decode`` before its command parser. TLS is asynchronous: the connection stops
reading, ``loop.start_tls`` runs the handshake on the same socket with this protocol as the
application protocol, and the connection carries on with the TLS transport it returns.
Frames produced meanwhile (a heartbeat) are held back and sent after the upgrade.

The ``ssl.SSLContext`` comes from ``node/tls.py`` (the supervisor checks the same files at
start). ``tls_info`` reads what ``/stats`` reports.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

from pynsqd.wire.compression import Codec

TLS_HANDSHAKE_TIMEOUT = 10.0

class CompressedTransport:
    """A transport whose ``write`` compresses with ``codec``; everything else is the inner
    transport's (pausing, closing, buffer sizes, extra info)."""

    def __init__(self, inner: asyncio.Transport, codec: Codec) -> None:
        self._inner = inner
        self.codec = codec

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._inner.write(self.codec.encode(bytes(data)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def peer_common_name(transport: Any) -> str:
    """The CN of a TLS peer's certificate, or ``""``."""
    ssl_object = transport.get_extra_info("ssl_object")
    cert = ssl_object.getpeercert() if ssl_object is not None else None
    for rdn in (cert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return ""


NO_TLS: dict[str, Any] = {"tls": False, "tls_cipher_suite": "", "tls_version": "", "tls_negotiated_protocol": "",
                          "tls_negotiated_protocol_is_mutual": False}


def tls_info(transport: Any) -> dict[str, Any]:
    """``tls_cipher_suite``, ``tls_version`` (Go's spelling, ``TLS1.2``) for ``/stats``."""
    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is None:
        return dict(NO_TLS)
    cipher = ssl_object.cipher()
    version = (ssl_object.version() or "").replace("TLSv", "TLS")
    return {"tls": True, "tls_cipher_suite": cipher[0] if cipher else "", "tls_version": version,
            "tls_negotiated_protocol": ssl_object.selected_alpn_protocol() or "",
            "tls_negotiated_protocol_is_mutual": True}


async def start_tls(transport: asyncio.Transport, protocol: asyncio.Protocol,
                    ctx: ssl.SSLContext) -> asyncio.Transport:
    """Run the server side of a TLS handshake on ``transport``; reading must already be
    paused. Returns the TLS transport. Raises ``ssl.SSLError``, ``ConnectionError`` or
    ``TimeoutError`` when the handshake fails."""
    loop = asyncio.get_running_loop()
    new = await loop.start_tls(transport, protocol, ctx, server_side=True,
                               ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT)
    if new is None:
        raise ConnectionError("connection closed during the TLS handshake")
    return new
