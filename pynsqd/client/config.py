"""What the client tells nsqd in IDENTIFY, with go-nsq's defaults (NSQ-FACTS §8)."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any

from pynsqd import __version__


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
