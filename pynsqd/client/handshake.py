"""Opening a connection to nsqd: TCP, magic, IDENTIFY, then TLS, snappy or deflate, then AUTH.

Theory of operation. ``open_connection`` follows the client guide's order, waiting for each
answer before sending anything else (nsqd refuses bytes sent before an upgrade completes):

1. connect, send ``  V2`` and IDENTIFY (with ``feature_negotiation`` and the features asked
   for); the reply is nsqd's settings as JSON (or ``OK`` from a server without negotiation,
   which upgrades nothing);
2. if the reply says ``tls_v1``: ``loop.start_tls`` on the same socket (client side, the
   context from ``TLSOptions``), then read the ``OK`` nsqd sends over TLS;
3. if it says ``snappy`` or ``deflate``: both directions switch to that codec
   (``pynsqd.wire.compression``, the server's own), then read the compressed ``OK``;
4. if it says ``auth_required``: send ``AUTH <secret>`` and read the JSON reply (identity,
   identity_url, permission_count), kept on ``NSQProtocol.auth``. nsqd answers a refused
   secret with ``E_AUTH_FAILED``/``E_UNAUTHORIZED`` (raised as ``ResponseError``); without a
   configured secret we raise ``E_AUTH_FIRST`` ourselves, the code nsqd would answer the
   first SUB or PUB with.

Each step whose answer may be followed by differently encoded bytes is sent with
``hold=True`` (see ``pynsqd.client.connection``) and the protocol resumes with the new codec.

This is the one place where socket and TLS errors (``OSError``, ``ssl.SSLError``, handshake
timeouts) become ``ConnectError`` / ``NSQTimeoutError``, with ``raise … from exc``.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from typing import Any

import orjson

from pynsqd.client.config import Features
from pynsqd.client.connection import NSQProtocol
from pynsqd.client.errors import (
    ConnectError,
    ConnectionClosedError,
    NSQTimeoutError,
    ProtocolViolationError,
    ResponseError,
)
from pynsqd.wire import MAGIC_V2
from pynsqd.wire.commands import encode_auth, encode_identify
from pynsqd.wire.compression import make_codec

NO_FEATURES = Features()


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``) → ``(host, port)``; raises ``ValueError``."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"invalid nsqd address {address!r}: expected host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


async def open_connection(address: str, identify: dict[str, Any], connect_timeout: float = 5.0,
                          features: Features = NO_FEATURES) -> tuple[NSQProtocol, dict[str, Any]]:
    """Connect to nsqd at ``address`` and negotiate (see the module docstring); return the
    protocol and nsqd's settings (the IDENTIFY JSON, or ``{}`` when nsqd answered ``OK``).

    Raises ``ConnectError`` (also a failed TLS handshake), ``NSQTimeoutError``,
    ``ResponseError`` (IDENTIFY or AUTH refused) or ``ProtocolViolationError`` (an answer
    that is not NSQ's).
    """
    host, port = split_address(address)
    loop = asyncio.get_running_loop()
    try:
        _, proto = await asyncio.wait_for(
            loop.create_connection(lambda: NSQProtocol(address), host, port), connect_timeout)
    except TimeoutError as exc:
        raise NSQTimeoutError(f"connect to {address} timed out after {connect_timeout}s") from exc
    except OSError as exc:
        raise ConnectError(f"connect to {address} failed: {exc.strerror or exc}") from exc
    sock = proto.transport.get_extra_info("socket") if proto.transport else None
    if sock is not None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
    try:
        settings = await _negotiate(proto, host, {**identify, **features.identify()}, connect_timeout, features)
    except BaseException:
        proto.abort()
        raise
    return proto, settings


async def _negotiate(proto: NSQProtocol, host: str, identify: dict[str, Any], wait: float,
                     features: Features) -> dict[str, Any]:
    address = proto.address
    upgrades = features.tls is not None or bool(features.compression)
    proto.send(MAGIC_V2)
    settings = _settings(await proto.command(encode_identify(orjson.dumps(identify)), wait, hold=upgrades),
                         address)
    compression = next((name for name in ("snappy", "deflate") if settings.get(name)), "")
    if compression and compression != features.compression:
        raise ProtocolViolationError(f"{address} enabled {compression} without being asked")
    if settings.get("tls_v1"):
        if features.tls is None:
            raise ProtocolViolationError(f"{address} upgraded to TLS without being asked")
        if proto.held_bytes:
            raise ProtocolViolationError(f"{address} sent data before the TLS handshake")
        proto.resume()
        ok = proto.expect(hold=bool(compression))  # nsqd may send it as soon as the handshake ends
        try:
            await _start_tls(proto, features.tls, features.server_name or host, wait)
        except BaseException:
            _discard(ok)
            raise
        try:
            reply = await proto.response(ok, wait)
        except ConnectionClosedError as exc:  # TLS 1.3: a refused client certificate shows here
            raise ConnectError(f"{address} closed the connection after the TLS handshake "
                               "(no client certificate, or one it does not accept?)") from exc
        _expect_ok(reply, address, "TLS")
    if compression:
        ok = proto.expect()
        proto.resume(make_codec(compression, int(settings.get("deflate_level") or features.deflate_level)))
        _expect_ok(await proto.response(ok, wait), address, compression)
    proto.resume()
    if settings.get("auth_required"):
        if not features.auth_secret:
            raise ResponseError("E_AUTH_FIRST", f"{address} requires AUTH and no auth_secret is configured")
        proto.auth = _json_object(await proto.command(encode_auth(features.auth_secret), wait),
                                  address, "AUTH")
    return settings


def _discard(fut: asyncio.Future[bytes]) -> None:
    """Forget a response we will no longer wait for (its error, if any, was reported)."""
    if fut.done():
        if not fut.cancelled():
            fut.exception()
    else:
        fut.cancel()


async def _start_tls(proto: NSQProtocol, ctx: ssl.SSLContext, server_name: str, wait: float) -> None:
    """Run the client side of the TLS handshake on ``proto``'s socket."""
    loop = asyncio.get_running_loop()
    transport = proto.transport
    if transport is None:
        raise _proto_closed(proto)
    proto.hold_output = True
    try:
        new = await loop.start_tls(transport, proto, ctx, server_hostname=server_name,
                                   ssl_handshake_timeout=wait)
    except TimeoutError as exc:
        raise NSQTimeoutError(f"TLS handshake with {proto.address} timed out after {wait}s") from exc
    except OSError as exc:  # ssl.SSLError included
        raise ConnectError(f"TLS handshake with {proto.address} failed: {exc}") from exc
    finally:
        proto.hold_output = False
    if new is None:
        raise _proto_closed(proto)
    proto.use_transport(new)


def _proto_closed(proto: NSQProtocol) -> ConnectError:
    return ConnectError(f"connection to {proto.address} closed during the TLS handshake")


def _settings(reply: bytes, address: str) -> dict[str, Any]:
    if reply == b"OK":
        return {}
    return _json_object(reply, address, "IDENTIFY")


def _json_object(reply: bytes, address: str, what: str) -> dict[str, Any]:
    try:
        value = orjson.loads(reply)
    except orjson.JSONDecodeError as exc:
        raise ProtocolViolationError(f"{what} reply from {address} is not JSON: {reply[:80]!r}") from exc
    if not isinstance(value, dict):
        raise ProtocolViolationError(f"{what} reply from {address} is not a JSON object")
    return value


def _expect_ok(reply: bytes, address: str, what: str) -> None:
    if reply != b"OK":
        raise ProtocolViolationError(f"expected OK after the {what} upgrade from {address}, got {reply[:80]!r}")
