"""nsqlookupd's options: every flag of NSQ v1.3's nsqlookupd, by name, default and config key.

Durations are nanoseconds (Go's ``time.Duration``). ``parse_args`` also checks the listen
addresses, so a bad one is a one-line usage error rather than a failure at bind time.
"""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Sequence

from pynsqd.netaddr import split_host_port
from pynsqd.options import SECOND, flag, resolve
from pynsqd.shared_flags import DaemonLogFlags, log_prefix_flag, non_negative, positive


@dataclasses.dataclass
class LookupdOptions(DaemonLogFlags):
    """The options of one nsqlookupd, as NSQ v1.3 names them (NSQ's ``apps/nsqlookupd/main.go``)."""

    log_prefix: str = log_prefix_flag("nsqlookupd")

    tcp_address: str = flag("tcp-address", "0.0.0.0:4160", "<addr>:<port> to listen on for TCP clients")
    http_address: str = flag("http-address", "0.0.0.0:4161", "<addr>:<port> to listen on for HTTP clients")
    broadcast_address: str = flag("broadcast-address", socket.gethostname(),
                                  "address of this lookupd node, (default to the OS hostname)")

    inactive_producer_timeout: int = flag(
        "inactive-producer-timeout", 300 * SECOND,
        "duration of time a producer will remain in the active list since its last ping",
        kind="duration", validate=positive)
    tombstone_lifetime: int = flag(
        "tombstone-lifetime", 45 * SECOND,
        "duration of time a producer will remain tombstoned if registration remains",
        kind="duration", validate=non_negative)


def parse_args(argv: Sequence[str], prog: str = "nsqlookupd") -> tuple[LookupdOptions, bool]:
    """Parse an nsqlookupd command line (and its ``--config`` file). Raises ``UsageError``."""
    opts, version = resolve(LookupdOptions, argv, prog, "pynsqd: an nsqlookupd discovery node")
    opts.log_level = opts.log_level.lower()
    split_host_port(opts.tcp_address, "tcp-address")
    split_host_port(opts.http_address, "http-address")
    return opts, version
