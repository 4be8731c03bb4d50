"""statsd: push nsqd's figures over UDP every ``--statsd-interval``, with nsqd's names.

Theory of operation
-------------------
Each tick takes one stats document of the node (``get_stats``; the supervisor can hand in
the aggregate of all shards) and turns it into statsd lines: counters are the *change*
since the previous tick (``topic.<t>.message_count``, ``message_bytes``; per channel
``message_count``, ``requeue_count``, ``timeout_count``; ``mem.gc_runs``), gauges are the
current level (depths, in-flight, deferred, clients, e2e latency quantiles as
``e2e_processing_latency_<pct>`` in ns, and the ``mem.*`` figures with
``--statsd-mem-stats``). ``StatsdLines`` does this with no I/O and is tested alone.

Names start with ``--statsd-prefix`` where ``%s`` is nsqd's host key — the broadcast
address and HTTP port with ``.`` and ``:`` turned into ``_`` — and a ``.`` is added when
missing. Lines are packed whole into datagrams of at most ``--statsd-udp-packet-size``
bytes (nsqd's boundary-buffered writer; one longer line goes alone), spread evenly over
``interval - 1s`` (nsqd's spread writer; all at once for intervals of a second or less).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from pynsqd.netaddr import split_host_port
from pynsqd.options import SECOND

log = logging.getLogger("pynsqd.shard")

_MEM_GAUGES = ("heap_objects", "heap_idle_bytes", "heap_in_use_bytes", "heap_released_bytes",
               "gc_pause_usec_100", "gc_pause_usec_99", "gc_pause_usec_95", "next_gc_bytes")


def statsd_prefix(template: str, broadcast_address: str, http_port: int) -> str:
    """``nsq.%s`` → ``nsq.<host>_<port>.``."""
    host = f"[{broadcast_address}]" if ":" in broadcast_address else broadcast_address
    key = f"{host}:{http_port}".replace(".", "_").replace(":", "_")
    prefix = template.replace("%s", key)
    return prefix if prefix.endswith(".") else prefix + "."


class StatsdLines:
    """Turns successive stats documents into statsd lines (counters as deltas)."""

    def __init__(self, prefix: str, mem_stats: bool = True, exclude_ephemeral: bool = False) -> None:
        self.prefix = prefix
        self.mem_stats = mem_stats
        self.exclude_ephemeral = exclude_ephemeral
        self._last: dict[str, int] = {}
        self._seen: dict[str, int] = {}

    def _incr(self, out: list[str], stat: str, total: int) -> None:
        out.append(f"{self.prefix}{stat}:{total - self._last.get(stat, 0)}|c")
        self._seen[stat] = total

    def _gauge(self, out: list[str], stat: str, value: float) -> None:
        out.append(f"{self.prefix}{stat}:{int(value)}|g")

    def lines(self, stats: dict[str, Any]) -> list[str]:
        out: list[str] = []
        self._seen = {}
        for t in stats["topics"]:
            tname = t["topic_name"]
            if self.exclude_ephemeral and tname.endswith("#ephemeral"):
                continue
            self._incr(out, f"topic.{tname}.message_count", t["message_count"])
            self._incr(out, f"topic.{tname}.message_bytes", t["message_bytes"])
            self._gauge(out, f"topic.{tname}.depth", t["depth"])
            self._gauge(out, f"topic.{tname}.backend_depth", t["backend_depth"])
            for p in t["e2e_processing_latency"].get("percentiles") or []:
                self._gauge(out, f"topic.{tname}.e2e_processing_latency_{p['quantile'] * 100:.0f}", p["value"])
            for c in t["channels"]:
                cname = c["channel_name"]
                if self.exclude_ephemeral and cname.endswith("#ephemeral"):
                    continue
                base = f"topic.{tname}.channel.{cname}"
                self._incr(out, f"{base}.message_count", c["message_count"])
                for key in ("depth", "backend_depth", "in_flight_count", "deferred_count"):
                    self._gauge(out, f"{base}.{key}", c[key])
                self._incr(out, f"{base}.requeue_count", c["requeue_count"])
                self._incr(out, f"{base}.timeout_count", c["timeout_count"])
                self._gauge(out, f"{base}.clients", c["client_count"])
                for p in c["e2e_processing_latency"].get("percentiles") or []:
                    self._gauge(out, f"{base}.e2e_processing_latency_{p['quantile'] * 100:.0f}", p["value"])
        mem = stats.get("memory")
        if self.mem_stats and mem:
            for key in _MEM_GAUGES:
                self._gauge(out, f"mem.{key}", mem[key])
            self._incr(out, "mem.gc_runs", mem["gc_total_runs"])
        # nsqd compares with the previous document: what vanished starts again from zero
        self._last = self._seen
        return out


def packets(lines: list[str], size: int) -> list[bytes]:
    """Whole lines (``\\n``-terminated) packed into datagrams of at most ``size`` bytes."""
    out: list[bytes] = []
    buf = bytearray()
    for line in lines:
        data = line.encode() + b"\n"
        if buf and len(buf) + len(data) > size:
            out.append(bytes(buf))
            buf.clear()
        buf += data
    if buf:
        out.append(bytes(buf))
    return out


class StatsdPusher:
    """Every ``--statsd-interval``: one stats document → datagrams to ``--statsd-address``."""

    def __init__(self, address: str, interval: int, packet_size: int, lines: StatsdLines,
                 get_stats: Callable[[], Awaitable[dict[str, Any]]]) -> None:
        self.host, self.port = split_host_port(address, "statsd-address")
        self.interval = interval / SECOND
        self.packet_size = packet_size
        self.lines = lines
        self.get_stats = get_stats

    async def run(self) -> None:
        """Push on a fixed schedule (a tick that overruns skips the ticks it missed, as Go's
        ticker does); each push spreads its datagrams over ``interval - 1s`` like nsqd."""
        loop = asyncio.get_running_loop()
        next_tick = loop.time() + self.interval
        while True:
            await asyncio.sleep(max(next_tick - loop.time(), 0))
            try:
                infos = await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_DGRAM)
                await self.push_once(infos[0][0], infos[0][4])
            except OSError as exc:
                log.error("failed to send stats to statsd(%s:%d) - %s", self.host, self.port, exc)
            except Exception:  # a bad tick must not end the pushes
                log.exception("STATSD: push failed")
            now = loop.time()
            while next_tick <= now:
                next_tick += self.interval

    async def push_once(self, family: int, sockaddr: Any) -> None:
        """Send one tick's datagrams to a resolved address. Raises ``OSError``."""
        log.info("STATSD: pushing stats to %s:%d", self.host, self.port)
        data = packets(self.lines.lines(await self.get_stats()), self.packet_size)
        gap = max(self.interval - 1.0, 0.0) / max(len(data), 1)
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.setblocking(False)
            sock.connect(sockaddr)
            for i, packet in enumerate(data):
                if i and gap:
                    await asyncio.sleep(gap)
                try:
                    sock.send(packet)
                except BlockingIOError:  # a full socket buffer: drop, as UDP would
                    pass
