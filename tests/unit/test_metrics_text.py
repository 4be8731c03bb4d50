"""/metrics' labelled families are written directly; prometheus_client is the reference: the
same families built as its metric objects must give byte for byte the same text."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from pynsqd.shard.metrics import _CHANNEL, _TOPIC, exposition, labelled_text


def _latency(*pairs: tuple[float, int]) -> dict[str, Any]:
    return {"count": len(pairs), "percentiles": [{"quantile": q, "value": v} for q, v in pairs] or None}


def _channel(name: str, n: int, paused: bool = False, e2e: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"channel_name": name, "depth": n, "backend_depth": n // 2, "in_flight_count": 1, "deferred_count": 2,
            "message_count": 10 ** 7 + n, "requeue_count": 3, "timeout_count": 4, "client_count": 0, "clients": [],
            "paused": paused, "e2e_processing_latency": e2e or _latency()}


STATS: dict[str, Any] = {
    "version": "1.3.0", "health": "OK", "start_time": 1_700_000_000,
    "topics": [
        {"topic_name": "a", "depth": 5, "backend_depth": 0, "message_count": 12_345_678, "message_bytes": 3,
         "paused": True, "e2e_processing_latency": _latency((0.5, 1_500_000), (0.99, 2_000_000_000)),
         "channels": [_channel("c1", 3, True, _latency((0.5, 1_500_000), (0.99, 2_000_000_000))),
                      _channel("c2#ephemeral", 0)]},
        {"topic_name": "b.x_y-z", "depth": 0, "backend_depth": 0, "message_count": 0, "message_bytes": 0,
         "paused": False, "e2e_processing_latency": _latency(), "channels": []},
    ],
    "producers": [{"remote_address": 'odd"\\addr\n:1', "pub_counts": [{"topic": "a", "count": 7}]},
                  {"remote_address": "127.0.0.1:2"}],
}


class _Reference:
    """The families as prometheus_client metric objects, the way a collector would build them."""

    def __init__(self, stats: dict[str, Any]) -> None:
        self.stats = stats

    def collect(self) -> list[Metric]:
        def family(name: str, kind: str, doc: str, labels: list[str]) -> Metric:
            cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            return cls(name, doc, labels=labels)
        topics = {k: family(n, kind, d, ["topic"]) for k, n, kind, d in _TOPIC}
        channels = {k: family(n, kind, d, ["topic", "channel"]) for k, n, kind, d in _CHANNEL}
        producers = CounterMetricFamily("nsq_client_published_messages", "Messages published by each TCP "
                                        "producer connection", labels=["client", "topic"])
        e2e_t = GaugeMetricFamily("nsq_topic_e2e_processing_latency_seconds", "End-to-end processing latency "
                                  "quantiles of the topic's channels (publish to FIN)", labels=["topic", "quantile"])
        e2e_c = GaugeMetricFamily("nsq_channel_e2e_processing_latency_seconds", "End-to-end processing latency "
                                  "quantiles (publish to FIN)", labels=["topic", "channel", "quantile"])
        for t in self.stats["topics"]:
            for k, f in topics.items():
                f.add_metric([t["topic_name"]], float(t[k]))
            for p in t["e2e_processing_latency"]["percentiles"] or []:
                e2e_t.add_metric([t["topic_name"], repr(float(p["quantile"]))], p["value"] / 1e9)
            for c in t["channels"]:
                for k, f in channels.items():
                    f.add_metric([t["topic_name"], c["channel_name"]], float(c[k]))
                for p in c["e2e_processing_latency"]["percentiles"] or []:
                    e2e_c.add_metric([t["topic_name"], c["channel_name"], repr(float(p["quantile"]))],
                                     p["value"] / 1e9)
        for p in self.stats["producers"]:
            for pc in p.get("pub_counts") or []:
                producers.add_metric([p["remote_address"], pc["topic"]], float(pc["count"]))
        return [*topics.values(), *channels.values(), producers, e2e_t, e2e_c]


def test_the_labelled_families_are_what_prometheus_client_writes() -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Reference(STATS))
    assert labelled_text(STATS) == generate_latest(registry).decode()


def test_without_latency_figures_there_are_no_latency_families() -> None:
    stats = {**STATS, "topics": STATS["topics"][1:], "producers": None}
    text = labelled_text(stats)
    assert "e2e" not in text
    assert "# TYPE nsq_client_published_messages_total counter\n" in text


def test_the_whole_exposition_parses() -> None:
    families = {f.name: f for f in text_string_to_metric_families(exposition(STATS).decode())}
    assert families["nsq_topic_depth"].samples[0].labels == {"topic": "a"}
    assert families["nsq_client_published_messages"].samples[0].labels["client"] == 'odd"\\addr\n:1'
    assert {"nsq_health", "nsq_start_time_seconds", "nsq_filesystem_size_bytes", "process_open_fds"} <= set(families)
