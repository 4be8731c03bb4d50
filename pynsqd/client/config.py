"""What the client tells nsqd in IDENTIFY (go-nsq's defaults) and the features
it negotiates there: TLS, snappy or deflate, and the AUTH secret sent afterwards."""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass
from typing import Any

from pynsqd import __version__

_MIN_VERSIONS = {"tls1.0": ssl.TLSVersion.TLSv1, "tls1.1": ssl.TLSVersion.TLSv1_1,
                 "tls1.2": ssl.TLSVersion.TLSv1_2, "tls1.3": ssl.TLSVersion.TLSv1_3}


@dataclass
class Identity:
    """IDENTIFY fields. Durations are in milliseconds, as on the wire; 0 keeps nsqd's value."""

    client_id: str = ""
    hostname: str = ""
    user_agent: str = f"pynsqd.client/{__version__}"
    heartbeat_interval: int = 30_000
    output_buffer_size: int = 16384
    output_buffer_timeout: int = 250
    msg_timeout: int = 0
    sample_rate: int = 0

    def to_json(self) -> dict[str, Any]:
        host = self.hostname or socket.gethostname()
        return {
            "client_id": self.client_id or host.split(".")[0],
            "hostname": host,
            "user_agent": self.user_agent,
            "feature_negotiation": True,
            "heartbeat_interval": self.heartbeat_interval,
            "output_buffer_size": self.output_buffer_size,
            "output_buffer_timeout": self.output_buffer_timeout,
            "msg_timeout": self.msg_timeout,
            "sample_rate": self.sample_rate,
            "tls_v1": False,
            "snappy": False,
            "deflate": False,
        }


@dataclass
class TLSOptions:
    """go-nsq's ``tls_*`` options: how the client checks nsqd and proves who it is.

    ``root_ca_file``: CAs to trust (default: the system's); ``cert``/``key``: a client
    certificate (both or neither; one PEM holding both may be given as each);
    ``insecure_skip_verify``: accept any server certificate; ``min_version``: ``tls1.0`` …
    ``tls1.3`` ("" = the ssl module's default); ``server_name``: the name to verify (default:
    the host of the nsqd address, as go-nsq).
    """

    root_ca_file: str = ""
    cert: str = ""
    key: str = ""
    insecure_skip_verify: bool = False
    min_version: str = ""
    server_name: str = ""

    def context(self) -> ssl.SSLContext:
        """The client ``SSLContext``. Raises ``ValueError`` naming the option that is wrong."""
        if bool(self.cert) != bool(self.key):
            raise ValueError("tls_cert and tls_key must be given together")
        if self.min_version and self.min_version not in _MIN_VERSIONS:
            raise ValueError(f"invalid tls_min_version {self.min_version!r}: use tls1.0, tls1.1, tls1.2 or tls1.3")
        try:
            ctx = ssl.create_default_context(cafile=self.root_ca_file or None)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"tls_root_ca_file {self.root_ca_file!r}: {exc}") from None
        if self.cert:
            try:
                ctx.load_cert_chain(self.cert, self.key)
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(f"tls_cert/tls_key {self.cert!r}, {self.key!r}: {exc}") from None
        if self.insecure_skip_verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.min_version:
            ctx.minimum_version = _MIN_VERSIONS[self.min_version]
        return ctx


@dataclass(frozen=True)
class Features:
    """What a connection negotiates after IDENTIFY; built once per Producer/Consumer by
    ``Features.make`` from their keyword options (see the package docstring)."""

    tls: ssl.SSLContext | None = None
    server_name: str = ""
    compression: str = ""  # "", "snappy" or "deflate"
    deflate_level: int = 6
    auth_secret: bytes = b""

    @classmethod
    def make(cls, tls_v1: bool = False, tls_options: TLSOptions | ssl.SSLContext | None = None,
             snappy: bool = False, deflate: bool = False, deflate_level: int = 6,
             auth_secret: str | bytes = "") -> Features:
        """Validate the options; raises ``ValueError`` (both compressions, a bad level, TLS
        files that cannot be read)."""
        if snappy and deflate:
            raise ValueError("snappy and deflate cannot both be enabled")
        if not 1 <= deflate_level <= 9:
            raise ValueError(f"deflate_level must be in [1,9], got {deflate_level}")
        ctx: ssl.SSLContext | None = None
        server_name = ""
        if tls_v1:
            if isinstance(tls_options, ssl.SSLContext):
                ctx = tls_options
            else:
                options = tls_options or TLSOptions()
                ctx, server_name = options.context(), options.server_name
        secret = auth_secret.encode() if isinstance(auth_secret, str) else bytes(auth_secret)
        return cls(ctx, server_name, "snappy" if snappy else "deflate" if deflate else "",
                   deflate_level, secret)

    def identify(self) -> dict[str, Any]:
        """The IDENTIFY fields that ask for these features."""
        return {"tls_v1": self.tls is not None, "snappy": self.compression == "snappy",
                "deflate": self.compression == "deflate", "deflate_level": self.deflate_level}
