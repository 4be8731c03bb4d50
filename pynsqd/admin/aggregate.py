"""Per-node ``/stats`` turned into nsqadmin's shapes, and summed over nodes (pure functions).

Theory of operation
-------------------
nsqd's ``/stats?format=json`` describes one node. nsqadmin shows a topic or channel across
the cluster: ``node_topic``/``node_channel``/``node_client`` convert one node's objects into
NSQ's ``TopicStats``/``ChannelStats``/``ClientStats`` JSON (adding ``node``, ``hostname``,
``memory_depth`` and, for clients, ``connected`` in nanoseconds), and ``total_topic`` /
``total_channel`` add them up the way nsqadmin's ``Add`` does: counters and depths summed,
``paused`` if any node is paused, the per-node rows kept under ``nodes``, channels merged by
name, clients concatenated, and end-to-end latency percentiles merged into min/max/average
per quantile. ``clients`` are null where Go's are: a node's when its nsqd sent null (asked
without clients), a sum's when no node had a client (Go's ``append`` of nothing to nil).
Nothing here does I/O, so the API handlers and the tests share it.
"""

from __future__ import annotations

import time
from typing import Any

_TOPIC_SUMS = ("depth", "memory_depth", "backend_depth", "message_count")
_CHANNEL_SUMS = ("depth", "memory_depth", "backend_depth", "in_flight_count", "deferred_count",
                 "requeue_count", "timeout_count", "message_count", "client_count")
_CLIENT_KEYS = ("remote_address", "version", "client_id", "hostname", "user_agent", "connect_ts",
                "in_flight_count", "ready_count", "finish_count", "requeue_count", "message_count",
                "sample_rate", "deflate", "snappy", "authed", "auth_identity", "auth_identity_url",
                "tls", "tls_cipher_suite", "tls_version", "tls_negotiated_protocol",
                "tls_negotiated_protocol_is_mutual")
_CLIENT_DEFAULTS: dict[str, Any] = {"authed": False, "auth_identity": "", "auth_identity_url": "",
                                    "tls": False, "tls_cipher_suite": "", "tls_version": "",
                                    "tls_negotiated_protocol": "", "tls_negotiated_protocol_is_mutual": False,
                                    "sample_rate": 0, "deflate": False, "snappy": False}


def latency(raw: Any, node: str = "", topic: str = "", channel: str = "") -> dict[str, Any]:
    """One node's ``e2e_processing_latency`` as an aggregate of one."""
    raw = raw or {}
    percentiles = [{"quantile": float(p["quantile"]), "max": float(p["value"]), "min": float(p["value"]),
                    "average": float(p["value"]), "count": float(raw.get("count", 0))}
                   for p in raw.get("percentiles") or []]
    return {"count": int(raw.get("count", 0)), "percentiles": percentiles or None,
            "topic": topic, "channel": channel, "host": node}


def merge_latency(into: dict[str, Any], other: dict[str, Any]) -> None:
    into["count"] += other["count"]
    if not other["percentiles"]:
        return
    mine = {p["quantile"]: p for p in into["percentiles"] or []}
    for p in other["percentiles"]:
        q = mine.get(p["quantile"])
        if q is None:
            mine[p["quantile"]] = dict(p)
            continue
        total = q["count"] + p["count"]
        q["average"] = (q["average"] * q["count"] + p["average"] * p["count"]) / total if total else q["average"]
        q["max"], q["min"], q["count"] = max(q["max"], p["max"]), min(q["min"], p["min"]), total
    into["percentiles"] = sorted(mine.values(), key=lambda p: p["quantile"])


def node_client(raw: dict[str, Any], node: str, now_ns: int) -> dict[str, Any]:
    client: dict[str, Any] = {"node": node}
    for key in _CLIENT_KEYS:
        client[key] = raw.get(key, _CLIENT_DEFAULTS.get(key, ""))
    client["connected"] = max(0, now_ns - int(raw.get("connect_ts", 0)) * 1_000_000_000)
    return client


def node_channel(raw: dict[str, Any], topic: str, node: str, hostname: str, now_ns: int) -> dict[str, Any]:
    depth, backend = int(raw.get("depth", 0)), int(raw.get("backend_depth", 0))
    return {
        "node": node, "hostname": hostname, "topic_name": topic, "channel_name": raw["channel_name"],
        "depth": depth, "memory_depth": depth - backend, "backend_depth": backend,
        "in_flight_count": int(raw.get("in_flight_count", 0)), "deferred_count": int(raw.get("deferred_count", 0)),
        "requeue_count": int(raw.get("requeue_count", 0)), "timeout_count": int(raw.get("timeout_count", 0)),
        "message_count": int(raw.get("message_count", 0)), "client_count": int(raw.get("client_count", 0)),
        "nodes": None,
        "clients": None if raw.get("clients") is None else [node_client(c, node, now_ns) for c in raw["clients"]],
        "paused": bool(raw.get("paused", False)),
        "e2e_processing_latency": latency(raw.get("e2e_processing_latency"), node, topic, raw["channel_name"]),
    }


def node_topic(raw: dict[str, Any], node: str, hostname: str, now_ns: int | None = None) -> dict[str, Any]:
    now_ns = time.time_ns() if now_ns is None else now_ns
    topic = raw["topic_name"]
    depth, backend = int(raw.get("depth", 0)), int(raw.get("backend_depth", 0))
    channels = [node_channel(c, topic, node, hostname, now_ns) for c in raw.get("channels") or []]
    return {
        "node": node, "hostname": hostname, "topic_name": topic, "depth": depth,
        "memory_depth": depth - backend, "backend_depth": backend,
        "message_count": int(raw.get("message_count", 0)), "nodes": None,
        "channels": sorted(channels, key=lambda c: c["channel_name"]),
        "paused": bool(raw.get("paused", False)),
        "e2e_processing_latency": latency(raw.get("e2e_processing_latency"), node, topic),
    }


def empty_channel(topic: str, channel: str) -> dict[str, Any]:
    return {"node": "*", "hostname": "", "topic_name": topic, "channel_name": channel,
            **dict.fromkeys(_CHANNEL_SUMS, 0), "nodes": [], "clients": None, "paused": False,
            "e2e_processing_latency": latency(None, "*", topic, channel)}


def add_channel(total: dict[str, Any], node: dict[str, Any]) -> None:
    for key in _CHANNEL_SUMS:
        total[key] += node[key]
    total["paused"] = total["paused"] or node["paused"]
    total["nodes"].append(node)
    if node["clients"]:
        total["clients"] = (total["clients"] or []) + node["clients"]
    merge_latency(total["e2e_processing_latency"], node["e2e_processing_latency"])


def total_topic(topic: str, nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """Sum per-node topic stats (each from ``node_topic``) into the cluster-wide view."""
    total: dict[str, Any] = {"node": "*", "hostname": "", "topic_name": topic,
                             **dict.fromkeys(_TOPIC_SUMS, 0), "nodes": [], "channels": [], "paused": False,
                             "e2e_processing_latency": latency(None, "*", topic)}
    channels: dict[str, dict[str, Any]] = {}
    for node in sorted(nodes, key=lambda n: n["node"]):
        for key in _TOPIC_SUMS:
            total[key] += node[key]
        total["paused"] = total["paused"] or node["paused"]
        total["nodes"].append(node)
        merge_latency(total["e2e_processing_latency"], node["e2e_processing_latency"])
        for channel in node["channels"]:
            agg = channels.setdefault(channel["channel_name"], empty_channel(topic, channel["channel_name"]))
            add_channel(agg, channel)
    total["channels"] = [channels[name] for name in sorted(channels)]
    return total


def total_channel(topic: str, channel: str, nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """Sum per-node channel stats into the cluster-wide view (clients of every node)."""
    total = empty_channel(topic, channel)
    for node in sorted(nodes, key=lambda n: n["node"]):
        add_channel(total, node)
    if total["clients"]:
        total["clients"].sort(key=lambda c: (c["hostname"], c["node"], c["remote_address"]))
    return total
