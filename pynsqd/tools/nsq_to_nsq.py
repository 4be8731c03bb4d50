"""``nsq_to_nsq``: consume topics and republish each message to destination nsqd over TCP.

A message is FINed only after a destination answered OK to its PUB; a failed publish REQs it
(with backoff), so nothing is lost when a destination is down. ``--require-json-field`` /
``--require-json-value`` drop (FIN without publishing) JSON messages that lack the field or
value; ``--whitelist-json-field`` republishes only the listed fields. SIGINT/SIGTERM: stop
consuming, wait for the publishes in flight, exit 0.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any

import orjson

from pynsqd.client import Message, NSQError, Producer
from pynsqd.options import UsageError, flag
from pynsqd.tools import common
from pynsqd.tools.upstream import MODES, Upstreams

log = logging.getLogger("pynsqd.tools")
PROG = "nsq_to_nsq"


@dataclasses.dataclass
class Options(common.ConsumerFlags):
    channel: str = flag("channel", "nsq_to_nsq", "nsq channel")
    topics: list[str] = flag("topic", [], "nsq topic", kind="strlist")
    destination_nsqd_tcp_addresses: list[str] = flag("destination-nsqd-tcp-address", [],
                                                     "destination nsqd TCP address", kind="strlist")
    destination_topic: str = flag("destination-topic", "", "use this destination topic for all consumed "
                                  "topics (default is consumed topic name)")
    producer_opts: list[str] = common.producer_opt_flag()
    mode: str = flag("mode", "hostpool", "the upstream request mode options: round-robin, hostpool (default), "
                     "epsilon-greedy")
    status_every: int = flag("status-every", 250, "the # of requests between logging status (per "
                             "destination), 0 disables")
    require_json_field: str = flag("require-json-field", "", "for JSON messages: only pass messages that "
                                   "contain this field")
    require_json_value: str = flag("require-json-value", "", "for JSON messages: only pass messages in "
                                   "which the required field has this value")
    whitelist_json_fields: list[str] = flag("whitelist-json-field", [], "for JSON messages: pass this field",
                                            kind="strlist")


def transform(body: bytes, opts: Options) -> bytes | None:
    """The body to republish, or None to drop the message (JSON filters)."""
    if not opts.require_json_field and not opts.whitelist_json_fields:
        return body
    try:
        data: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None if opts.require_json_field else body
    if not isinstance(data, dict):
        return None if opts.require_json_field else body
    if opts.require_json_field:
        if opts.require_json_field not in data:
            return None
        if opts.require_json_value and str(_plain(data[opts.require_json_field])) != opts.require_json_value:
            return None
    if opts.whitelist_json_fields:
        data = {k: data[k] for k in opts.whitelist_json_fields if k in data}
        return orjson.dumps(data)
    return body


def _plain(value: Any) -> Any:
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


class Republisher:
    def __init__(self, opts: Options, producers: dict[str, Producer]) -> None:
        self.opts = opts
        self.producers = producers
        self.upstreams = Upstreams(list(producers), opts.mode)
        self.counts = dict.fromkeys(producers, 0)

    def handler(self, topic: str) -> Any:
        destination = self.opts.destination_topic or topic

        async def handle(msg: Message) -> bool | None:
            body = transform(msg.body, self.opts)
            if body is None:
                return None  # filtered out: FIN
            ok = True
            for address in self.upstreams.pick(time.monotonic()):
                try:
                    await self.producers[address].publish(destination, body)
                except NSQError as exc:
                    log.warning("publish to %s failed: %s", address, exc)
                    self.upstreams.failure(address, time.monotonic())
                    ok = False
                    continue
                self.upstreams.success(address)
                self.counts[address] += 1
                every = self.opts.status_every
                if every and self.counts[address] % every == 0:
                    log.info("%s: %d messages republished", address, self.counts[address])
            return None if ok else False  # False: REQ with backoff
        return handle


async def main_async(opts: Options, stop: asyncio.Event) -> int:
    kwargs = common.consumer_options(opts.consumer_opts)
    producers = common.producers_for(opts.destination_nsqd_tcp_addresses, opts.producer_opts)
    repub = Republisher(opts, producers)
    await common.consume_until(stop, common.consumers_for(opts.topics, opts, repub.handler, kwargs))
    for p in producers.values():
        await p.close()
    log.info("stopped; republished %s", ", ".join(f"{a}={n}" for a, n in repub.counts.items()))
    return 0


def check(opts: Options) -> None:
    opts.check_sources()
    if not opts.topics:
        raise UsageError("--topic required")
    if not opts.destination_nsqd_tcp_addresses:
        raise UsageError("--destination-nsqd-tcp-address required")
    if opts.mode not in MODES:
        raise UsageError(f"invalid --mode {opts.mode!r}")
    if opts.require_json_value and not opts.require_json_field:
        raise UsageError("--require-json-value requires --require-json-field")


TOOL = common.Tool(PROG, Options, "consume topics and republish them to other nsqd", check, main_async)
run, main = TOOL.run, TOOL.main


if __name__ == "__main__":
    main()
