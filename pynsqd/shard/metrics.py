"""Prometheus exposition of ``/stats`` (``GET /metrics``, ``/stats?format=prometheus``).

Every figure of nsqd's ``/stats`` becomes a metric labelled by ``topic`` and ``channel``;
totals (``message_count``, ``requeue_count`` …) are counters, levels (``depth``,
``in_flight_count`` …) gauges. The exposition format is ``prometheus_client``'s; this module
only maps a stats document (one shard's, or a node's aggregate) onto metric families, so it
works on whatever ``node_stats`` returns. Beside them, the size and free space of the two
file systems a node fills — its data path (disk queues) and ``/dev/shm`` (the queues'
shared memory) — so an alert can fire before either is full.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # prometheus_client is imported when /metrics is first asked, not at boot
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_TOPIC = [  # (stats key, metric name, kind, help)
    ("depth", "nsq_topic_depth", "gauge", "Messages queued at the topic (memory and disk)"),
    ("backend_depth", "nsq_topic_backend_depth", "gauge", "Messages of the topic queued on disk"),
    ("message_count", "nsq_topic_messages", "counter", "Messages published to the topic"),
    ("message_bytes", "nsq_topic_message_bytes", "counter", "Bytes of message bodies published to the topic"),
    ("paused", "nsq_topic_paused", "gauge", "1 when the topic is paused"),
]
_CHANNEL = [
    ("depth", "nsq_channel_depth", "gauge", "Messages queued in the channel (memory and disk)"),
    ("backend_depth", "nsq_channel_backend_depth", "gauge", "Messages of the channel queued on disk"),
    ("in_flight_count", "nsq_channel_in_flight", "gauge", "Messages delivered and not yet finished"),
    ("deferred_count", "nsq_channel_deferred", "gauge", "Messages waiting for a deferred delivery time"),
    ("message_count", "nsq_channel_messages", "counter", "Messages put into the channel"),
    ("requeue_count", "nsq_channel_requeued", "counter", "Messages requeued by consumers"),
    ("timeout_count", "nsq_channel_timed_out", "counter", "Messages that timed out in flight"),
    ("client_count", "nsq_channel_clients", "gauge", "Consumers connected to the channel"),
    ("paused", "nsq_channel_paused", "gauge", "1 when the channel is paused"),
]


def _family(name: str, kind: str, doc: str, labels: list[str]) -> GaugeMetricFamily | CounterMetricFamily:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    if kind == "counter":
        return CounterMetricFamily(name, doc, labels=labels)
    return GaugeMetricFamily(name, doc, labels=labels)


class StatsCollector:
    """A prometheus_client collector of the node-wide figures of a stats document (health,
    start time, the supervisor's counters); ``labelled_text`` writes the rest."""

    def __init__(self, stats: dict[str, Any]) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily
        health = GaugeMetricFamily("nsq_health", "1 when the node is healthy", labels=[])
        health.add_metric([], 1.0 if self.stats["health"] == "OK" else 0.0)
        yield health
        start = GaugeMetricFamily("nsq_start_time_seconds", "Unix time the node started", labels=[])
        start.add_metric([], float(self.stats["start_time"]))
        yield start
        yield from _supervisor_families(self.stats.get("supervisor"))


def _escape(value: str) -> str:
    """A label value as the text format quotes it."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


def _head(name: str, kind: str, doc: str) -> tuple[str, str]:
    """A family's exposed name (a counter's ends ``_total``) and its HELP and TYPE lines."""
    exposed = f"{name}_total" if kind == "counter" else name
    return exposed, f"# HELP {exposed} {doc}\n# TYPE {exposed} {kind}\n"


def labelled_text(stats: dict[str, Any]) -> str:
    """The families labelled by topic, channel or producer, in the text format
    ``prometheus_client.generate_latest`` writes (labels sorted by name, values as Go
    formats floats), written directly: a node with thousands of topics has tens of thousands
    of these samples, and one ``prometheus_client`` sample object each made a scrape cost
    tens of microseconds per sample."""
    from prometheus_client.utils import floatToGoString as num

    topics = [(t, f'topic="{_escape(t["topic_name"])}"') for t in stats.get("topics") or []]
    channels = [(c, f'channel="{_escape(c["channel_name"])}"', tl) for t, tl in topics for c in t["channels"]]
    out: list[str] = []
    for key, name, kind, doc in _TOPIC:
        exposed, head = _head(name, kind, doc)
        out.append(head)
        out.extend(f"{exposed}{{{tl}}} {num(t[key])}\n" for t, tl in topics)
    for key, name, kind, doc in _CHANNEL:
        exposed, head = _head(name, kind, doc)
        out.append(head)
        out.extend(f"{exposed}{{{cl},{tl}}} {num(c[key])}\n" for c, cl, tl in channels)
    exposed, head = _head("nsq_client_published_messages", "counter",
                          "Messages published by each TCP producer connection")
    out.append(head)
    out.extend(f'{exposed}{{client="{_escape(p["remote_address"])}",topic="{_escape(pc["topic"])}"}} '
               f'{num(pc["count"])}\n'
               for p in stats.get("producers") or [] for pc in p.get("pub_counts") or [])
    topic_e2e = [(tl, p) for t, tl in topics for p in t["e2e_processing_latency"].get("percentiles") or []]
    if topic_e2e:
        exposed, head = _head("nsq_topic_e2e_processing_latency_seconds", "gauge", "End-to-end processing "
                              "latency quantiles of the topic's channels (publish to FIN)")
        out.append(head)
        out.extend(f'{exposed}{{quantile="{float(p["quantile"])!r}",{tl}}} {num(p["value"] / 1e9)}\n'
                   for tl, p in topic_e2e)
        exposed, head = _head("nsq_channel_e2e_processing_latency_seconds", "gauge", "End-to-end processing "
                              "latency quantiles (publish to FIN)")
        out.append(head)
        out.extend(f'{exposed}{{{cl},quantile="{float(p["quantile"])!r}",{tl}}} {num(p["value"] / 1e9)}\n'
                   for c, cl, tl in channels for p in c["e2e_processing_latency"].get("percentiles") or [])
    return "".join(out)


_SUPERVISOR = [  # (key of the "supervisor" stats object, metric name, kind, help)
    ("shards", "nsq_supervisor_shards", "gauge", "Shard processes of the node"),
    ("shard_restarts", "nsq_supervisor_shard_restarts", "counter", "Shard processes restarted"),
    ("reloads", "nsq_supervisor_reloads", "counter", "Rolling restarts completed (SIGHUP)"),
    ("shards_replaced", "nsq_supervisor_shards_replaced", "counter",
     "Shard processes replaced by a new one, connections and state handed over, by rolling restarts"),
    ("upgrades", "nsq_supervisor_upgrades", "counter", "Times the supervisor re-executed itself (SIGUSR2)"),
    ("handoffs", "nsq_supervisor_handoffs", "counter", "TCP connections handed to a shard"),
    ("http_handoffs", "nsq_supervisor_http_handoffs", "counter", "HTTP and HTTPS connections handed to a shard"),
    ("relays", "nsq_supervisor_relays", "counter", "Connections relayed from one shard to another"),
    ("cross_shard_sent", "nsq_supervisor_cross_shard_messages", "counter",
     "Messages published on one shard for a topic another shard owns"),
    ("cross_shard_framed", "nsq_supervisor_cross_shard_framed_messages", "counter",
     "Cross-shard messages their owner stored as framed runs, one copy per log"),
    ("http_pubs", "nsq_supervisor_http_pub_messages", "counter", "Messages published by HTTP /pub without a delay"),
    ("http_pub_batches", "nsq_supervisor_http_pub_batches", "counter",
     "Batches those were stored in: the /pub requests of one loop turn, one batch per topic"),
]


def _supervisor_families(sup: dict[str, Any] | None) -> Iterator[Metric]:
    """The multi-shard node's own figures (the ``supervisor`` key of its ``/stats``)."""
    if not sup:
        return
    for key, name, kind, doc in _SUPERVISOR:
        family = _family(name, kind, doc, [])
        family.add_metric([], float(sup.get(key, 0)))
        yield family


class StorageCollector:
    """``nsq_filesystem_{size,avail}_bytes`` of the data path and of shared memory."""

    def __init__(self, volumes: dict[str, str]) -> None:
        self.volumes = volumes  # label → path

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily
        size = GaugeMetricFamily("nsq_filesystem_size_bytes", "Size of the file system holding the node's "
                                 "data path (volume=data) or shared-memory queues (volume=shm)",
                                 labels=["volume", "path"])
        avail = GaugeMetricFamily("nsq_filesystem_avail_bytes", "Bytes of that file system the node "
                                  "can still use", labels=["volume", "path"])
        for volume, path in self.volumes.items():
            try:
                st = os.statvfs(path)
            except OSError:
                continue
            size.add_metric([volume, path], float(st.f_blocks * st.f_frsize))
            avail.add_metric([volume, path], float(st.f_bavail * st.f_frsize))
        yield size
        yield avail


def exposition(stats: dict[str, Any], data_path: str = "") -> bytes:
    """The text exposition of the stats, the storage of ``data_path`` and ``/dev/shm``, and
    this process's own metrics."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.process_collector import ProcessCollector

    from pynsqd.shm.segment import SHM_DIR
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatsCollector(stats))
    registry.register(StorageCollector({"data": data_path, "shm": SHM_DIR} if data_path else {"shm": SHM_DIR}))
    ProcessCollector(registry=registry)
    return bytes(generate_latest(registry)) + labelled_text(stats).encode()
