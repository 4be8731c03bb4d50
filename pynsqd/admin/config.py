"""nsqadmin's options: every flag of NSQ v1.3's nsqadmin, by name, default and config key.

Durations are nanoseconds (Go's ``time.Duration``). ``parse_args`` checks what nsqadmin
checks at start: exactly one kind of upstream address, a TLS cert only with its key, a
parseable CIDR and graphite URL, a listen address; ``--base-path`` is normalised as NSQ does
(leading ``/``, cleaned). One flag is pynsqd's own: ``--stats-sample-interval``, how often
nsqadmin samples every producer's ``/stats`` for its message-rate graphs.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import posixpath
from collections.abc import Sequence
from urllib.parse import urlsplit

from pynsqd.netaddr import split_host_port
from pynsqd.options import MS, SECOND, UsageError, flag, resolve
from pynsqd.shared_flags import (
    DaemonLogFlags,
    http_connect_timeout_flag,
    http_request_timeout_flag,
    log_prefix_flag,
    positive,
    require_one_source,
)


def _at_least_100ms(value: int) -> str | None:
    return None if value >= 100 * MS else "must be at least 100ms"


@dataclasses.dataclass
class AdminOptions(DaemonLogFlags):
    """The options of one nsqadmin, as NSQ v1.3 names them (NSQ's ``apps/nsqadmin/main.go``)."""

    log_prefix: str = log_prefix_flag("nsqadmin")

    http_address: str = flag("http-address", "0.0.0.0:4171", "<addr>:<port> to listen on for HTTP clients")
    base_path: str = flag("base-path", "/", "URL base path")
    dev_static_dir: str = flag("dev-static-dir", "", "(development use only)")

    graphite_url: str = flag("graphite-url", "", "graphite HTTP address")
    proxy_graphite: bool = flag("proxy-graphite", False, "proxy HTTP requests to graphite")
    statsd_counter_format: str = flag("statsd-counter-format", "stats.counters.%s.count",
                                      "The counter stats key formatting applied by the implementation of statsd. "
                                      "If no formatting is desired, set this to an empty string.")
    statsd_gauge_format: str = flag("statsd-gauge-format", "stats.gauges.%s",
                                    "The gauge stats key formatting applied by the implementation of statsd. "
                                    "If no formatting is desired, set this to an empty string.")
    statsd_prefix: str = flag("statsd-prefix", "nsq.%s",
                              "prefix used for keys sent to statsd (%s for host replacement, must match nsqd)")
    statsd_interval: int = flag("statsd-interval", 60 * SECOND,
                                "time interval nsqd is configured to push to statsd (must match nsqd)",
                                kind="duration", validate=positive)

    notification_http_endpoint: str = flag("notification-http-endpoint", "",
                                           "HTTP endpoint (fully qualified) to which POST notifications of admin "
                                           "actions will be sent")

    http_client_connect_timeout: int = http_connect_timeout_flag(checked=True)
    http_client_request_timeout: int = http_request_timeout_flag(checked=True)
    http_client_tls_insecure_skip_verify: bool = flag(
        "http-client-tls-insecure-skip-verify", False, "configure the HTTP client to skip verification of TLS "
        "certificates")
    http_client_tls_root_ca_file: str = flag("http-client-tls-root-ca-file", "",
                                             "path to CA file for the HTTP client")
    http_client_tls_cert: str = flag("http-client-tls-cert", "", "path to certificate file for the HTTP client")
    http_client_tls_key: str = flag("http-client-tls-key", "", "path to key file for the HTTP client")

    allow_config_from_cidr: str = flag("allow-config-from-cidr", "127.0.0.1/8",
                                       "A CIDR from which to allow HTTP requests to the /config endpoint")
    acl_http_header: str = flag("acl-http-header", "X-Forwarded-User",
                                "HTTP header to check for authenticated admin users")

    lookupd_http_addresses: list[str] = flag("lookupd-http-address", [], "lookupd HTTP address (may be given "
                                             "multiple times)", kind="strlist", cfg="nsqlookupd_http_addresses")
    nsqd_http_addresses: list[str] = flag("nsqd-http-address", [], "nsqd HTTP address (may be given multiple "
                                          "times)", kind="strlist", cfg="nsqd_http_addresses")
    admin_users: list[str] = flag("admin-user", [], "admin user (may be given multiple times; if specified, "
                                  "only these users will be able to perform privileged actions)",
                                  kind="strlist", cfg="admin_users")

    stats_sample_interval: int = flag("stats-sample-interval", 2 * SECOND,
                                      "(pynsqd) how often to sample every producer's /stats for the rate graphs",
                                      kind="duration", validate=_at_least_100ms)


def normalize_base_path(path: str) -> str:
    """NSQ's ``normalizeBasePath``: a leading ``/``, cleaned (no trailing ``/`` but the root)."""
    if not path:
        return "/"
    if not path.startswith("/"):
        path = "/" + path
    return posixpath.normpath(path).replace("//", "/")


def parse_args(argv: Sequence[str], prog: str = "nsqadmin") -> tuple[AdminOptions, bool]:
    """Parse an nsqadmin command line (and its ``--config`` file). Raises ``UsageError``."""
    opts, version = resolve(AdminOptions, argv, prog, "pynsqd: nsqadmin, the cluster's web UI")
    if version:
        return opts, version
    opts.log_level = opts.log_level.lower()
    split_host_port(opts.http_address, "http-address")
    opts.base_path = normalize_base_path(opts.base_path)
    require_one_source("nsqd-http-address", opts.nsqd_http_addresses, opts.lookupd_http_addresses)
    for address in opts.nsqd_http_addresses:
        if "://" not in address:
            split_host_port(address, "nsqd-http-address")
    for address in opts.lookupd_http_addresses:
        if "://" not in address:
            split_host_port(address, "lookupd-http-address")
    if bool(opts.http_client_tls_cert) != bool(opts.http_client_tls_key):
        raise UsageError("--http-client-tls-cert and --http-client-tls-key must both be set or neither")
    if opts.allow_config_from_cidr:
        try:
            ipaddress.ip_network(opts.allow_config_from_cidr, strict=False)
        except ValueError:
            raise UsageError(f"failed to parse --allow-config-from-cidr {opts.allow_config_from_cidr!r}") from None
    if opts.graphite_url:
        parts = urlsplit(opts.graphite_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise UsageError(f"failed to parse --graphite-url {opts.graphite_url!r}")
        opts.graphite_url = opts.graphite_url.rstrip("/")
    if opts.proxy_graphite and not opts.graphite_url:
        raise UsageError("--proxy-graphite needs --graphite-url")
    for name in ("http_client_tls_root_ca_file", "http_client_tls_cert", "http_client_tls_key"):
        path = getattr(opts, name)
        if path:
            try:
                with open(path, "rb"):
                    pass
            except OSError as exc:
                raise UsageError(f"--{name.replace('_', '-')} {path}: {exc.strerror}") from None
    return opts, version
