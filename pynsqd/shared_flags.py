"""Flags that several commands declare alike: the same NSQ flag, with the same meaning.

Each function returns a ``flag(...)`` field for an options dataclass (so the field keeps its
place in that command's ``--help``), with NSQ v1.3's name, default and help text; the
checks are the value validators those flags use. ``DaemonLogFlags`` is the logging trio
nsqlookupd and nsqadmin declare first. ``require_one_source`` is the start-up check of a
command that reads from nsqd or from nsqlookupd but not both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from pynsqd.options import SECOND, UsageError, flag

LOG_LEVELS = ("debug", "info", "warn", "error", "fatal")


def valid_log_level(value: str) -> str | None:
    return None if value.lower() in LOG_LEVELS else f"must be one of {', '.join(LOG_LEVELS)}"


def positive(value: int) -> str | None:
    return None if value > 0 else "must be greater than 0"


def non_negative(value: int) -> str | None:
    return None if value >= 0 else "must not be negative"


def log_level_flag(*, checked: bool = True) -> Any:
    """``--log-level`` (``checked``: an unknown level is refused when the flags are read)."""
    return flag("log-level", "info", "set log verbosity: debug, info, warn, error, or fatal",
                validate=valid_log_level if checked else None)


def log_prefix_flag(prog: str) -> Any:
    return flag("log-prefix", f"[{prog}] ", "log message prefix")


def verbose_flag() -> Any:
    return flag("verbose", False, "[deprecated] has no effect, use --log-level")


def http_connect_timeout_flag(*, checked: bool = False) -> Any:
    """``--http-client-connect-timeout`` (``checked``: must be greater than 0)."""
    return flag("http-client-connect-timeout", 2 * SECOND, "timeout for HTTP connect", kind="duration",
                validate=positive if checked else None)


def http_request_timeout_flag(default: int = 5 * SECOND, *, checked: bool = False) -> Any:
    """``--http-client-request-timeout`` (``checked``: must be greater than 0)."""
    return flag("http-client-request-timeout", default, "timeout for HTTP request", kind="duration",
                validate=positive if checked else None)


@dataclasses.dataclass
class DaemonLogFlags:
    """``--log-level``, ``--log-prefix``, ``--verbose``: the first flags of a daemon's options.

    A daemon's options subclass this and re-declare ``log_prefix`` with ``log_prefix_flag``
    for their own default (a re-declared field keeps its place, so ``--help`` lists the
    three first, in this order)."""

    log_level: str = log_level_flag()
    log_prefix: str = flag("log-prefix", "", "log message prefix")
    verbose: bool = verbose_flag()


def require_one_source(nsqd_flag: str, nsqd: Sequence[str], lookupd: Sequence[str]) -> None:
    """Exactly one of ``--<nsqd_flag>`` and ``--lookupd-http-address`` must be given."""
    if nsqd and lookupd:
        raise UsageError(f"use --{nsqd_flag} or --lookupd-http-address not both")
    if not nsqd and not lookupd:
        raise UsageError(f"--{nsqd_flag} or --lookupd-http-address required")
