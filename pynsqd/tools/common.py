"""What the utilities share: consumer flags, ``--consumer-opt``, the command and its run loop.

A utility is one ``Tool``: its name, options dataclass, start-up checks and body. ``Tool.run``
parses the flags (``--version`` prints the version), runs the checks (a ``UsageError`` is one
line on stderr and exit 1), sets up logging, and runs the body on uvloop with a stop event
that SIGINT/SIGTERM set; ``Tool.main`` is the console-script entry point.

``--consumer-opt name,value`` (and ``--producer-opt``) takes go-nsq ``Config`` option names
(go-nsq's ``config.go``) and maps them onto ``pynsqd.client.Consumer``/``Producer`` arguments, including
TLS (``tls_v1``, ``tls_root_ca_file``, ``tls_insecure_skip_verify``, ``tls_cert``, ``tls_key``,
``tls_min_version``), compression (``snappy``, ``deflate``, ``deflate_level``) and
``auth_secret``. A value that cannot be honoured (a CA file that cannot be read, snappy with
deflate) is a one-line usage error; go-nsq names without meaning here are accepted and ignored.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, NoReturn, TypeVar

import uvloop

from pynsqd import logs
from pynsqd.client.config import Features, Identity, TLSOptions
from pynsqd.client.consumer import Consumer
from pynsqd.client.message import Message
from pynsqd.client.producer import Producer
from pynsqd.options import MS, SECOND, UsageError, flag, parse_bool, parse_duration, resolve, run_cli, version_string
from pynsqd.shared_flags import positive, require_one_source
from pynsqd.signals import signals_to

log = logging.getLogger("pynsqd.tools")
T = TypeVar("T")
HandlerFn = Callable[[Message], None]


@dataclasses.dataclass
class ConsumerFlags:
    """The consumer flags every consuming utility takes."""

    channel: str = flag("channel", "", "nsq channel")
    nsqd_tcp_addresses: list[str] = flag("nsqd-tcp-address", [], "nsqd TCP address", kind="strlist")
    lookupd_http_addresses: list[str] = flag("lookupd-http-address", [], "lookupd HTTP address", kind="strlist")
    max_in_flight: int = flag("max-in-flight", 200, "max number of messages to allow in flight",
                              validate=positive)
    consumer_opts: list[str] = flag("consumer-opt", [], "option to passthrough to nsq.Consumer "
                                    "(go-nsq Config names, e.g. max_attempts,10)", kind="strlist",
                                    parse=lambda raw: whole_items(raw))

    def check_sources(self) -> None:
        require_one_source("nsqd-tcp-address", self.nsqd_tcp_addresses, self.lookupd_http_addresses)


def whole_items(raw: Any) -> list[str]:
    """A repeatable ``name,value`` flag: each value is one item (no comma splitting)."""
    if isinstance(raw, str):
        return [raw]
    if isinstance(raw, list) and all(isinstance(x, str) for x in raw):
        return list(raw)
    raise ValueError(f"expected a string or a list of strings, got {raw!r}")


def producer_opt_flag() -> Any:
    """``--producer-opt``, as nsq_to_nsq and to_nsq declare it."""
    return flag("producer-opt", [], "option to passthrough to nsq.Producer", kind="strlist",
                parse=whole_items)


def _seconds(raw: str) -> float:
    return parse_duration(raw) / SECOND


def _ms(raw: str) -> int:
    return parse_duration(raw) // MS


# go-nsq Config name → (Consumer/Identity argument, converter)
_CONSUMER_OPTS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "max_attempts": ("max_attempts", int),
    "max_in_flight": ("max_in_flight", int),
    "lookupd_poll_interval": ("lookupd_poll_interval", _seconds),
    "lookupd_poll_jitter": ("lookupd_poll_jitter", float),
    "default_requeue_delay": ("requeue_delay", _seconds),
    "max_requeue_delay": ("max_requeue_delay", _seconds),
    "backoff_multiplier": ("backoff_multiplier", _seconds),
    "max_backoff_duration": ("max_backoff_duration", _seconds),
    "low_rdy_idle_timeout": ("low_rdy_idle_timeout", _seconds),
    "rdy_redistribute_interval": ("rdy_redistribute_interval", _seconds),
    "dial_timeout": ("connect_timeout", _seconds),
    "heartbeat_interval": ("identity.heartbeat_interval", _ms),
    "output_buffer_size": ("identity.output_buffer_size", int),
    "output_buffer_timeout": ("identity.output_buffer_timeout", _ms),
    "msg_timeout": ("identity.msg_timeout", _ms),
    "sample_rate": ("identity.sample_rate", int),
    "client_id": ("identity.client_id", str),
    "hostname": ("identity.hostname", str),
    "user_agent": ("identity.user_agent", str),
    "tls_v1": ("tls_v1", parse_bool),
    "tls_root_ca_file": ("tls.root_ca_file", str),
    "tls_insecure_skip_verify": ("tls.insecure_skip_verify", parse_bool),
    "tls_cert": ("tls.cert", str),
    "tls_key": ("tls.key", str),
    "tls_min_version": ("tls.min_version", str),
    "snappy": ("snappy", parse_bool),
    "deflate": ("deflate", parse_bool),
    "deflate_level": ("deflate_level", int),
    "auth_secret": ("auth_secret", str),
}
_FEATURES = ("tls_v1", "tls_options", "snappy", "deflate", "deflate_level", "auth_secret")
PRODUCER_KEYS = frozenset({"identity", "connect_timeout", *_FEATURES})
_IGNORED = {"read_timeout", "write_timeout", "lookupd_poll_timeout", "max_msg_size",
            "skip_lookupd_authorization", "local_addr", "backoff_strategy", "low_rdy_timeout"}


def consumer_options(pairs: Sequence[str], flag_name: str = "consumer-opt") -> dict[str, Any]:
    """``["max_attempts,10", ...]`` → keyword arguments for ``Consumer``.

    Raises ``UsageError`` for a malformed pair, an unknown name, a bad value, or features
    that cannot be used together (checked as the client would: files are read here)."""
    kwargs: dict[str, Any] = {}
    identity, tls = Identity(), TLSOptions()
    for pair in pairs:
        name, sep, raw = pair.partition(",")
        name = name.strip()
        if not sep:
            raw = "true"
        if name in _IGNORED:
            continue
        target = _CONSUMER_OPTS.get(name)
        if target is None:
            raise UsageError(f"--{flag_name}: unknown option {name!r}")
        key, convert = target
        try:
            value = convert(raw)
        except ValueError as exc:
            raise UsageError(f"invalid value {raw!r} for --{flag_name} {name}: {exc}") from None
        if key.startswith("identity."):
            setattr(identity, key.split(".", 1)[1], value)
        elif key.startswith("tls."):
            setattr(tls, key.split(".", 1)[1], value)
            kwargs["tls_options"] = tls
        else:
            kwargs[key] = value
    kwargs["identity"] = identity
    try:
        Features.make(**{k: v for k, v in kwargs.items() if k in _FEATURES})
    except ValueError as exc:
        raise UsageError(f"--{flag_name}: {exc}") from None
    return kwargs


def producer_options(pairs: Sequence[str]) -> dict[str, Any]:
    """``--producer-opt`` pairs → keyword arguments for ``Producer`` (go-nsq's producer shares
    the consumer's ``Config``; options only a consumer uses are accepted and have no effect)."""
    kwargs = consumer_options(pairs, "producer-opt")
    return {k: v for k, v in kwargs.items() if k in PRODUCER_KEYS}


def producers_for(addresses: Sequence[str], producer_opts: Sequence[str]) -> dict[str, Producer]:
    """One ``Producer`` per nsqd address, with the ``--producer-opt`` settings (not connected)."""
    kwargs = producer_options(producer_opts)
    return {address: Producer(address, **kwargs) for address in addresses}


def consumers_for(topics: Sequence[str], flags: ConsumerFlags, handler_for: Callable[[str], Any],
                  kwargs: dict[str, Any]) -> list[Consumer]:
    """One ``Consumer`` per topic, on the flags' channel and sources."""
    kwargs = dict(kwargs)
    kwargs.setdefault("max_in_flight", flags.max_in_flight)
    return [Consumer(topic, flags.channel, handler_for(topic), nsqd_tcp_addresses=flags.nsqd_tcp_addresses,
                     lookupd_http_addresses=flags.lookupd_http_addresses, **kwargs) for topic in topics]


async def consume_until(stop: asyncio.Event, consumers: Sequence[Consumer]) -> None:
    """Start ``consumers``, wait for ``stop``, then stop them gracefully (all answered)."""
    for consumer in consumers:
        await consumer.start()
    await stop.wait()
    await asyncio.gather(*(c.stop() for c in consumers))


@dataclasses.dataclass(frozen=True)
class Tool(Generic[T]):
    """One utility: ``check`` raises ``UsageError`` for options it cannot run with; ``body``
    runs until done or until the stop event is set, and returns the exit status. Logs go to
    stderr prefixed ``[prog] `` at ``log_level``, unless ``setup_logs`` sets them up itself."""

    prog: str
    options: type[T]
    description: str
    check: Callable[[T], None]
    body: Callable[[T, asyncio.Event], Awaitable[int]]
    log_level: str = "info"
    setup_logs: Callable[[T], None] | None = None

    def run(self, argv: list[str]) -> int:
        opts, version = resolve(self.options, argv, self.prog, self.description)
        if version:
            print(version_string(self.prog))
            return 0
        self.check(opts)
        if self.setup_logs is not None:
            self.setup_logs(opts)
        else:
            logs.setup(f"[{self.prog}] ", self.log_level)
        return run(lambda stop: self.body(opts, stop))

    def main(self, argv: list[str] | None = None) -> NoReturn:
        """The console-script entry point (``argv`` defaults to ``sys.argv[1:]``)."""
        run_cli(self.run, self.prog, argv)


def setup_logging_prefix(prefix: str, level: str) -> None:
    if level.lower() not in logs.LEVELS:
        raise UsageError(f"invalid --log-level {level!r}")
    logs.setup(prefix, level.lower())


def run(main: Callable[[asyncio.Event], Awaitable[int]]) -> int:
    """Run ``main(stop)`` on uvloop; SIGINT/SIGTERM only set ``stop`` (the tool decides how
    to wind down). A second signal while stopping exits at once with status 130/143."""
    async def wrapper() -> int:
        stop = asyncio.Event()

        def on_signal(signum: int) -> None:
            if stop.is_set():
                sys.exit(128 + signum)
            log.info("got signal %s, stopping", signal.Signals(signum).name)
            stop.set()

        with signals_to(on_signal, (signal.SIGINT, signal.SIGTERM)):
            return await main(stop)

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(wrapper())
