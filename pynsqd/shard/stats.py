"""``/stats`` in NSQ v1.3's exact JSON shape, built from a shard's state (NSQ's ``nsqd/stats.go``).

Keys and their order follow nsqd's structs, so nsqadmin, nsq_stat and anything else that
reads nsqd's ``/stats`` reads ours. Topics and channels are sorted by name.
"""

from __future__ import annotations

import datetime
import gc
import os
import sys
import time
from typing import Any

from pynsqd import NSQ_VERSION, __version__
from pynsqd.options import SECOND, format_duration
from pynsqd.shard.broker import Broker
from pynsqd.shard.channel import Channel
from pynsqd.shard.latency import NO_LATENCY, merged
from pynsqd.shard.topic import Topic


def stats_request(params: dict[str, list[str]]) -> dict[str, Any]:
    """``/stats``'s query as ``node_stats`` arguments. As nsqd's ``boolParams``, ``true``/``1``
    and ``false``/``0`` count and anything else means the default: true for
    ``include_clients``/``include_mem``, false for pynsqd's ``include_shards``."""
    def flag(name: str, default: bool) -> bool:
        value = (params.get(name) or [""])[0]
        return value in ("true", "1") if value in ("true", "1", "false", "0") else default
    return {"topic": (params.get("topic") or [""])[0], "channel": (params.get("channel") or [""])[0],
            "include_clients": flag("include_clients", True), "include_mem": flag("include_mem", True),
            "include_shards": flag("include_shards", False)}


def client_stats(client: Any, topic_filter: str = "", shards: bool = False) -> dict[str, Any]:
    """nsqd's ``ClientV2Stats`` of one connection, keys in its order. ``pub_counts`` (omitted
    when empty, as nsqd's ``omitempty``) counts what the connection published, only to
    ``topic_filter`` when one is given. ``shards`` adds pynsqd's ``shard`` key last."""
    session = client.session
    settings = session.settings
    out = {
        "client_id": settings.client_id,
        "hostname": settings.hostname,
        "version": "V2",
        "remote_address": session.remote_address,
        "state": session.state,
        "ready_count": session.rdy,
        "in_flight_count": client.in_flight_count,
        "message_count": client.message_count,
        "finish_count": client.finish_count,
        "requeue_count": client.requeue_count,
        "connect_ts": session.connect_ts,
        "sample_rate": settings.sample_rate,
        "deflate": session.compression == "deflate",
        "snappy": session.compression == "snappy",
        "user_agent": settings.user_agent,
    }
    auth = session.auth
    if auth is not None and auth.authed:  # omitempty, as nsqd's JSON tags say
        out["authed"] = True
        if auth.state.identity:
            out["auth_identity"] = auth.state.identity
        if auth.state.identity_url:
            out["auth_identity_url"] = auth.state.identity_url
    # nsqd's loop over pub_counts stops after the first entry; pynsqd reports every topic.
    counts = [{"topic": t, "count": n} for t, n in sorted(session.pub_counts.items())
              if not topic_filter or t == topic_filter]
    if counts:
        out["pub_counts"] = counts
    out.update(session.tls_info)
    if shards:
        out["shard"] = client.broker.shard  # pynsqd: the shard process serving this connection
    return out


def channel_stats(channel: Channel, include_clients: bool, topic_filter: str = "",
                  shards: bool = False) -> dict[str, Any]:
    return {
        "channel_name": channel.name,
        "depth": channel.depth,
        "backend_depth": channel.queue.backend_depth,
        "in_flight_count": len(channel.in_flight),
        "deferred_count": len(channel.deferred),
        "message_count": channel.message_count,
        "requeue_count": channel.requeue_count,
        "timeout_count": channel.timeout_count,
        "client_count": len(channel.consumers),
        "clients": [client_stats(c, topic_filter, shards) for c in channel.consumers] if include_clients else None,
        "paused": channel.paused,
        "e2e_processing_latency": channel.e2e.result() if channel.e2e is not None else dict(NO_LATENCY),
    }


def topic_stats(topic: Topic, channel_filter: str, include_clients: bool, topic_filter: str = "",
                shards: bool = False) -> dict[str, Any]:
    channels = [channel_stats(topic.channels[name], include_clients, topic_filter, shards)
                for name in sorted(topic.channels)
                if not channel_filter or name == channel_filter]
    return {
        "topic_name": topic.name,
        "channels": channels,
        "depth": topic.depth,
        "backend_depth": topic.queue.backend_depth,
        "message_count": topic.message_count,
        "message_bytes": topic.message_bytes,
        "paused": topic.paused,
        "e2e_processing_latency": merged(c.e2e for c in topic.channels.values()),
    }


def current_rss() -> int:
    """Resident set size of this process in bytes."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def memory_stats() -> dict[str, Any]:
    """Go's runtime memory figures, filled with the closest Python equivalents."""
    return {
        "heap_objects": sys.getallocatedblocks(),
        "heap_idle_bytes": 0,
        "heap_in_use_bytes": current_rss(),
        "heap_released_bytes": 0,
        "gc_pause_usec_100": 0,
        "gc_pause_usec_99": 0,
        "gc_pause_usec_95": 0,
        "next_gc_bytes": 0,
        "gc_total_runs": sum(s["collections"] for s in gc.get_stats()),
    }


def node_stats(broker: Broker, topic: str = "", channel: str = "", include_clients: bool = True,
               include_mem: bool = True, include_shards: bool = False) -> dict[str, Any]:
    """This shard's part of the ``/stats?format=json`` document (``node/aggregate.py``
    merges the shards').

    As nsqd's ``GetStats``: a ``topic`` filter naming no topic here gives ``topics`` null
    (the document keeps its producers: ``merge_stats`` nulls them when no shard has the
    topic); producers are the TCP connections that published, null when there are none or
    without clients.
    ``include_shards`` adds pynsqd's ``shard`` key to every client."""
    topics: list[dict[str, Any]] | None = None
    if not topic or topic in broker.topics:
        topics = [topic_stats(t, channel, include_clients, topic, include_shards)
                  for name, t in sorted(broker.topics.items())
                  if (not topic or name == topic) and (not channel or channel in t.channels)]
    out: dict[str, Any] = {
        "version": NSQ_VERSION,
        "health": broker.health,
        "start_time": broker.start_time,
        "topics": topics,
    }
    if include_mem:
        out["memory"] = memory_stats()
    producers = [client_stats(c, topic, include_shards) for c in broker.clients if c.session.pub_counts] \
        if include_clients else []
    out["producers"] = producers or None
    return out


# --- format=text --------------------------------------------------------------------------

def _ago(now: float, ts: int) -> str:
    return format_duration(max(0, int(now - ts)) * SECOND)


def _client_line(c: dict[str, Any], now: float) -> str:
    port = c["remote_address"].rpartition(":")[2]
    ident = f"{c['hostname']}:{port} {c['user_agent']}"
    if c.get("pub_counts"):
        total = sum(p["count"] for p in c["pub_counts"])
        topics = ",".join(f"{p['topic']}={p['count']}" for p in c["pub_counts"])
        return (f"[{c['version']} {ident:<21}] msgs: {total:<8d} topics: {topics} "
                f"connected: {_ago(now, c['connect_ts'])}")
    return (f"[{c['version']} {ident:<21}] state: {c['state']} inflt: {c['in_flight_count']:<4d} "
            f"rdy: {c['ready_count']:<4d} fin: {c['finish_count']:<8d} re-q: {c['requeue_count']:<8d} "
            f"msgs: {c['message_count']:<8d} connected: {_ago(now, c['connect_ts'])}")


def _latency(e2e: dict[str, Any]) -> str:
    """nsqd's ``quantile.Result.String``: each percentile's value, humanized, comma-joined."""
    parts = []
    for p in e2e.get("percentiles") or []:
        value = float(p["value"])
        if value > 1e9:
            label = f"{value / 1e9:.1f}s"
        elif value > 1e6:
            label = f"{value / 1e6:.1f}ms"
        elif value > 1e3:
            label = f"{value / 1e3:.1f}us"
        else:
            label = f"{value:.1f}ns"
        parts.append(label)
    return ", ".join(parts)


def rfc3339(unix: int) -> str:
    """Go's ``time.Format(time.RFC3339)`` of a local time: ``Z`` for UTC, else ``+hh:mm``."""
    text = datetime.datetime.fromtimestamp(unix).astimezone().isoformat(timespec="seconds")
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def format_text(stats: dict[str, Any], now_ns: int | None = None, start_ns: int | None = None) -> str:
    """``/stats`` in nsqd's text layout (the default ``format``); ``start_ns`` (wall-clock
    ns) makes ``uptime`` exact, as Go's ``time.Since`` is."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    now = now_ns / SECOND
    start = stats["start_time"]
    start_ns = start * SECOND if start_ns is None else start_ns
    out = [f"nsqd v{stats['version']} (built w/pynsqd {__version__})\n",
           f"start_time {rfc3339(start)}\n",
           f"uptime {format_duration(now_ns - start_ns)}\n",
           f"\nHealth: {stats['health']}\n"]
    memory = stats.get("memory")
    if memory:
        out.append("\nMemory:\n")
        out.extend(f"   {key:<25}\t{value}\n" for key, value in memory.items())
    topics = stats["topics"] or []
    out.append("\nTopics:" if topics else "\nTopics: None\n")
    for t in topics:
        prefix = "*P " if t["paused"] else "   "
        out.append(f"\n{prefix}[{t['topic_name']:<15}] depth: {t['depth']:<5d} be-depth: {t['backend_depth']:<5d} "
                   f"msgs: {t['message_count']:<8d} e2e%: {_latency(t['e2e_processing_latency'])}\n")
        for c in t["channels"]:
            prefix = "   *P " if c["paused"] else "      "
            out.append(f"{prefix}[{c['channel_name']:<25}] depth: {c['depth']:<5d} "
                       f"be-depth: {c['backend_depth']:<5d} inflt: {c['in_flight_count']:<4d} "
                       f"def: {c['deferred_count']:<4d} re-q: {c['requeue_count']:<5d} "
                       f"timeout: {c['timeout_count']:<5d} msgs: {c['message_count']:<8d} "
                       f"e2e%: {_latency(c['e2e_processing_latency'])}\n")
            out.extend(f"        {_client_line(client, now)}\n" for client in c["clients"] or [])
    producers = stats.get("producers") or []
    if producers:
        out.append("\nProducers:\n")
        out.extend(f"   {_client_line(p, now)}\n" for p in producers)
    else:
        out.append("\nProducers: None\n")
    return "".join(out)
