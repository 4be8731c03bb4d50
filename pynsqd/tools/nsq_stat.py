"""``nsq_stat``: poll ``/stats`` of every nsqd that has a topic/channel and print NSQ's columns.

Producers come from ``--nsqd-http-address`` or from lookupd (``/lookup``, using each
producer's ``broadcast_address:http_port``). Each line sums the channel over all of them::

    ---------------depth---------------+--------------metadata---------------
      total    mem    disk inflt   def |     req     t-o         msgs clients

The header repeats every 25 lines, as NSQ's does. ``--count N`` stops after N lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import sys
from collections.abc import Iterable
from typing import Any, TextIO

import httpx
import orjson

from pynsqd.client import NSQError
from pynsqd.client import http as nsq_http
from pynsqd.options import SECOND, UsageError, flag
from pynsqd.shared_flags import http_connect_timeout_flag, http_request_timeout_flag, require_one_source
from pynsqd.tools import common

log = logging.getLogger("pynsqd.tools")
PROG = "nsq_stat"
HEADER = ("---------------depth---------------+--------------metadata---------------\n"
          "  total    mem    disk inflt   def |     req     t-o         msgs clients")
FIELDS = ("depth", "memory_depth", "backend_depth", "in_flight_count", "deferred_count",
          "requeue_count", "timeout_count", "message_count", "client_count")


@dataclasses.dataclass
class Options:
    topic: str = flag("topic", "", "NSQ topic")
    channel: str = flag("channel", "", "NSQ channel")
    interval: int = flag("interval", 2 * SECOND, "duration of time between polling/printing output",
                         kind="duration")
    count: int = flag("count", 0, "number of reports")
    nsqd_http_addresses: list[str] = flag("nsqd-http-address", [], "nsqd HTTP address", kind="strlist")
    lookupd_http_addresses: list[str] = flag("lookupd-http-address", [], "lookupd HTTP address",
                                             kind="strlist")
    http_client_connect_timeout: int = http_connect_timeout_flag()
    http_client_request_timeout: int = http_request_timeout_flag()


def format_row(totals: dict[str, int]) -> str:
    v = [totals[f] for f in FIELDS]
    return f"{v[0]:7d} {v[1]:6d} {v[2]:7d} {v[3]:5d} {v[4]:5d} | {v[5]:7d} {v[6]:7d} {v[7]:12d} {v[8]:7d}"


def channel_totals(stats: Iterable[Any], topic: str, channel: str) -> dict[str, int]:
    """Sum one channel's counters over several ``/stats?format=json`` answers."""
    totals = dict.fromkeys(FIELDS, 0)
    for data in stats:
        for t in (data or {}).get("topics") or []:
            if t.get("topic_name") != topic:
                continue
            for c in t.get("channels") or []:
                if c.get("channel_name") != channel:
                    continue
                for f in FIELDS:
                    if f != "memory_depth":
                        totals[f] += int(c.get(f) or 0)
                totals["memory_depth"] += int(c.get("depth") or 0) - int(c.get("backend_depth") or 0)
    return totals


async def producers(client: httpx.AsyncClient, opts: Options) -> list[str]:
    if opts.nsqd_http_addresses:
        return list(opts.nsqd_http_addresses)
    found: set[str] = set()
    for address in opts.lookupd_http_addresses:
        try:
            resp = await nsq_http.request(client, "GET", f"{nsq_http.base_url(address)}/lookup",
                                          params={"topic": opts.topic}, ok_statuses=(404,))
        except NSQError as exc:
            log.warning("lookupd %s: %s", address, exc)
            continue
        if resp.status_code == 404:
            continue
        data = orjson.loads(resp.content)
        for p in data.get("producers") or data.get("data", {}).get("producers") or []:
            host = p.get("broadcast_address")
            found.add(f"[{host}]:{p.get('http_port')}" if ":" in host else f"{host}:{p.get('http_port')}")
    return sorted(found)


async def poll(client: httpx.AsyncClient, address: str, opts: Options) -> Any:
    try:
        resp = await nsq_http.request(client, "GET", f"{nsq_http.base_url(address)}/stats",
                                      params={"format": "json", "topic": opts.topic, "channel": opts.channel})
        return orjson.loads(resp.content)
    except (NSQError, orjson.JSONDecodeError) as exc:
        log.warning("nsqd %s: %s", address, exc)
        return None


async def main_async(opts: Options, stop: asyncio.Event, out: TextIO) -> int:
    async with nsq_http.make_client(opts.http_client_connect_timeout / SECOND,
                                    opts.http_client_request_timeout / SECOND) as client:
        lines = 0
        while not stop.is_set():
            nodes = await producers(client, opts)
            answers = await asyncio.gather(*(poll(client, a, opts) for a in nodes))
            if lines % 25 == 0:
                print(HEADER, file=out)
            print(format_row(channel_totals(answers, opts.topic, opts.channel)), file=out, flush=True)
            lines += 1
            if opts.count and lines >= opts.count:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), opts.interval / SECOND)
    return 0


def check(opts: Options) -> None:
    if not opts.topic or not opts.channel:
        raise UsageError("--topic and --channel are required")
    require_one_source("nsqd-http-address", opts.nsqd_http_addresses, opts.lookupd_http_addresses)
    if opts.interval <= 0:
        raise UsageError("--interval must be greater than 0")
    if opts.count < 0:
        raise UsageError("--count must not be negative")


TOOL = common.Tool(PROG, Options, "poll /stats of every producer of a topic/channel", check,
                   lambda opts, stop: main_async(opts, stop, sys.stdout), log_level="warn")
run, main = TOOL.run, TOOL.main


if __name__ == "__main__":
    main()
