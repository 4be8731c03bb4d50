"""nsqd's HTTP API against the real server (NSQ's nsqd/http_test.go behaviours)."""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pynsqd.shard.stats import format_text, rfc3339
from pynsqd.wire.commands import encode_fin, encode_pub, encode_req, encode_touch
from testbed.harness import Daemon, scaled, wait_for
from tests.support.foreign import ClientProc, consume
from tests.support.rawclient import RawClient

pytestmark = pytest.mark.fast

# The key lists of nsqd v1.3's /stats JSON (nsqd/stats.go), in order.
TOP_KEYS = ["version", "health", "start_time", "topics", "memory", "producers"]
MEMORY_KEYS = ["heap_objects", "heap_idle_bytes", "heap_in_use_bytes", "heap_released_bytes",
               "gc_pause_usec_100", "gc_pause_usec_99", "gc_pause_usec_95", "next_gc_bytes", "gc_total_runs"]
TOPIC_KEYS = ["topic_name", "channels", "depth", "backend_depth", "message_count", "message_bytes",
              "paused", "e2e_processing_latency"]
CHANNEL_KEYS = ["channel_name", "depth", "backend_depth", "in_flight_count", "deferred_count",
                "message_count", "requeue_count", "timeout_count", "client_count", "clients", "paused",
                "e2e_processing_latency"]
CLIENT_KEYS = ["client_id", "hostname", "version", "remote_address", "state", "ready_count",
               "in_flight_count", "message_count", "finish_count", "requeue_count", "connect_ts",
               "sample_rate", "deflate", "snappy", "user_agent", "tls", "tls_cipher_suite", "tls_version",
               "tls_negotiated_protocol", "tls_negotiated_protocol_is_mutual"]
INFO_KEYS = ["version", "broadcast_address", "hostname", "http_port", "tcp_port", "start_time",
             "max_heartbeat_interval", "max_output_buffer_size", "max_output_buffer_timeout",
             "max_deflate_level"]


@pytest.fixture
def http(nsqd: Daemon) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=nsqd.http_url, timeout=scaled(5)) as client:
        yield client


def stats(http: httpx.Client, **params: str) -> dict[str, Any]:
    return dict(http.get("/stats", params={"format": "json", **params}).json())


def expect(resp: httpx.Response, status: int, message: str | None = None, body: bytes | None = None) -> None:
    assert resp.status_code == status, resp.text
    assert resp.headers["x-nsq-content-type"] == "nsq; version=1.0"
    if message is not None:
        assert resp.headers["content-type"] == "application/json; charset=utf-8"
        assert resp.json() == {"message": message}
    if body is not None:
        assert resp.content == body


# --- node --------------------------------------------------------------------------------------

def test_ping_and_info(nsqd: Daemon, http: httpx.Client) -> None:
    resp = http.get("/ping")
    assert (resp.status_code, resp.text) == (200, "OK")
    info = http.get("/info").json()
    assert list(info) == INFO_KEYS
    assert info["version"] == "1.3.0" and info["tcp_port"] == nsqd.tcp[1] and info["http_port"] == nsqd.http[1]
    assert info["max_heartbeat_interval"] == 60_000_000_000  # Go durations are nanoseconds


def test_unknown_path_and_wrong_method(http: httpx.Client) -> None:
    expect(http.get("/nope"), 404, "NOT_FOUND")
    expect(http.post("/stats"), 405, "METHOD_NOT_ALLOWED")
    expect(http.delete("/metrics"), 405, "METHOD_NOT_ALLOWED")
    assert http.head("/stats").status_code == 200
    moved = http.get("/stats/")
    assert moved.status_code == 307 and moved.headers["location"].endswith("/stats"), moved.headers
    expect(http.get("/pub?topic=t"), 405, "METHOD_NOT_ALLOWED")


def test_stats_json_has_nsqs_shape(nsqd: Daemon, http: httpx.Client) -> None:
    empty = http.get("/stats", params={"format": "json"})
    assert empty.content.startswith(b'{"version":"1.3.0","health":"OK","start_time":')
    assert b'"topics":[],"memory":{' in empty.content
    with RawClient(nsqd.tcp) as c:
        c.identify(user_agent="test/1.0")
        c.subscribe("shape", "ch", rdy=5)
        c.send(encode_pub("shape", b"x"))
        c.expect_ok()
        c.read_message()
        data = stats(http)
        assert list(data) == TOP_KEYS and list(data["memory"]) == MEMORY_KEYS
        topic = data["topics"][0]
        assert list(topic) == TOPIC_KEYS
        channel = topic["channels"][0]
        assert list(channel) == CHANNEL_KEYS
        # the consumer connection also published: nsqd's Stats(topic) gives it pub_counts too
        assert list(channel["clients"][0]) == [*CLIENT_KEYS[:15], "pub_counts", *CLIENT_KEYS[15:]]
        assert channel["clients"][0]["user_agent"] == "test/1.0"
        assert channel["in_flight_count"] == 1 and topic["message_bytes"] == 1
        assert channel["e2e_processing_latency"] == {"count": 0, "percentiles": None}
        producer = data["producers"][0]
        assert list(producer) == [*CLIENT_KEYS[:15], "pub_counts", *CLIENT_KEYS[15:]]
        assert producer["pub_counts"] == [{"topic": "shape", "count": 1}]
        # pynsqd's own facts only when asked for: the serving shard last in every client
        extra = stats(http, include_shards="true")
        assert list(extra) == [*TOP_KEYS, "supervisor"] and extra["supervisor"]["shards"] >= 1
        assert list(extra["topics"][0]["channels"][0]["clients"][0])[-1] == "shard"
        assert list(extra["producers"][0])[-1] == "shard"
        no_clients = stats(http, include_clients="false", include_mem="false")
        assert "memory" not in no_clients and no_clients["producers"] is None
        ch = no_clients["topics"][0]["channels"][0]
        assert ch["clients"] is None and ch["client_count"] == 1
    assert stats(http, topic="shape", channel="other")["topics"] == []


def test_stats_json_of_an_unknown_topic_is_nsqds_null_answer(nsqd: Daemon, http: httpx.Client) -> None:
    """nsqd's ``GetStats`` returns early for a topic it does not have: ``topics`` and
    ``producers`` are null even while a TCP producer is connected (Go's answer, recorded)."""
    with RawClient(nsqd.tcp) as c:
        c.send(encode_pub("known", b"x"))
        c.expect_ok()
        resp = http.get("/stats", params={"format": "json", "topic": "nosuch", "include_mem": "false"})
        start = resp.json()["start_time"]
        go = b'{"version":"1.3.0","health":"OK","start_time":%d,"topics":null,"producers":null}'
        assert resp.content == go % start
        # a known topic with a channel filter that matches nothing: an empty list, producers kept
        known = stats(http, topic="known", channel="none", include_mem="false")
        assert known["topics"] == [] and known["producers"][0]["pub_counts"] == [{"topic": "known", "count": 1}]


def test_stats_text_layout(nsqd: Daemon, http: httpx.Client) -> None:
    assert "\nTopics: None\n" in http.get("/stats").text
    with RawClient(nsqd.tcp) as c:
        c.identify(hostname="h", user_agent="ua")
        c.subscribe("text", "ch", rdy=1)
        http.post("/channel/pause", params={"topic": "text", "channel": "ch"})
        text = http.get("/stats").text
    lines = text.splitlines()
    assert lines[0].startswith("nsqd v1.3.0") and lines[1].startswith("start_time ")
    assert lines[2].startswith("uptime ") and "\nHealth: OK\n" in text and "\nMemory:\n" in text
    assert "   [text           ] depth: 0     be-depth: 0     msgs: 0        e2e%: \n" in text
    assert ("   *P [ch                       ] depth: 0     be-depth: 0     inflt: 0    def: 0    "
            "re-q: 0     timeout: 0     msgs: 0        e2e%: \n") in text
    client = next(line for line in lines if line.startswith("        [V2 h:"))
    assert "ua" in client and "state: 3 inflt: 0    rdy: 1    fin: 0" in client


@pytest.fixture
def utc() -> Iterator[None]:
    """The process's local time zone is UTC (as the server's was when Go's answer was recorded)."""
    saved = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    yield
    if saved is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = saved
    time.tzset()


def test_stats_text_is_nsqds_byte_for_byte(utc: None) -> None:
    """Go's printStats for this document (recorded from nsqd v1.3.0's format strings): the
    start time as RFC 3339 in the local zone (``Z`` for UTC), the uptime as a Go duration to
    the nanosecond, e2e percentiles as their humanized values only, clients' and producers'
    connection age truncated to the second."""
    start = 1764053928  # 2025-11-25T06:58:48Z
    client = {"client_id": "c", "hostname": "h", "version": "V2", "remote_address": "127.0.0.1:5555",
              "state": 3, "ready_count": 10, "in_flight_count": 2, "message_count": 7, "finish_count": 5,
              "requeue_count": 0, "connect_ts": start + 3, "user_agent": "go-nsq/1.1.0"}
    producer = {**client, "remote_address": "127.0.0.1:6666", "user_agent": "ua",
                "pub_counts": [{"topic": "orders", "count": 9}]}
    e2e = {"count": 3, "percentiles": [{"quantile": 0.5, "value": 1_234_567},
                                       {"quantile": 0.99, "value": 2_500_000_000}]}
    doc = {"version": "1.3.0", "health": "OK", "start_time": start,
           "topics": [{"topic_name": "orders", "depth": 12, "backend_depth": 3, "message_count": 9, "paused": True,
                       "e2e_processing_latency": e2e,
                       "channels": [{"channel_name": "archive", "depth": 4, "backend_depth": 1, "in_flight_count": 2,
                                     "deferred_count": 1, "requeue_count": 0, "timeout_count": 3, "message_count": 9,
                                     "paused": False, "e2e_processing_latency": {"count": 0, "percentiles": None},
                                     "clients": [client]}]}],
           "producers": [producer]}
    now = (start + 83) * 1_000_000_000 + 456_789_012
    assert format_text(doc, now_ns=now, start_ns=start * 1_000_000_000).split("\n", 1)[1] == (
        "start_time 2025-11-25T06:58:48Z\n"
        "uptime 1m23.456789012s\n"
        "\n"
        "Health: OK\n"
        "\n"
        "Topics:\n"
        "*P [orders         ] depth: 12    be-depth: 3     msgs: 9        e2e%: 1.2ms, 2.5s\n"
        "      [archive                  ] depth: 4     be-depth: 1     inflt: 2    def: 1    re-q: 0     "
        "timeout: 3     msgs: 9        e2e%: \n"
        "        [V2 h:5555 go-nsq/1.1.0  ] state: 3 inflt: 2    rdy: 10   fin: 5        re-q: 0        "
        "msgs: 7        connected: 1m20s\n"
        "\n"
        "Producers:\n"
        "   [V2 h:6666 ua            ] msgs: 9        topics: orders=9 connected: 1m20s\n")
    assert format_text({**doc, "topics": None, "producers": None}, now_ns=now).endswith(
        "\nTopics: None\n\nProducers: None\n")


def test_stats_start_time_outside_utc_carries_the_offset(utc: None) -> None:
    os.environ["TZ"] = "Asia/Kolkata"
    time.tzset()
    assert rfc3339(1764053928) == "2025-11-25T12:28:48+05:30"


def test_metrics_parse_and_match_stats(nsqd: Daemon, http: httpx.Client) -> None:
    with RawClient(nsqd.tcp) as c:
        c.subscribe("prom", "ch", rdy=2)
        http.post("/mpub?topic=prom", content=b"a\nb")
        msg = c.read_message()
        c.send(encode_fin(msg.id))
        http.post("/pub?topic=prom", content=b"c")
        wait_for(lambda: stats(http)["topics"][0]["channels"][0]["in_flight_count"] == 2, what="in flight")
        text = http.get("/metrics").text
        assert http.get("/stats", params={"format": "prometheus"}).status_code == 200
        data = stats(http)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    topic, channel = data["topics"][0], data["topics"][0]["channels"][0]
    t = (("topic", "prom"),)
    tc = (("channel", "ch"), ("topic", "prom"))
    assert samples[("nsq_topic_messages_total", t)] == topic["message_count"] == 3
    assert samples[("nsq_topic_depth", t)] == topic["depth"]
    assert samples[("nsq_channel_in_flight", tc)] == channel["in_flight_count"] == 2
    assert samples[("nsq_channel_messages_total", tc)] == channel["message_count"]
    assert samples[("nsq_channel_clients", tc)] == 1
    assert samples[("nsq_topic_message_bytes_total", t)] == topic["message_bytes"] == 3
    assert samples[("nsq_health", ())] == 1
    assert any(name == "process_resident_memory_bytes" for name, _ in samples)


def test_metrics_of_many_topics_over_both_shards_match_stats(nsqd_factory: Callable[..., Daemon]) -> None:
    """Every topic and channel sample of /metrics is the /stats figure, for topics owned by
    both shards (the scrape merges their documents), paused ones included."""
    nsqd = nsqd_factory("--shards=2")
    with httpx.Client(base_url=nsqd.http_url, timeout=scaled(10)) as http:
        _many_topics_and_their_metrics(http)


def _many_topics_and_their_metrics(http: httpx.Client) -> None:
    for i in range(150):
        topic = f"many-{i:03d}"
        http.post(f"/mpub?topic={topic}", content=b"\n".join([b"m"] * (i % 7 + 1))).raise_for_status()
        http.post(f"/channel/create?topic={topic}&channel=c{i % 3}").raise_for_status()
        if i % 10 == 0:
            http.post(f"/topic/pause?topic={topic}").raise_for_status()
        if i % 15 == 0:
            http.post(f"/channel/pause?topic={topic}&channel=c{i % 3}").raise_for_status()
    text = http.get("/metrics").text
    data = stats(http)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    expected: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for t in data["topics"]:
        tl = (("topic", t["topic_name"]),)
        for key, name in (("depth", "nsq_topic_depth"), ("message_count", "nsq_topic_messages_total"),
                          ("message_bytes", "nsq_topic_message_bytes_total"), ("paused", "nsq_topic_paused")):
            expected[(name, tl)] = float(t[key])
        for c in t["channels"]:
            cl = (("channel", c["channel_name"]), *tl)
            for key, name in (("depth", "nsq_channel_depth"), ("message_count", "nsq_channel_messages_total"),
                              ("in_flight_count", "nsq_channel_in_flight"), ("paused", "nsq_channel_paused")):
                expected[(name, cl)] = float(c[key])
    assert len(data["topics"]) == 150
    assert sum(t["paused"] for t in data["topics"]) == 15
    assert {k: samples.get(k) for k in expected} == expected
    topic_samples = {k for k in samples if k[0].startswith(("nsq_topic_", "nsq_channel_"))}
    assert len(topic_samples) == 150 * (5 + 9)  # no sample for a topic or channel /stats lacks


# --- publishing ------------------------------------------------------------------------------

def test_pub_and_its_errors(http: httpx.Client) -> None:
    expect(http.post("/pub?topic=p", content=b"hello"), 200, body=b"OK")
    assert stats(http)["topics"][0]["depth"] == 1
    expect(http.post("/pub?topic=p", content=b""), 400, "MSG_EMPTY")
    expect(http.post("/pub?topic=bad$", content=b""), 400, "MSG_EMPTY")  # empty before the topic
    expect(http.post("/pub", content=b"x"), 400, "MISSING_ARG_TOPIC")
    expect(http.post("/pub?topic=bad$", content=b"x"), 400, "INVALID_TOPIC")
    expect(http.post("/pub?topic=p&defer=x", content=b"x"), 400, "INVALID_DEFER")
    expect(http.post("/pub?topic=p&defer=-1", content=b"x"), 400, "INVALID_DEFER")
    expect(http.post("/pub?topic=p&defer=3600001", content=b"x"), 400, "INVALID_DEFER")
    expect(http.post("/pub?topic=p&x=%zz", content=b"x"), 400, "INVALID_REQUEST")
    expect(http.post("/pub?topic=%ff", content=b"x"), 400, "INVALID_TOPIC")  # Go parses any bytes
    assert stats(http)["topics"][0]["depth"] == 1


def test_pub_size_limit(nsqd_factory: Callable[..., Daemon]) -> None:
    nsqd = nsqd_factory("--max-msg-size=100", "--max-body-size=1000")
    with httpx.Client(base_url=nsqd.http_url, timeout=scaled(5)) as http:
        expect(http.post("/pub?topic=t", content=b"x" * 101), 413, "MSG_TOO_BIG")

        def chunked() -> Iterator[bytes]:  # no Content-Length: the limit applies while reading
            yield b"x" * 60
            yield b"x" * 60
        expect(http.post("/pub?topic=t", content=chunked()), 413, "MSG_TOO_BIG")
        expect(http.post("/mpub?topic=t", content=b"x\n" * 501), 413, "BODY_TOO_BIG")
        expect(http.post("/mpub?topic=t", content=b"x" * 101 + b"\n"), 413, "MSG_TOO_BIG")
        expect(http.post("/pub?topic=t", content=b"x" * 100), 200, body=b"OK")


def test_pub_defer(nsqd: Daemon, http: httpx.Client) -> None:
    with RawClient(nsqd.tcp) as c:
        c.subscribe("later", "ch", rdy=1)
        expect(http.post("/pub?topic=later&defer=500", content=b"x"), 200, body=b"OK")
        assert stats(http)["topics"][0]["channels"][0]["deferred_count"] == 1
        assert c.read_message().body == b"x"


def test_mpub_text_and_binary(http: httpx.Client) -> None:
    expect(http.post("/mpub?topic=m", content=b"a\nb\n\nc\nd\n"), 200, body=b"OK")
    assert stats(http)["topics"][0]["depth"] == 4
    binary = struct.pack(">i", 2) + struct.pack(">i", 1) + b"x" + struct.pack(">i", 2) + b"yz"
    expect(http.post("/mpub?topic=m&binary=true", content=binary), 200, body=b"OK")
    expect(http.post("/mpub?topic=m&binary=yes", content=binary), 200, body=b"OK")  # unknown = binary
    assert stats(http)["topics"][0]["depth"] == 8
    expect(http.post("/mpub?topic=m&binary=true", content=struct.pack(">i", 0)), 413, "BAD_BODY")
    expect(http.post("/mpub?topic=m&binary=1", content=struct.pack(">ii", 1, 0)), 413, "BAD_MESSAGE")
    expect(http.post("/mpub", content=b"a"), 400, "MISSING_ARG_TOPIC")
    expect(http.post("/mpub?topic=bad$", content=b"a"), 400, "INVALID_TOPIC")


# --- topics and channels ----------------------------------------------------------------------

def test_topic_and_channel_lifecycle(http: httpx.Client) -> None:
    expect(http.post("/topic/create"), 400, "MISSING_ARG_TOPIC")
    expect(http.post("/topic/create?topic=bad$"), 400, "INVALID_TOPIC")
    expect(http.post("/topic/create?topic=life"), 200, body=b"")
    expect(http.post("/channel/create?topic=life"), 400, "MISSING_ARG_CHANNEL")
    expect(http.post("/channel/create?channel=c"), 400, "MISSING_ARG_TOPIC")
    expect(http.post("/channel/create?topic=bad$&channel=c"), 400, "INVALID_ARG_TOPIC")
    expect(http.post("/channel/create?topic=life&channel=bad$"), 400, "INVALID_ARG_CHANNEL")
    expect(http.post("/channel/create?topic=nope&channel=c"), 404, "TOPIC_NOT_FOUND")
    expect(http.post("/channel/create?topic=life&channel=c"), 200, body=b"")
    assert [c["channel_name"] for c in stats(http)["topics"][0]["channels"]] == ["c"]
    for action in ("pause", "unpause", "empty", "delete"):
        expect(http.post(f"/channel/{action}?topic=life&channel=other"), 404, "CHANNEL_NOT_FOUND")
        expect(http.post(f"/channel/{action}?topic=nope&channel=c"), 404, "TOPIC_NOT_FOUND")
    expect(http.post("/channel/pause?topic=life&channel=c"), 200, body=b"")
    assert stats(http)["topics"][0]["channels"][0]["paused"] is True
    expect(http.post("/channel/unpause?topic=life&channel=c"), 200, body=b"")
    expect(http.post("/channel/delete?topic=life&channel=c"), 200, body=b"")
    assert stats(http)["topics"][0]["channels"] == []
    for action in ("pause", "unpause", "empty", "delete"):
        expect(http.post(f"/topic/{action}"), 400, "MISSING_ARG_TOPIC")
        expect(http.post(f"/topic/{action}?topic=nope"), 404, "TOPIC_NOT_FOUND")
    expect(http.post("/topic/empty?topic=bad$"), 400, "INVALID_TOPIC")
    expect(http.post("/topic/pause?topic=life"), 200, body=b"")
    assert stats(http)["topics"][0]["paused"] is True
    expect(http.post("/topic/delete?topic=life"), 200, body=b"")
    assert stats(http)["topics"] == []


def test_pausing_holds_messages(nsqd: Daemon, http: httpx.Client) -> None:
    with RawClient(nsqd.tcp) as c:
        c.subscribe("pause", "ch", rdy=5)
        http.post("/channel/pause?topic=pause&channel=ch")
        http.post("/pub?topic=pause", content=b"held")
        c.expect_nothing(0.3)
        assert stats(http)["topics"][0]["channels"][0]["depth"] == 1
        http.post("/channel/unpause?topic=pause&channel=ch")
        assert c.read_message().body == b"held"
        http.post("/topic/pause?topic=pause")
        http.post("/pub?topic=pause", content=b"at topic")
        topic = stats(http)["topics"][0]
        assert (topic["depth"], topic["channels"][0]["depth"]) == (1, 0)
        http.post("/topic/unpause?topic=pause")
        assert c.read_message().body == b"at topic"


def test_empty_channel_drops_queued_in_flight_and_deferred(nsqd: Daemon, http: httpx.Client) -> None:
    with RawClient(nsqd.tcp) as c:
        c.subscribe("empty", "ch", rdy=1)
        http.post("/mpub?topic=empty", content=b"a\nb\nc")
        http.post("/pub?topic=empty&defer=60000", content=b"d")
        m = c.read_message()
        ch = stats(http)["topics"][0]["channels"][0]
        assert (ch["depth"], ch["in_flight_count"], ch["deferred_count"]) == (2, 1, 1)
        expect(http.post("/channel/empty?topic=empty&channel=ch"), 200, body=b"")
        ch = stats(http)["topics"][0]["channels"][0]
        assert (ch["depth"], ch["in_flight_count"], ch["deferred_count"]) == (0, 0, 0)
        assert ch["clients"][0]["in_flight_count"] == 0
        c.send(encode_fin(m.id))  # what it held is gone: nsqd's answer
        c.expect_error(f"E_FIN_FAILED FIN {m.id.decode()} failed ID not in flight")
        c.send(encode_req(m.id, 0))
        c.expect_error(f"E_REQ_FAILED REQ {m.id.decode()} failed ID not in flight")
        c.send(encode_touch(m.id))
        c.expect_error(f"E_TOUCH_FAILED TOUCH {m.id.decode()} failed ID not in flight")
        address = "{}:{}".format(*c.sock.getsockname())
    nsqd.wait_for_log(rf"client\({address}\) closed")
    assert "Traceback" not in nsqd.output


def test_deleting_with_messages_in_flight_disconnects_the_consumers_and_forgets_what_they_held(
        nsqd_factory: Callable[..., Daemon]) -> None:
    """As nsqd, a deleted channel (or each channel of a deleted topic) closes its consumers'
    connections and drops what they held in flight or deferred; their connections closing,
    and the timeouts and due times of those messages, then do nothing. Each call comes on a
    fresh connection, handed to the two shards in turn, so some are proxied to the owner."""
    nsqd = nsqd_factory("--shards=2", "--msg-timeout=1s")
    consumers = {name: RawClient(nsqd.tcp) for name in ("a", "b", "c", "d")}
    witness = RawClient(nsqd.tcp)
    try:
        for name, c in consumers.items():
            c.subscribe("doomed", name, rdy=5)
        witness.subscribe("witness", "w", rdy=1)
        httpx.post(f"{nsqd.http_url}/mpub?topic=doomed", content=b"m0\nm1\nm2\nm3").raise_for_status()
        httpx.post(f"{nsqd.http_url}/pub?topic=witness", content=b"w").raise_for_status()
        for c in consumers.values():
            held = c.read_messages(4)
            c.send(encode_req(held[0].id, 300))  # deferred, in place in the log
        witness.read_message()  # times out after the others held theirs
        for path in ("/channel/delete?topic=doomed&channel=a", "/channel/delete?topic=doomed&channel=b",
                     "/topic/delete?topic=doomed"):
            expect(httpx.post(nsqd.http_url + path), 200, body=b"")
        for c in consumers.values():
            address = "{}:{}".format(*c.sock.getsockname())
            c.expect_closed()
            nsqd.wait_for_log(rf"client\({address}\) closed")
        wait_for(lambda: httpx.get(f"{nsqd.http_url}/stats", params={"format": "json", "topic": "witness"}).json()
                 ["topics"][0]["channels"][0]["timeout_count"] == 1, timeout=10, what="the witness's timeout")
    finally:
        for c in (*consumers.values(), witness):
            c.close()
    assert "Traceback" not in nsqd.output and "Exception in callback" not in nsqd.output, nsqd.output[-3000:]
    with RawClient(nsqd.tcp) as c:  # the node serves the name again, from scratch
        c.subscribe("doomed", "a", rdy=5)
        httpx.post(f"{nsqd.http_url}/pub?topic=doomed", content=b"again").raise_for_status()
        assert c.read_message().body == b"again"


# --- config ------------------------------------------------------------------------------------

def test_config_get_and_put(http: httpx.Client) -> None:
    assert http.get("/config/nsqlookupd_tcp_addresses").json() == []
    assert http.get("/config/max_rdy_count").json() == 2500
    assert http.get("/config/msg_timeout").json() == 60_000_000_000
    expect(http.get("/config/no_such_option"), 400, "INVALID_OPTION")
    resp = http.put("/config/log_level", content=b"fatal")
    assert resp.status_code == 200 and resp.json() == 5  # nsqd's lg.FATAL
    assert http.get("/config/broadcast_address").text  # strings come back raw, as nsqd's V1 API does
    expect(http.put("/config/log_level", content=b"bad"), 400, "INVALID_VALUE")
    expect(http.put("/config/log_level", content=b""), 413, "INVALID_VALUE")
    expect(http.put("/config/max_rdy_count", content=b"1"), 400, "INVALID_OPTION")
    expect(http.put("/config/nsqlookupd_tcp_addresses", content=b"{}"), 400, "INVALID_VALUE")


# --- with a real client ---------------------------------------------------------------------

def test_http_publish_pynsq_consume(nsqd: Daemon, http: httpx.Client, clients: list[ClientProc]) -> None:
    for i in range(50):
        http.post("/pub?topic=mixed", content=f"msg-{i}".encode())
    http.post("/mpub?topic=mixed", content="\n".join(f"msg-{i}" for i in range(50, 100)).encode())
    sub = consume(clients, "pynsq", nsqd, "mixed", "ch", 100, "--max-in-flight", "20")
    assert sub.finish() == 0, sub.err.decode()
    assert sorted(m["body"] for m in sub.messages()) == sorted(f"msg-{i}" for i in range(100))
