"""``nsq_stat``: poll ``/stats`` of every nsqd that has a topic/channel and print NSQ v1.3's columns.

Producers come from ``--nsqd-http-address`` (those that have the topic) or from lookupd
(``/lookup``, using each producer's ``broadcast_address:http_port``). Each line sums the
channel over all of them; the rates are the differences of ``message_count`` (ingress) and
of ``message_count`` minus ``depth`` (egress) since the previous poll, per second of
``--interval``, so the first poll prints only the header::

    ------rate------+----------------depth----------------+--------------metadata---------------
    ingress  egress |   total     mem    disk inflt   def |     req     t-o         msgs clients

The header repeats every 25 polls, as NSQ's does. ``--count N`` stops after N lines. As
NSQ's, it stops with an error (status 1) when a lookupd or nsqd cannot be asked, or no
producer has the channel.
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
HEADER = ("------rate------+----------------depth----------------+--------------metadata---------------\n"
          "ingress  egress |   total     mem    disk inflt   def |     req     t-o         msgs clients")
FIELDS = ("depth", "memory_depth", "backend_depth", "in_flight_count", "deferred_count",
          "requeue_count", "timeout_count", "message_count", "client_count")


class StatError(Exception):
    """nsq_stat cannot go on (NSQ's ``log.Fatalf``); the text says why."""


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


def format_row(totals: dict[str, int], before: dict[str, int], seconds: float) -> str:
    """One line: rates since ``before`` (``seconds`` apart, truncated as Go's ``int64()``),
    then the channel's figures."""
    ingress = int((totals["message_count"] - before["message_count"]) / seconds)
    egress = int((totals["message_count"] - before["message_count"] - (totals["depth"] - before["depth"])) / seconds)
    v = [totals[f] for f in FIELDS]
    return (f"{ingress:7d} {egress:7d} | {v[0]:7d} {v[1]:7d} {v[2]:7d} {v[3]:5d} {v[4]:5d} | "
            f"{v[5]:7d} {v[6]:7d} {v[7]:12d} {v[8]:7d}")


def channel_totals(stats: Iterable[Any], topic: str, channel: str) -> dict[str, int] | None:
    """Sum one channel's counters over several ``/stats?format=json`` answers (None if none
    of them has it)."""
    totals = dict.fromkeys(FIELDS, 0)
    found = False
    for data in stats:
        for t in (data or {}).get("topics") or []:
            if t.get("topic_name") != topic:
                continue
            for c in t.get("channels") or []:
                if c.get("channel_name") != channel:
                    continue
                found = True
                for f in FIELDS:
                    if f != "memory_depth":
                        totals[f] += int(c.get(f) or 0)
                totals["memory_depth"] += int(c.get("depth") or 0) - int(c.get("backend_depth") or 0)
    return totals if found else None


async def _get_json(client: httpx.AsyncClient, address: str, path: str, params: dict[str, str],
                    ok_statuses: tuple[int, ...] = ()) -> Any:
    """One V1 GET; ``StatError``-ready text on failure."""
    try:
        resp = await nsq_http.request(client, "GET", f"{nsq_http.base_url(address)}{path}", params=params,
                                      ok_statuses=ok_statuses)
        return orjson.loads(resp.content) if resp.status_code == 200 else None
    except (NSQError, orjson.JSONDecodeError) as exc:
        raise StatError(str(exc)) from None


async def _ask_all(client: httpx.AsyncClient, calls: list[tuple[str, str, dict[str, str]]], what: str) -> list[Any]:
    """Every call's answer; ``StatError`` if any failed (NSQ's statLoop stops on a partial error too)."""
    results = await asyncio.gather(*(_get_json(client, a, p, q) for a, p, q in calls), return_exceptions=True)
    errors = [str(r) for r in results if isinstance(r, StatError)]
    for r in results:
        if isinstance(r, BaseException) and not isinstance(r, StatError):
            raise r
    if errors:
        raise StatError(f"failed to query any {what}: " + "\n".join(errors) if len(errors) == len(calls)
                        else "\n".join(errors))
    return list(results)


async def producers(client: httpx.AsyncClient, opts: Options) -> list[str]:
    """HTTP addresses of the nsqds that have the topic."""
    if opts.nsqd_http_addresses:
        params = {"format": "json", "topic": opts.topic, "include_clients": "false"}
        answers = await _ask_all(client, [(a, "/stats", params) for a in opts.nsqd_http_addresses], "nsqd")
        return [a for a, data in zip(opts.nsqd_http_addresses, answers)
                if any(t.get("topic_name") == opts.topic for t in (data or {}).get("topics") or [])]
    answers = await _ask_all(client, [(a, "/lookup", {"topic": opts.topic}) for a in opts.lookupd_http_addresses],
                             "nsqlookupd")
    found: list[str] = []
    for data in answers:
        for p in (data or {}).get("producers") or []:
            host = p.get("broadcast_address")
            address = f"[{host}]:{p.get('http_port')}" if ":" in host else f"{host}:{p.get('http_port')}"
            if address not in found:
                found.append(address)
    return found


async def sample(client: httpx.AsyncClient, opts: Options) -> dict[str, int]:
    """The channel's figures summed over its producers now."""
    try:
        nodes = await producers(client, opts)
    except StatError as exc:
        raise StatError(f"failed to get topic producers - {exc}") from None
    params = {"format": "json", "topic": opts.topic, "channel": opts.channel, "include_clients": "false"}
    try:
        if not nodes:
            raise StatError("failed to query any nsqd: ")
        answers = await _ask_all(client, [(a, "/stats", params) for a in nodes], "nsqd")
    except StatError as exc:
        raise StatError(f"failed to get nsqd stats - {exc}") from None
    totals = channel_totals(answers, opts.topic, opts.channel)
    if totals is None:
        raise StatError(f"failed to find channel({opts.channel}) in stats metadata for topic({opts.topic})")
    return totals


async def main_async(opts: Options, stop: asyncio.Event, out: TextIO) -> int:
    seconds = opts.interval / SECOND
    async with nsq_http.make_client(opts.http_client_connect_timeout / SECOND,
                                    opts.http_client_request_timeout / SECOND) as client:
        before: dict[str, int] | None = None
        polls = 0
        while not stop.is_set():
            try:
                totals = await sample(client, opts)
            except StatError as exc:
                print(f"{PROG}: error: {exc}", file=sys.stderr)
                return 1
            if polls % 25 == 0:
                print(HEADER, file=out, flush=True)
            if before is not None:
                print(format_row(totals, before, seconds), file=out, flush=True)
                if opts.count and polls >= opts.count:
                    break
            before = totals
            polls += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), seconds)
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
