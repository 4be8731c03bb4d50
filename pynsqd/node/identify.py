"""IDENTIFY: validate a client's requested settings against nsqd's options, with no I/O.

``negotiate(body, opts, current)`` returns the client's new ``Settings`` and the response
payload (``b"OK"`` or the JSON nsqd sends when ``feature_negotiation`` is true), or raises
``ProtocolError`` with nsqd's exact text. Checks run in nsqd's order: heartbeat interval,
output buffer timeout, output buffer size, sample rate, msg timeout; then the compression
choice. Values of the wrong JSON type fail as a JSON decode error, as Go's decoder does.

With ``feature_negotiation`` the response also settles the upgrades, as nsqd does: TLS
when the server has a certificate and the client asks (``tls_v1``), snappy or deflate when
enabled by ``--snappy``/``--deflate`` and asked for (both at once is
``E_IDENTIFY_FAILED``), the deflate level (client's, else 6, capped by
``--max-deflate-level``) and ``auth_required`` (``--auth-http-address`` given). The new
``Settings`` say which upgrades to run (``upgrade_tls``, ``compression``); the connection
runs them after writing the response (``pynsqd.shard.transport``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson

from pynsqd import NSQ_VERSION
from pynsqd.node.config import NsqdOptions
from pynsqd.options import MS
from pynsqd.wire.errors import ProtocolError

_STRINGS = ("client_id", "hostname", "user_agent", "topology_region", "topology_zone")
_INTS = ("heartbeat_interval", "output_buffer_size", "output_buffer_timeout", "deflate_level",
         "sample_rate", "msg_timeout")
_BOOLS = ("feature_negotiation", "tls_v1", "deflate", "snappy")

DEFAULT_OUTPUT_BUFFER_SIZE = 16 * 1024
CLIENT_TIMEOUT = 60_000 * MS  # nsqd's fixed ClientTimeout; the default heartbeat is half of it


@dataclasses.dataclass
class Settings:
    """What a connection has negotiated; all durations in nanoseconds (0 = disabled)."""

    client_id: str
    hostname: str
    user_agent: str = ""
    heartbeat_interval: int = CLIENT_TIMEOUT // 2
    output_buffer_size: int = DEFAULT_OUTPUT_BUFFER_SIZE
    output_buffer_timeout: int = 250 * MS
    sample_rate: int = 0
    msg_timeout: int = 60_000 * MS
    identified: bool = False
    upgrade_tls: bool = False  # negotiated by the last IDENTIFY, not yet run
    compression: str = ""  # "snappy" or "deflate", negotiated by the last IDENTIFY
    deflate_level: int = 0

    @classmethod
    def defaults(cls, opts: NsqdOptions, remote_host: str) -> Settings:
        """A connection's settings before (or without) IDENTIFY."""
        return cls(client_id=remote_host, hostname=remote_host,
                   output_buffer_timeout=opts.output_buffer_timeout, msg_timeout=opts.msg_timeout)


def _decode(body: bytes) -> dict[str, Any]:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        data = None
    if not isinstance(data, dict):
        raise ProtocolError("E_BAD_BODY", "IDENTIFY failed to decode JSON body")
    for key in _STRINGS:
        if key in data and data[key] is not None and not isinstance(data[key], str):
            raise ProtocolError("E_BAD_BODY", "IDENTIFY failed to decode JSON body")
    for key in _INTS:
        value = data.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not -(1 << 63) <= value < 1 << 63):
            raise ProtocolError("E_BAD_BODY", "IDENTIFY failed to decode JSON body")
    for key in _BOOLS:
        if key in data and data[key] is not None and not isinstance(data[key], bool):
            raise ProtocolError("E_BAD_BODY", "IDENTIFY failed to decode JSON body")
    return data


def negotiate(body: bytes, opts: NsqdOptions, current: Settings) -> tuple[Settings, bytes]:
    """Apply an IDENTIFY body to ``current``. Raises ``ProtocolError`` (fatal)."""
    data = _decode(body)
    new = dataclasses.replace(current, identified=True, upgrade_tls=False, compression="")
    new.client_id = data.get("client_id") or ""
    new.hostname = data.get("hostname") or ""
    new.user_agent = data.get("user_agent") or ""

    hb = data.get("heartbeat_interval") or 0
    if hb == -1:
        new.heartbeat_interval = 0
    elif hb != 0:
        if not 1000 <= hb <= opts.max_heartbeat_interval // MS:
            raise ProtocolError("E_BAD_BODY", f"IDENTIFY heartbeat interval ({hb}) is invalid")
        new.heartbeat_interval = hb * MS

    timeout = data.get("output_buffer_timeout") or 0
    size = data.get("output_buffer_size") or 0
    if timeout == -1:
        new.output_buffer_timeout = 0
    elif timeout != 0:
        if not opts.min_output_buffer_timeout // MS <= timeout <= opts.max_output_buffer_timeout // MS:
            raise ProtocolError("E_BAD_BODY", f"IDENTIFY output buffer timeout ({timeout}) is invalid")
        new.output_buffer_timeout = timeout * MS
    if size == -1:
        new.output_buffer_size = 1
        new.output_buffer_timeout = 0
    elif size != 0:
        if not 64 <= size <= opts.max_output_buffer_size:
            raise ProtocolError("E_BAD_BODY", f"IDENTIFY output buffer size ({size}) is invalid")
        new.output_buffer_size = size

    rate = data.get("sample_rate") or 0
    if not 0 <= rate <= 99:
        raise ProtocolError("E_BAD_BODY", f"IDENTIFY sample rate ({rate}) is invalid")
    new.sample_rate = rate

    msg_timeout = data.get("msg_timeout") or 0
    if msg_timeout != 0:
        if not 1000 <= msg_timeout <= opts.max_msg_timeout // MS:
            raise ProtocolError("E_BAD_BODY", f"IDENTIFY msg timeout ({msg_timeout}) is invalid")
        new.msg_timeout = msg_timeout * MS

    if not data.get("feature_negotiation"):
        return new, b"OK"
    tls_v1 = bool(opts.tls_cert and opts.tls_key) and bool(data.get("tls_v1"))
    deflate = opts.deflate and bool(data.get("deflate"))
    deflate_level = 6
    if deflate and (data.get("deflate_level") or 0) > 0:
        deflate_level = data["deflate_level"]
    deflate_level = min(deflate_level, opts.max_deflate_level)
    snappy = opts.snappy and bool(data.get("snappy"))
    if deflate and snappy:
        raise ProtocolError("E_IDENTIFY_FAILED", "cannot enable both deflate and snappy compression")
    new.upgrade_tls = tls_v1
    new.compression = "snappy" if snappy else "deflate" if deflate else ""
    new.deflate_level = deflate_level if deflate else 0
    response = {
        "max_rdy_count": opts.max_rdy_count,
        "version": NSQ_VERSION,
        "max_msg_timeout": opts.max_msg_timeout // MS,
        "msg_timeout": new.msg_timeout // MS,
        "tls_v1": tls_v1,
        "deflate": deflate,
        "deflate_level": deflate_level,
        "max_deflate_level": opts.max_deflate_level,
        "snappy": snappy,
        "sample_rate": new.sample_rate,
        "auth_required": bool(opts.auth_http_address),
        "output_buffer_size": new.output_buffer_size,
        "output_buffer_timeout": new.output_buffer_timeout // MS,
    }
    return new, orjson.dumps(response)
