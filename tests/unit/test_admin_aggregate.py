"""nsqadmin's pure parts: per-node /stats summed over nodes, and the sampled rates."""

from __future__ import annotations

import logging
from typing import Any

from pynsqd.admin.aggregate import node_topic, total_channel, total_topic
from pynsqd.admin.sampler import Sampler


def stats_topic(depth: int, backend: int, count: int, p99: int | None, paused: bool = False) -> dict[str, Any]:
    e2e = {"count": count, "percentiles": [{"quantile": 0.99, "value": p99}]} if p99 else \
        {"count": 0, "percentiles": None}
    return {"topic_name": "t", "depth": depth, "backend_depth": backend, "message_count": count,
            "message_bytes": 0, "paused": paused, "e2e_processing_latency": e2e, "channels": [
                {"channel_name": "c", "depth": depth, "backend_depth": backend, "in_flight_count": 1,
                 "deferred_count": 2, "message_count": count, "requeue_count": 3, "timeout_count": 4,
                 "client_count": 1, "paused": paused, "e2e_processing_latency": e2e,
                 "clients": [{"client_id": f"id{depth}", "hostname": "h", "version": "V2",
                              "remote_address": "1.2.3.4:5", "state": 3, "ready_count": 1, "in_flight_count": 1,
                              "message_count": 1, "finish_count": 0, "requeue_count": 0, "connect_ts": 100,
                              "sample_rate": 0, "deflate": False, "snappy": True, "user_agent": "ua",
                              "tls": False, "tls_cipher_suite": "", "tls_version": "",
                              "tls_negotiated_protocol": "", "tls_negotiated_protocol_is_mutual": False}]}]}


def test_nodes_are_summed_and_e2e_percentiles_merged() -> None:
    a = node_topic(stats_topic(10, 4, 100, 2_000_000), "a:1", "ha", now_ns=200 * 10**9)
    b = node_topic(stats_topic(5, 0, 50, 6_000_000, paused=True), "b:1", "hb", now_ns=200 * 10**9)
    assert a["memory_depth"] == 6 and a["nodes"] is None
    total = total_topic("t", [b, a])
    assert [n["node"] for n in total["nodes"]] == ["a:1", "b:1"]
    assert (total["depth"], total["backend_depth"], total["memory_depth"], total["message_count"]) == (15, 4, 11, 150)
    assert total["paused"] is True and total["node"] == "*"
    [p] = total["e2e_processing_latency"]["percentiles"]
    assert (p["min"], p["max"], p["quantile"]) == (2_000_000, 6_000_000, 0.99)
    assert abs(p["average"] - (2_000_000 * 100 + 6_000_000 * 50) / 150) < 1e-6
    [c] = total["channels"]
    assert (c["in_flight_count"], c["deferred_count"], c["requeue_count"], c["timeout_count"]) == (2, 4, 6, 8)
    assert c["client_count"] == 2 and len(c["clients"]) == 2 and len(c["nodes"]) == 2
    client = a["channels"][0]["clients"][0]
    assert client["node"] == "a:1" and client["connected"] == 100 * 10**9 and client["snappy"] is True
    alone = total_channel("t", "c", [a["channels"][0]])
    assert alone["depth"] == 10 and alone["e2e_processing_latency"]["count"] == 100


def test_clients_are_null_where_gos_are() -> None:
    """A node asked without clients sends ``"clients": null``: it stays null; a sum over
    nodes with no client at all is null (Go appends nothing to a nil slice)."""
    raw = stats_topic(1, 0, 1, None)
    raw["channels"][0]["clients"] = None
    a = node_topic(raw, "a:1", "h")
    assert a["channels"][0]["clients"] is None
    total = total_topic("t", [a, node_topic(raw, "b:1", "h")])
    assert total["channels"][0]["clients"] is None and [n["clients"] for n in total["channels"][0]["nodes"]] == [
        None, None]
    raw["channels"][0]["clients"] = []
    empty = node_topic(raw, "a:1", "h")["channels"][0]
    assert empty["clients"] == [] and total_channel("t", "c", [empty])["clients"] is None
    full = node_topic(stats_topic(1, 0, 1, None), "b:1", "h")["channels"][0]
    assert [k["node"] for k in total_channel("t", "c", [empty, full])["clients"]] == ["b:1"]


def test_no_percentiles_stay_null() -> None:
    total = total_topic("t", [node_topic(stats_topic(1, 0, 1, None), "a:1", "h")])
    assert total["e2e_processing_latency"]["percentiles"] is None


def test_sampler_rates_are_differences_over_time_and_never_negative() -> None:
    sampler = Sampler(None, 1.0, logging.getLogger("test"))  # type: ignore[arg-type]
    sampler.record(100.0, [{"topics": [stats_topic(0, 0, 10, None)]}])
    sampler.record(102.0, [{"topics": [stats_topic(0, 0, 30, None)]}, {"topics": [stats_topic(0, 0, 10, None)]}])
    sampler.record(103.0, [{"topics": [stats_topic(0, 0, 5, None)]}])  # a node went away: no negative rate
    assert sampler.series(("t", "")) == [[102.0, 15.0], [103.0, 0.0]]
    assert sampler.series(("t", "c")) == [[102.0, 15.0], [103.0, 0.0]]
    assert sampler.topics["t"]["message_count"] == 5 and sampler.topics["t"]["channels"] == 1
    sampler.record(104.0, [{"topics": []}])
    assert sampler.series(("t", "")) == [] and sampler.topics == {}
