"""statsd pushes (to a real UDP listener), e2e processing latency in /stats, /metrics and
statsd, and the HTTPS API (--https-address, --tls-required for HTTP)."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from pynsqd.supervisor.statsd import StatsdLines, packets, statsd_prefix
from pynsqd.wire.commands import encode_fin, encode_pub, encode_rdy, encode_req, encode_sub
from testbed.certs import Certs
from testbed.harness import Daemon, scaled, wait_for
from tests.support.rawclient import RawClient

pytestmark = pytest.mark.slow


@pytest.fixture
def udp() -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    yield sock
    sock.close()


class Statsd:
    """Collects datagrams; ``counters`` sums deltas, ``gauges`` keeps the latest value."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.datagrams: list[bytes] = []
        self.counters: dict[str, int] = {}
        self.gauges: dict[str, int] = {}

    def poll(self) -> None:
        self.sock.settimeout(0.05)
        try:
            while True:
                data = self.sock.recv(65536)
                self.datagrams.append(data)
                for line in data.decode().splitlines():
                    name, _, rest = line.partition(":")
                    value, _, kind = rest.partition("|")
                    if kind == "c":
                        self.counters[name] = self.counters.get(name, 0) + int(value)
                    else:
                        assert kind == "g", line
                        self.gauges[name] = int(value)
        except TimeoutError:
            pass


def stats(nsqd: Daemon) -> dict[str, Any]:
    return dict(httpx.get(f"{nsqd.http_url}/stats", params={"format": "json"}, timeout=5).json())


# --- statsd ----------------------------------------------------------------------------------

def test_statsd_lines_counters_are_deltas_and_packets_hold_whole_lines() -> None:
    assert statsd_prefix("nsq.%s", "10.0.0.1", 4151) == "nsq.10_0_0_1_4151."
    assert statsd_prefix("custom", "h", 1) == "custom."
    topic = {"topic_name": "t", "message_count": 5, "message_bytes": 50, "depth": 3, "backend_depth": 0,
             "e2e_processing_latency": {"count": 0, "percentiles": None}, "channels": []}
    lines = StatsdLines("p.", mem_stats=False)
    assert lines.lines({"topics": [topic]})[:2] == ["p.topic.t.message_count:5|c", "p.topic.t.message_bytes:50|c"]
    topic["message_count"] = 7
    assert lines.lines({"topics": [topic]})[0] == "p.topic.t.message_count:2|c"
    out = packets(["a" * 10, "b" * 10, "c" * 30], 25)
    assert out == [b"a" * 10 + b"\n" + b"b" * 10 + b"\n", b"c" * 30 + b"\n"]


def test_statsd_receives_nsqs_names_and_correct_counts(nsqd_factory: Callable[..., Daemon],
                                                       udp: socket.socket) -> None:
    port = udp.getsockname()[1]
    nsqd = nsqd_factory(f"--statsd-address=127.0.0.1:{port}", "--statsd-interval=200ms",
                        "--statsd-udp-packet-size=300", "--broadcast-address=127.0.0.1",
                        "--e2e-processing-latency-percentile=0.5,0.99")
    prefix = f"nsq.127_0_0_1_{nsqd.http[1]}."
    with RawClient(nsqd.tcp) as c:
        for i in range(30):
            c.send(encode_pub("st", f"m{i}".encode()))
            c.expect_ok()
        c.send(encode_pub("st#ephemeral", b"e"))
        c.expect_ok()
        c.send(encode_sub("st", "ch"))
        c.expect_ok()
        c.send(encode_rdy(10))
        msgs = c.read_messages(10)
        c.send(encode_rdy(0))  # RDY is a max-in-flight: stop deliveries before finishing
        for m in msgs[:8]:
            c.send(encode_fin(m.id))
        for m in msgs[8:]:
            c.send(encode_req(m.id, 60000))
        wait_for(lambda: stats(nsqd)["topics"][0]["channels"][0]["deferred_count"] == 2)
        t, ch = f"{prefix}topic.st", f"{prefix}topic.st.channel.ch"
        received = Statsd(udp)
        expected_gauges = {f"{t}.depth": 0, f"{ch}.depth": 20, f"{ch}.in_flight_count": 0,
                           f"{ch}.deferred_count": 2, f"{ch}.clients": 1, f"{ch}.backend_depth": 0}

        def settled() -> bool:
            received.poll()
            return (received.counters.get(f"{t}.message_count") == 30
                    and received.counters.get(f"{ch}.message_count") == 30
                    and received.counters.get(f"{ch}.requeue_count") == 2
                    and all(received.gauges.get(k) == v for k, v in expected_gauges.items()))
        try:
            wait_for(settled, timeout=10, interval=0.01)
        except AssertionError:
            raise AssertionError(f"statsd figures {received.counters} {received.gauges}") from None
    assert received.counters[f"{t}.message_bytes"] == sum(len(f"m{i}") for i in range(30))
    assert received.counters[f"{ch}.timeout_count"] == 0
    for name in (f"{t}.backend_depth", f"{t}.e2e_processing_latency_50", f"{t}.e2e_processing_latency_99",
                 f"{ch}.e2e_processing_latency_99", f"{prefix}mem.heap_objects", f"{prefix}mem.next_gc_bytes"):
        assert name in received.gauges, name
    assert f"{prefix}mem.gc_runs" in received.counters
    assert received.counters[f"{prefix}topic.st#ephemeral.message_count"] == 1
    assert all(len(d) <= 300 and d.endswith(b"\n") for d in received.datagrams)
    assert nsqd.wait_for_log("STATSD: pushing stats to 127.0.0.1:")


def test_statsd_without_mem_stats_and_without_ephemeral(nsqd_factory: Callable[..., Daemon],
                                                        udp: socket.socket) -> None:
    port = udp.getsockname()[1]
    nsqd = nsqd_factory(f"--statsd-address=127.0.0.1:{port}", "--statsd-interval=100ms",
                        "--statsd-mem-stats=false", "--statsd-exclude-ephemeral", "--statsd-prefix=app")
    httpx.post(f"{nsqd.http_url}/pub", params={"topic": "keep"}, content=b"x", timeout=5)
    httpx.post(f"{nsqd.http_url}/pub", params={"topic": "drop#ephemeral"}, content=b"x", timeout=5)
    received = Statsd(udp)

    def pushed() -> bool:
        received.poll()
        return received.counters.get("app.topic.keep.message_count") == 1
    wait_for(pushed, timeout=10, interval=0.01)
    names = set(received.counters) | set(received.gauges)
    assert not any("mem." in n or "ephemeral" in n for n in names), names


# --- end-to-end processing latency -----------------------------------------------------------

def latency(nsqd: Daemon) -> tuple[dict[str, Any], dict[str, Any]]:
    topic = stats(nsqd)["topics"][0]
    return topic["e2e_processing_latency"], topic["channels"][0]["e2e_processing_latency"]


def p(e2e: dict[str, Any], quantile: float) -> float:
    return float(next(x["value"] for x in e2e["percentiles"] if x["quantile"] == quantile))


def test_latency_quantiles_move_when_the_consumer_slows_down(nsqd_factory: Callable[..., Daemon]) -> None:
    nsqd = nsqd_factory("--e2e-processing-latency-percentile=0.5",
                        "--e2e-processing-latency-percentile=0.99")
    with RawClient(nsqd.tcp) as c:
        c.send(encode_sub("lat", "ch"))
        c.expect_ok()
        topic_e2e, channel_e2e = latency(nsqd)
        assert channel_e2e == {"count": 0, "percentiles": [{"quantile": 0.5, "value": 0.0},
                                                           {"quantile": 0.99, "value": 0.0}]}
        # Go writes a float64 with no fraction without ".0" (encoding/json): recorded bytes
        raw = httpx.get(f"{nsqd.http_url}/stats", params={"format": "json"}, timeout=5).content
        assert b'"e2e_processing_latency":{"count":0,"percentiles":[{"quantile":0.5,"value":0},' \
               b'{"quantile":0.99,"value":0}]}' in raw
        c.send(encode_pub("lat", b"warm"))  # after the stats calls: they are not its latency
        c.expect_ok()
        c.send(encode_rdy(1))
        c.send(encode_fin(c.read_message().id))
        for i in range(20):  # a fast consumer: FIN on arrival
            c.send(encode_pub("lat", f"fast{i}".encode()))
            c.expect_ok()
            c.send(encode_fin(c.read_message().id))
        wait_for(lambda: latency(nsqd)[1]["count"] == 21)
        fast_p99 = p(latency(nsqd)[1], 0.99)
        assert 0 < fast_p99 < scaled(0.25) * 1e9
        for i in range(5):  # a slow consumer: holds each message 300ms before FIN
            c.send(encode_pub("lat", f"slow{i}".encode()))
            c.expect_ok()
            msg = c.read_message()
            c.expect_nothing(0.3)  # the hold is the stimulus, not a synchronisation
            c.send(encode_fin(msg.id))
        wait_for(lambda: latency(nsqd)[1]["count"] == 26)
    topic_e2e, channel_e2e = latency(nsqd)
    assert p(channel_e2e, 0.99) >= 0.3e9 > fast_p99
    assert p(channel_e2e, 0.5) < 0.3e9  # most messages were still fast
    assert topic_e2e["count"] == 26 and p(topic_e2e, 0.99) == p(channel_e2e, 0.99)
    metrics = httpx.get(f"{nsqd.http_url}/metrics", timeout=5).text
    assert 'nsq_channel_e2e_processing_latency_seconds{channel="ch",quantile="0.99",topic="lat"}' in metrics
    text = httpx.get(f"{nsqd.http_url}/stats", timeout=5).text
    # nsqd's quantile.Result.String: only the values, humanized (NanoSecondToHuman), comma-joined
    assert re.search(r"\] depth: 0     be-depth: 0     inflt: 0    def: 0    re-q: 0     timeout: 0     "
                     r"msgs: 26       e2e%: \d+\.\d(ns|us|ms|s), \d+\.\d(ns|us|ms|s)\n", text), text


def test_no_percentiles_means_null_percentiles(nsqd: Daemon) -> None:
    with RawClient(nsqd.tcp) as c:
        c.send(encode_sub("none", "ch"))
        c.expect_ok()
        topic_e2e, channel_e2e = latency(nsqd)
    assert topic_e2e == channel_e2e == {"count": 0, "percentiles": None}


# --- HTTPS -----------------------------------------------------------------------------------

def https(nsqd: Daemon, certs: Certs, path: str, cert: str = "", **kw: Any) -> httpx.Response:
    nsqd.wait_for_log("HTTPS: listening on")
    port = nsqd.address("HTTPS")[1]
    with httpx.Client(verify=certs.client_context(cert), timeout=5) as client:
        return client.request(kw.pop("method", "GET"), f"https://localhost:{port}{path}", **kw)


def test_https_serves_the_same_api(nsqd_factory: Callable[..., Daemon], certs: Certs) -> None:
    nsqd = nsqd_factory(*certs.server_args())
    nsqd.wait_for_log("HTTPS: listening on 127.0.0.1:")
    assert https(nsqd, certs, "/ping").text == "OK"
    assert https(nsqd, certs, "/pub?topic=s", method="POST", content=b"x").text == "OK"
    assert httpx.get(f"{nsqd.http_url}/ping", timeout=5).text == "OK"  # plain HTTP still served


def test_tls_required_turns_plain_http_away(nsqd_factory: Callable[..., Daemon], certs: Certs) -> None:
    nsqd = nsqd_factory(*certs.server_args("--tls-required=true"))
    nsqd.wait_for_log("HTTPS: listening on")
    resp = httpx.post(f"{nsqd.http_url}/pub", params={"topic": "t"}, content=b"x", timeout=5)
    assert resp.status_code == 403
    assert resp.text == f'{{"message": "TLS_REQUIRED", "https_port": {nsqd.address("HTTPS")[1]}}}'
    assert https(nsqd, certs, "/pub?topic=t", method="POST", content=b"x").text == "OK"
    nsqd2 = nsqd_factory(*certs.server_args("--tls-required=tcp-https"))
    assert httpx.post(f"{nsqd2.http_url}/pub", params={"topic": "t"}, content=b"x", timeout=5).text == "OK"


def test_https_client_certificate_policy(nsqd_factory: Callable[..., Daemon], certs: Certs) -> None:
    nsqd = nsqd_factory(*certs.server_args("--tls-client-auth-policy=require-verify",
                                           f"--tls-root-ca-file={certs.ca_file}"))
    with pytest.raises(httpx.HTTPError):
        https(nsqd, certs, "/ping")
    assert https(nsqd, certs, "/ping", cert="client").text == "OK"
    assert httpx.get(f"{nsqd.http_url}/ping", timeout=5).status_code == 403  # policy forces tls-required


def test_https_is_not_started_without_a_certificate(nsqd_factory: Callable[..., Daemon]) -> None:
    nsqd = nsqd_factory("--https-address=127.0.0.1:0")
    assert "HTTPS" not in nsqd.addresses


def test_statsd_spreads_a_push_over_the_interval_less_one_second(nsqd_factory: Callable[..., Daemon],
                                                                  udp: socket.socket) -> None:
    port = udp.getsockname()[1]
    nsqd_factory(f"--statsd-address=127.0.0.1:{port}", "--statsd-interval=1600ms",
                 "--statsd-udp-packet-size=120")  # mem stats alone make several datagrams
    udp.settimeout(scaled(10))
    first = udp.recv(65536)
    assert first.startswith(b"nsq.")
    started = time.monotonic()
    last = started
    while True:  # the rest of this push: datagrams until mem.gc_runs, the last line
        data = udp.recv(65536)
        last = time.monotonic()
        if b"mem.gc_runs" in data:
            break
    assert last - started >= 0.3  # 0.6s spread over ~9 datagrams; nothing sent early
