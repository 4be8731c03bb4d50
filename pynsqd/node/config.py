"""nsqd's options: every flag of NSQ v1.3's nsqd, by its name, default and config key.

The dataclass below is the single declaration; ``pynsqd.options`` turns it into the
command-line parser and the TOML reader. Durations are nanoseconds (Go's ``time.Duration``).
``check_supported`` refuses, at start, values this build cannot honour yet: a flag that is
accepted but silently ignored would be worse than an error.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import socket
import zlib
from collections.abc import Callable, Sequence

from pynsqd.options import HOUR, MINUTE, MS, SECOND, UsageError, flag, parse_bool, resolve
from pynsqd.shared_flags import LOG_LEVELS, non_negative, positive


def default_node_id() -> int:
    """NSQ's default: crc32 of the md5 of the hostname, modulo 1024."""
    digest = hashlib.md5(socket.gethostname().encode()).digest()
    return zlib.crc32(digest) % 1024


def _one_of(*allowed: str) -> Callable[[str], str | None]:
    def check(value: str) -> str | None:
        return None if value in allowed else f"must be one of {', '.join(allowed)}"
    return check


def _lower(raw: object) -> str:
    """nsqd lower-cases --log-level and --tls-min-version (``strings.ToLower``)."""
    if not isinstance(raw, str):
        raise ValueError(f"expected a string, got {raw!r}")
    return raw.lower()


def _tls_required(raw: object) -> str:
    """nsqd's ``tlsRequiredOption``: ``tcp-https`` or any Go boolean, any case; the config
    file may give a TOML boolean. Normalized to ``true``, ``false`` or ``tcp-https``."""
    if isinstance(raw, bool):
        return "true" if raw else "false"
    text = str(raw).lower()
    if text == "tcp-https":
        return text
    return "true" if parse_bool(text) else "false"


@dataclasses.dataclass
class NsqdOptions:
    """The options of one nsqd node, as NSQ v1.3 names them (NSQ's ``apps/nsqd/options.go``)."""

    log_level: str = flag("log-level", "info", "set log verbosity: debug, info, warn, error, or fatal",
                          validate=_one_of(*LOG_LEVELS), parse=_lower)
    log_prefix: str = flag("log-prefix", "[nsqd] ", "log message prefix")
    verbose: bool = flag("verbose", False, "[deprecated] has no effect, use --log-level")
    node_id: int = flag("node-id", -1, "unique part for message IDs, (int) in range [0,1024) "
                        "(default is hash of hostname)", cfg="id")
    worker_id: bool = flag("worker-id", False, "[deprecated] use --node-id")

    https_address: str = flag("https-address", "0.0.0.0:4152",
                              "<addr>:<port> to listen on for HTTPS clients")
    http_address: str = flag("http-address", "0.0.0.0:4151", "<addr>:<port> to listen on for HTTP clients")
    tcp_address: str = flag("tcp-address", "0.0.0.0:4150", "<addr>:<port> to listen on for TCP clients")
    auth_http_address: list[str] = flag("auth-http-address", [], "<addr>:<port> or a full url to query "
                                        "auth server", kind="strlist", cfg="auth_http_addresses")
    auth_http_request_method: str = flag("auth-http-request-method", "get", "HTTP method to use for auth "
                                         "server requests", validate=_one_of("get", "post"))
    broadcast_address: str = flag("broadcast-address", "", "address that will be registered with "
                                  "lookupd (defaults to the OS hostname)")
    broadcast_tcp_port: int = flag("broadcast-tcp-port", 0, "TCP port that will be registered with "
                                   "lookupd (defaults to the TCP port that this nsqd is listening on)")
    broadcast_http_port: int = flag("broadcast-http-port", 0, "HTTP port that will be registered with "
                                    "lookupd (defaults to the HTTP port that this nsqd is listening on)")
    lookupd_tcp_address: list[str] = flag("lookupd-tcp-address", [], "lookupd TCP address",
                                          kind="strlist", cfg="nsqlookupd_tcp_addresses")
    http_client_connect_timeout: int = flag("http-client-connect-timeout", 2 * SECOND,
                                            "timeout for HTTP connect", kind="duration")
    http_client_request_timeout: int = flag("http-client-request-timeout", 5 * SECOND,
                                            "timeout for HTTP request", kind="duration")
    topology_region: str = flag("topology-region", "", "region for topology-aware consumption")
    topology_zone: str = flag("topology-zone", "", "zone for topology-aware consumption")

    data_path: str = flag("data-path", "", "path to store disk-backed messages")
    mem_queue_size: int = flag("mem-queue-size", 10000, "number of messages to keep in memory "
                               "(per topic/channel)", validate=non_negative)
    mem_queue_bytes: int = flag("mem-queue-bytes", 0, "(pynsqd) if set, the bytes of shared memory "
                                "of each topic/channel log, an extra bound on --mem-queue-size (raised to "
                                "hold two --max-msg-size messages); default: each log grows to hold "
                                "--mem-queue-size messages, within what /dev/shm and memory have",
                                validate=non_negative)
    max_bytes_per_file: int = flag("max-bytes-per-file", 104857600, "number of bytes per diskqueue "
                                   "file before rolling", validate=positive)
    sync_every: int = flag("sync-every", 2500, "number of messages per diskqueue fsync",
                           validate=positive)
    sync_timeout: int = flag("sync-timeout", 2 * SECOND, "duration of time per diskqueue fsync",
                             kind="duration", validate=positive)
    queue_scan_worker_pool_max: int = flag("queue-scan-worker-pool-max", 4, "max concurrency "
                                           "for checking in-flight and deferred message timeouts")
    queue_scan_selection_count: int = flag("queue-scan-selection-count", 20, "number of channels "
                                           "to check per cycle (every 100ms) for in-flight and "
                                           "deferred timeouts")

    msg_timeout: int = flag("msg-timeout", 60 * SECOND, "default duration to wait before auto-requeing "
                            "a message", kind="duration", validate=positive)
    max_msg_timeout: int = flag("max-msg-timeout", 15 * MINUTE, "maximum duration before a message "
                                "will timeout", kind="duration", validate=positive)
    max_msg_size: int = flag("max-msg-size", 1048576, "maximum size of a single message in bytes",
                             validate=positive)
    max_req_timeout: int = flag("max-req-timeout", 1 * HOUR, "maximum requeuing timeout for a message",
                                kind="duration", validate=non_negative)
    max_body_size: int = flag("max-body-size", 5242880, "maximum size of a single command body",
                              validate=positive)

    max_heartbeat_interval: int = flag("max-heartbeat-interval", 60 * SECOND, "maximum client "
                                       "configurable duration of time between client heartbeats",
                                       kind="duration", validate=positive)
    max_rdy_count: int = flag("max-rdy-count", 2500, "maximum RDY count for a client",
                              validate=non_negative)
    max_output_buffer_size: int = flag("max-output-buffer-size", 65536, "maximum client configurable "
                                       "size (in bytes) for a client output buffer", validate=positive)
    max_output_buffer_timeout: int = flag("max-output-buffer-timeout", 30 * SECOND, "maximum client "
                                          "configurable duration of time between flushing to a client",
                                          kind="duration")
    min_output_buffer_timeout: int = flag("min-output-buffer-timeout", 25 * MS, "minimum client "
                                          "configurable duration of time between flushing to a client",
                                          kind="duration")
    output_buffer_timeout: int = flag("output-buffer-timeout", 250 * MS, "default duration of time "
                                      "between flushing data to clients", kind="duration")
    max_channel_consumers: int = flag("max-channel-consumers", 0, "maximum channel consumer "
                                      "connection count per nsqd instance (default 0, i.e., unlimited)",
                                      validate=non_negative)

    statsd_address: str = flag("statsd-address", "",
                               "UDP <addr>:<port> of a statsd daemon for pushing stats")
    statsd_interval: int = flag("statsd-interval", 60 * SECOND, "duration between pushing to statsd",
                                kind="duration")
    statsd_mem_stats: bool = flag("statsd-mem-stats", True, "toggle sending memory and GC stats to statsd")
    statsd_prefix: str = flag("statsd-prefix", "nsq.%s", "prefix used for keys sent to statsd "
                              "(%s for host replacement)")
    statsd_udp_packet_size: int = flag("statsd-udp-packet-size", 508,
                                       "the size in bytes of statsd UDP packets")
    statsd_exclude_ephemeral: bool = flag("statsd-exclude-ephemeral", False, "omit ephemeral topics "
                                          "and channels from statsd metrics")

    e2e_processing_latency_percentile: list[float] = flag(
        "e2e-processing-latency-percentile", [], "message processing time percentiles (as float "
        "(0, 1.0]) to track", kind="floatlist", cfg="e2e_processing_latency_percentiles")
    e2e_processing_latency_window_time: int = flag(
        "e2e-processing-latency-window-time", 10 * MINUTE, "calculate end to end latency quantiles "
        "for this duration of time", kind="duration")

    tls_cert: str = flag("tls-cert", "", "path to certificate file")
    tls_key: str = flag("tls-key", "", "path to key file")
    tls_client_auth_policy: str = flag("tls-client-auth-policy", "", "client certificate auth policy "
                                       "('require' or 'require-verify')",
                                       validate=_one_of("", "require", "require-verify"))
    tls_root_ca_file: str = flag("tls-root-ca-file", "", "path to certificate authority file")
    tls_required: str = flag("tls-required", "false", "require TLS for client connections "
                             "(true, false, tcp-https)", validate=_one_of("true", "false", "tcp-https"),
                             parse=_tls_required, bare="true")
    tls_min_version: str = flag("tls-min-version", "tls1.0", "minimum SSL/TLS version acceptable "
                                "('tls1.0', 'tls1.1', 'tls1.2' or 'tls1.3')",
                                validate=_one_of("", "tls1.0", "tls1.1", "tls1.2", "tls1.3"),
                                parse=_lower)
    deflate: bool = flag("deflate", True, "enable deflate feature negotiation (client compression)")
    max_deflate_level: int = flag("max-deflate-level", 6, "max deflate compression level a client "
                                  "can negotiate (> values == > nsqd CPU usage)")
    snappy: bool = flag("snappy", True, "enable snappy feature negotiation (client compression)")
    shards: int = flag("shards", os.cpu_count() or 1, "number of shard processes (pynsqd; "
                       "default: the number of CPUs)", validate=positive)
    enable_experiment: list[str] = flag("enable-experiment", [], "enable experimental feature "
                                        "(topology-aware-consumption)", kind="strlist")

    def __post_init__(self) -> None:
        if self.node_id == -1:
            self.node_id = default_node_id()
        if not self.broadcast_address:
            self.broadcast_address = socket.gethostname()
        if self.tls_client_auth_policy:
            self.tls_required = "true"

    # --- derived values, in the units the protocol code wants --------------------------------
    @property
    def data_dir(self) -> str:
        """The data path, or the working directory when unset (as nsqd does)."""
        return self.data_path or os.getcwd()


def check_supported(opts: NsqdOptions) -> None:
    """Refuse, at start, settings NSQ accepts but this build would silently not honour, and
    settings NSQ itself refuses at start. Raises ``UsageError``."""
    if not 0 <= opts.node_id < 1024:
        raise UsageError(f"--node-id must be [0,1024) (got {opts.node_id})")
    if not 1 <= opts.max_deflate_level <= 9:
        raise UsageError("--max-deflate-level must be [1,9]")
    for p in opts.e2e_processing_latency_percentile:
        if not 0 < p <= 1:
            raise UsageError(f"invalid E2E processing latency percentile: {p}")
    for exp in opts.enable_experiment:
        if exp != "topology-aware-consumption":
            raise UsageError(f"invalid experiment {exp!r}")
    if opts.tls_required != "false" and not (opts.tls_cert and opts.tls_key):
        raise UsageError("cannot require TLS client connections without TLS key and cert")
    if bool(opts.tls_cert) != bool(opts.tls_key):
        raise UsageError("--tls-cert and --tls-key must be given together")
    not_yet = {
        "--enable-experiment": bool(opts.enable_experiment),
    }
    for what, is_set in not_yet.items():
        if is_set:
            raise UsageError(f"{what} is not supported by this build of pynsqd yet")


def parse_args(argv: Sequence[str], prog: str = "nsqd") -> tuple[NsqdOptions, bool]:
    """Parse an nsqd command line. Raises ``UsageError``."""
    opts, version = resolve(NsqdOptions, argv, prog, "pynsqd: an nsqd node")
    if not version:
        check_supported(opts)
    return opts, version
