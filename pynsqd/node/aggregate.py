"""One node's ``/stats`` from its shards' documents, in exactly the single-node shape (the
shard answering ``/stats`` merges, and the supervisor for statsd).

Each shard answers with ``stats.node_stats`` of its own broker (topics it owns, clients it
serves). A topic lives on one shard, so topics are concatenated (sorted by name, as nsqd
sorts); should two shards report the same topic (a topic created on a non-owner by an
older placement), its counters are summed and channels merged by name. Producers are
concatenated. Health is the first non-OK one. Memory figures are summed over the processes.
End-to-end latency quantiles are computed on the shard that owns the topic (its channels
live there); a name two shards report keeps the busier shard's quantiles. A ``topic``
filter that no shard knows gives ``topics`` and ``producers`` null, as nsqd's early return
does. Per-shard counters (hand-offs, relays, cross-shard messages) are removed from the
document; only when the supervisor's figures are given (``/stats?include_shards=true``,
``/metrics``) are they summed into its ``supervisor`` key.
"""

from __future__ import annotations

from typing import Any

_TOPIC_SUMS = ("depth", "backend_depth", "message_count", "message_bytes")
_CHANNEL_SUMS = ("depth", "backend_depth", "in_flight_count", "deferred_count", "message_count",
                 "requeue_count", "timeout_count", "client_count")


def _keep_busier_latency(into: dict[str, Any], other: dict[str, Any]) -> None:
    """Quantiles cannot be summed: of two shards' figures for one name keep the one measured
    over more messages (only a topic met by two shards under different placements has two)."""
    mine, theirs = into.get("e2e_processing_latency"), other.get("e2e_processing_latency")
    if theirs is not None and (mine is None or theirs.get("count", 0) > mine.get("count", 0)):
        into["e2e_processing_latency"] = theirs


def _merge_channels(into: dict[str, Any], other: dict[str, Any]) -> None:
    by_name = {c["channel_name"]: c for c in into["channels"]}
    for c in other["channels"]:
        mine = by_name.get(c["channel_name"])
        if mine is None:
            into["channels"].append(c)
            by_name[c["channel_name"]] = c
            continue
        for key in _CHANNEL_SUMS:
            mine[key] += c[key]
        _keep_busier_latency(mine, c)
        if c.get("clients") is not None:
            mine["clients"] = (mine.get("clients") or []) + c["clients"]
        mine["paused"] = mine["paused"] or c["paused"]
    into["channels"].sort(key=lambda c: c["channel_name"])


def merge_stats(docs: list[dict[str, Any]], supervisor: dict[str, Any] | None = None,
                topic: str = "") -> dict[str, Any]:
    """Merge shard documents (in shard order) into one node document (``topic``: the filter
    they were asked with)."""
    topics: dict[str, dict[str, Any]] = {}
    producers: list[dict[str, Any]] = []
    health = "OK"
    memory: dict[str, Any] | None = None
    counters: dict[str, int] = {}
    for doc in docs:
        if health == "OK" and doc.get("health", "OK") != "OK":
            health = doc["health"]
        for t in doc.get("topics") or []:
            mine = topics.get(t["topic_name"])
            if mine is None:
                topics[t["topic_name"]] = t
                continue
            for key in _TOPIC_SUMS:
                mine[key] += t[key]
            _keep_busier_latency(mine, t)
            mine["paused"] = mine["paused"] or t["paused"]
            _merge_channels(mine, t)
        producers.extend(doc.get("producers") or [])
        if doc.get("memory") is not None:
            if memory is None:
                memory = dict(doc["memory"])
            else:
                for key, value in doc["memory"].items():
                    memory[key] = memory.get(key, 0) + value
        for key, value in (doc.get("shard_counters") or {}).items():
            counters[key] = counters.get(key, 0) + value
    first = docs[0] if docs else {}
    unknown = bool(topic) and all(d.get("topics") is None for d in docs)
    out: dict[str, Any] = {
        "version": first.get("version", ""),
        "health": health,
        "start_time": min((d["start_time"] for d in docs), default=0),
        "topics": None if unknown else [topics[name] for name in sorted(topics)],
    }
    if memory is not None:
        out["memory"] = memory
    out["producers"] = None if unknown else producers or None
    if supervisor is not None:
        out["supervisor"] = {**supervisor, **counters}
    return out
