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

``build_server_context`` turns nsqd's ``--tls-*`` flags into an ``ssl.SSLContext``, used for
both the TCP upgrade and the HTTPS listener. ``tls_info`` reads what ``/stats`` reports.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

from pynsqd.shard.config import NsqdOptions
from pynsqd.wire.compression import Codec

TLS_HANDSHAKE_TIMEOUT = 10.0

_MIN_VERSIONS = {
    "": ssl.TLSVersion.TLSv1, "tls1.0": ssl.TLSVersion.TLSv1, "tls1.1": ssl.TLSVersion.TLSv1_1,
    "tls1.2": ssl.TLSVersion.TLSv1_2, "tls1.3": ssl.TLSVersion.TLSv1_3,
}


def build_server_context(opts: NsqdOptions) -> ssl.SSLContext | None:
    """The server TLS context for ``--tls-cert``/``--tls-key``, or ``None`` without them.

    ``--tls-client-auth-policy``: ``require-verify`` needs a client certificate signed by
    ``--tls-root-ca-file`` (or the system CAs); ``require`` needs a client certificate too.
    Python's ``ssl`` cannot accept a certificate it cannot verify, so ``require`` also checks
    the chain (nsqd's ``RequireAnyClientCert`` would take a self-signed one). Raises
    ``OSError``/``ssl.SSLError`` for unreadable or mismatched files.
    """
    if not (opts.tls_cert and opts.tls_key):
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(opts.tls_cert, opts.tls_key)
    # The system's OpenSSL policy still applies on top (OpenSSL 3 refuses TLS < 1.2 at its
    # default security level even when --tls-min-version allows it); we do not weaken it.
    ctx.minimum_version = _MIN_VERSIONS[opts.tls_min_version]
    if opts.tls_client_auth_policy:
        ctx.verify_mode = ssl.CERT_REQUIRED
        if opts.tls_root_ca_file:
            ctx.load_verify_locations(opts.tls_root_ca_file)
        else:
            ctx.load_default_certs(ssl.Purpose.CLIENT_AUTH)
    elif opts.tls_root_ca_file:
        ctx.verify_mode = ssl.CERT_OPTIONAL
        ctx.load_verify_locations(opts.tls_root_ca_file)
    return ctx


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
