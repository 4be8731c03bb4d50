"""Protocol V2 against the real server process, frame by frame (NSQ's protocol_v2_test.go
behaviours)."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from pynsqd.wire.commands import (
    CLS,
    NOP,
    encode_auth,
    encode_dpub,
    encode_fin,
    encode_identify,
    encode_mpub,
    encode_pub,
    encode_rdy,
    encode_req,
    encode_sub,
    encode_touch,
)
from testbed.harness import Daemon, connect, wait_for
from tests.support.rawclient import RawClient

pytestmark = pytest.mark.fast


@pytest.fixture(params=[1, 2], ids=lambda n: f"shards-{n}")
def nsqd(request: pytest.FixtureRequest, nsqd_factory: Callable[..., Daemon]) -> Daemon:
    """Every protocol test that takes the default node runs on one shard and on two (a
    topic's owner and the relay from the other shard)."""
    return nsqd_factory(f"--shards={request.param}")


def stats(nsqd: Daemon, **params: str) -> dict[str, Any]:
    query = {"format": "json", **params}
    return dict(httpx.get(f"{nsqd.http_url}/stats", params=query, timeout=5).json())


def channel_stats(nsqd: Daemon, topic: str, channel: str) -> dict[str, Any]:
    for t in stats(nsqd)["topics"]:
        if t["topic_name"] == topic:
            for c in t["channels"]:
                if c["channel_name"] == channel:
                    return dict(c)
    raise AssertionError(f"no channel {topic}:{channel}")


def topic_stats(nsqd: Daemon, topic: str) -> dict[str, Any] | None:
    return next((t for t in stats(nsqd)["topics"] if t["topic_name"] == topic), None)


def publish(nsqd: Daemon, topic: str, *bodies: bytes) -> None:
    with RawClient(nsqd.tcp) as c:
        for body in bodies:
            c.send(encode_pub(topic, body))
            c.expect_ok()


# --- connecting ----------------------------------------------------------------------------

def test_bad_magic_gets_e_bad_protocol_and_close(nsqd: Daemon) -> None:
    with RawClient(nsqd.tcp, magic=b"  V9") as c:
        c.expect_error("E_BAD_PROTOCOL")
        c.expect_closed()


def test_tcp_client_on_http_port_gets_http_back(nsqd: Daemon) -> None:
    sock = connect(nsqd.http)
    sock.sendall(b"  V2IDENTIFY\n")
    data = sock.recv(100)
    sock.close()
    assert data.startswith(b"HTTP")


def test_identify_without_feature_negotiation_is_ok(nsqd: Daemon) -> None:
    with RawClient(nsqd.tcp) as c:
        c.send(encode_identify(b'{"client_id": "a"}'))
        c.expect_ok()


def test_identify_response_has_nsq_keys(nsqd: Daemon) -> None:
    with RawClient(nsqd.tcp) as c:
        data = c.identify(msg_timeout=5000, output_buffer_size=2048, output_buffer_timeout=100)
    assert list(data) == ["max_rdy_count", "version", "max_msg_timeout", "msg_timeout", "tls_v1",
                          "deflate", "deflate_level", "max_deflate_level", "snappy", "sample_rate",
                          "auth_required", "output_buffer_size", "output_buffer_timeout"]
    assert data["max_rdy_count"] == 2500 and data["version"] == "1.3.0"
    assert data["max_msg_timeout"] == 900000 and data["msg_timeout"] == 5000
    assert (data["output_buffer_size"], data["output_buffer_timeout"]) == (2048, 100)
    assert not data["tls_v1"] and not data["snappy"] and not data["deflate"]


@pytest.mark.parametrize("fields,error", [
    ({"heartbeat_interval": 100}, "E_BAD_BODY IDENTIFY heartbeat interval (100) is invalid"),
    ({"heartbeat_interval": 60001}, "E_BAD_BODY IDENTIFY heartbeat interval (60001) is invalid"),
    ({"output_buffer_size": 65537}, "E_BAD_BODY IDENTIFY output buffer size (65537) is invalid"),
    ({"output_buffer_timeout": 30001}, "E_BAD_BODY IDENTIFY output buffer timeout (30001) is invalid"),
    ({"sample_rate": 100}, "E_BAD_BODY IDENTIFY sample rate (100) is invalid"),
    ({"msg_timeout": 999}, "E_BAD_BODY IDENTIFY msg timeout (999) is invalid"),
    ({"heartbeat_interval": "x"}, "E_BAD_BODY IDENTIFY failed to decode JSON body"),
])
def test_identify_rejects_bad_values(nsqd: Daemon, fields: dict[str, Any], error: str) -> None:
    with RawClient(nsqd.tcp) as c:
        c.send(encode_identify(json.dumps({"feature_negotiation": True, **fields}).encode()))
        c.expect_error(error)
        c.expect_closed()


def test_identify_accepts_max_heartbeat_and_repeats_before_sub(nsqd: Daemon) -> None:
    with RawClient(nsqd.tcp) as c:
        assert c.identify(heartbeat_interval=60000)["max_rdy_count"] == 2500
        c.identify(output_buffer_size=-1, output_buffer_timeout=-1)
        c.identify(output_buffer_size=0, output_buffer_timeout=0)
        c.subscribe("t", "c")
        c.send(encode_identify(b"{}"))
        c.expect_error("E_INVALID cannot IDENTIFY in current state")
        c.expect_closed()


# --- publish and consume ---------------------------------------------------------------------

def test_basic_pub_sub_delivers_with_attempts_1(nsqd: Daemon) -> None:
    publish(nsqd, "basic", b"hello")
    with RawClient(nsqd.tcp) as c:
        c.identify()
        c.subscribe("basic", "ch", rdy=1)
        msg = c.read_message()
        assert (msg.body, msg.attempts) == (b"hello", 1)
        assert len(msg.id) == 16 and int(msg.id, 16) > 0
        assert abs(msg.timestamp / 1e9 - time.time()) < 60


def test_topic_keeps_messages_until_first_channel(nsqd: Daemon) -> None:
    publish(nsqd, "waiting", b"1", b"2", b"3")
    topic = topic_stats(nsqd, "waiting")
    assert topic is not None and topic["depth"] == 3 and topic["channels"] == []
    with RawClient(nsqd.tcp) as c:
        c.subscribe("waiting", "ch", rdy=10)
        assert sorted(m.body for m in c.read_messages(3)) == [b"1", b"2", b"3"]
    assert topic_stats(nsqd, "waiting")["depth"] == 0  # type: ignore[index]


def test_every_channel_gets_a_copy(nsqd: Daemon) -> None:
    with RawClient(nsqd.tcp) as a, RawClient(nsqd.tcp) as b:
        a.subscribe("fan", "one", rdy=5)
        b.subscribe("fan", "two", rdy=5)
        publish(nsqd, "fan", b"x")
        assert a.read_message().body == b"x"
        assert b.read_message().body == b"x"


def test_consumers_of_one_channel_share_its_messages(nsqd: Daemon) -> None:
    clients = [RawClient(nsqd.tcp) for _ in range(3)]
    try:
        for c in clients:
            c.subscribe("shared", "ch", rdy=100)
        bodies = [b"m%d" % i for i in range(300)]
        with RawClient(nsqd.tcp) as p:
            p.send(encode_mpub("shared", bodies))
            p.expect_ok()
        got: list[bytes] = []
        per_client = [0, 0, 0]

        def drain() -> bool:
            for i, c in enumerate(clients):
                try:
                    msg = c.read_message(timeout=0.05)
                except TimeoutError:
                    continue
                got.append(msg.body)
                per_client[i] += 1
                c.send(encode_fin(msg.id))
            return len(got) == len(bodies)
        wait_for(drain, timeout=10, what="all 300 messages")
        assert sorted(got) == sorted(bodies)
        assert all(n > 0 for n in per_client), per_client
    finally:
        for c in clients:
            c.close()


def test_mpub_is_all_or_nothing(nsqd_factory: Callable[..., Daemon]) -> None:
    nsqd = nsqd_factory("--max-msg-size=100")
    with RawClient(nsqd.tcp) as c:
        c.send(encode_mpub("atomic", [b"ok"] * 3 + [b"x" * 101]))
        c.expect_error("E_BAD_MESSAGE MPUB message too big 101 > 100")
    assert topic_stats(nsqd, "atomic") is None
    with RawClient(nsqd.tcp) as c:
        c.send(encode_mpub("atomic", [b"a", b"b"]))
        c.expect_ok()
    assert topic_stats(nsqd, "atomic")["depth"] == 2  # type: ignore[index]


def test_message_ids_are_unique(nsqd: Daemon) -> None:
    with RawClient(nsqd.tcp) as c:
        c.subscribe("ids", "ch", rdy=2500)
        with RawClient(nsqd.tcp) as p:
            for _ in range(5):
                p.send(encode_mpub("ids", [b"x"] * 1000))
                p.expect_ok()
        ids = set()
        for _ in range(5000):
            msg = c.read_message()
            ids.add(msg.id)
            c.send(encode_fin(msg.id))
    assert len(ids) == 5000


def test_size_limits(nsqd_factory: Callable[..., Daemon]) -> None:
    nsqd = nsqd_factory("--max-msg-size=100", "--max-body-size=1000")
    cases = [
        (encode_pub("t", b"a" * 95), None),
        (encode_pub("t", b"a" * 105), "E_BAD_MESSAGE PUB message too big 105 > 100"),
        (encode_pub("t", b""), "E_BAD_MESSAGE PUB invalid message body size 0"),
        (encode_mpub("t", [b"a" * 100] * 5), None),
        (encode_mpub("t", [b"a" * 100] * 11), "E_BAD_BODY MPUB body too big 1148 > 1000"),
        (encode_mpub("t", [b"a" * 100] * 5 + [b""]), "E_BAD_MESSAGE MPUB invalid message(5) body size 0"),
        (encode_mpub("t", [b"a" * 101] * 5), "E_BAD_MESSAGE MPUB message too big 101 > 100"),
    ]
    for frame, error in cases:
        with RawClient(nsqd.tcp) as c:
            c.send(frame)
            if error is None:
                c.expect_ok()
            else:
                c.expect_error(error)
                c.expect_closed()


@pytest.mark.parametrize("frame,error", [
    (b"ASDF\n", "E_INVALID invalid command ASDF"),
    (b"\n", "E_INVALID invalid command "),
    (b"PUB\n", "E_INVALID PUB insufficient number of parameters"),
    (b"PUB a$\n", 'E_BAD_TOPIC PUB topic name "a$" is not valid'),
    (b"MPUB a$\n", 'E_BAD_TOPIC E_BAD_TOPIC MPUB topic name "a$" is not valid'),
    (b"DPUB t x\n", "E_INVALID DPUB could not parse timeout x"),
    (b"DPUB t 3600001\n", "E_INVALID DPUB timeout 3600001 out of range 0-3600000"),
    (b"SUB t\n", "E_INVALID SUB insufficient number of parameters"),
    (b"SUB t:x c\n", 'E_BAD_TOPIC SUB topic name "t:x" is not valid'),
    (b"SUB t c$\n", 'E_BAD_CHANNEL SUB channel name "c$" is not valid'),
    (b"RDY 1\n", "E_INVALID cannot RDY in current state"),
    (b"FIN 0123456789abcdef\n", "E_INVALID cannot FIN in current state"),
    (b"REQ 0123456789abcdef 0\n", "E_INVALID cannot REQ in current state"),
    (b"TOUCH 0123456789abcdef\n", "E_INVALID cannot TOUCH in current state"),
    (b"CLS\n", "E_INVALID cannot CLS in current state"),
    (encode_auth(b"secret"), "E_AUTH_DISABLED AUTH disabled"),
])
def test_fatal_errors_close_the_connection(nsqd: Daemon, frame: bytes, error: str) -> None:
    with RawClient(nsqd.tcp) as c:
        c.send(frame)
        c.expect_error(error)
        c.expect_closed()
    with RawClient(nsqd.tcp) as c:  # and the server carries on
        c.send(NOP + encode_pub("alive", b"x"))
        c.expect_ok()


def test_sub_state_and_heartbeat_errors(nsqd: Daemon) -> None:
    with RawClient(nsqd.tcp) as c:
        c.identify(heartbeat_interval=-1)
        c.send(encode_sub("t", "c"))
        c.expect_error("E_INVALID cannot SUB with heartbeats disabled")
        c.expect_closed()
    with RawClient(nsqd.tcp) as c:
        c.subscribe("t", "c")
        c.send(encode_sub("t", "c"))
        c.expect_error("E_INVALID cannot SUB in current state")
        c.expect_closed()


def test_max_channel_consumers(nsqd_factory: Callable[..., Daemon]) -> None:
    nsqd = nsqd_factory("--max-channel-consumers=1")
    with RawClient(nsqd.tcp) as a, RawClient(nsqd.tcp) as b:
        a.subscribe("limited", "ch")
        b.send(encode_sub("limited", "ch"))
        b.expect_error("E_SUB_FAILED SUB failed consumers for limited:ch exceeds limit of 1")
        b.expect_closed()


# --- RDY, FIN, REQ, TOUCH, CLS ------------------------------------------------------------------

def test_rdy_limits_in_flight_and_rdy_0_stops_delivery(nsqd: Daemon) -> None:
    publish(nsqd, "rdy", *[b"%d" % i for i in range(5)])
    with RawClient(nsqd.tcp) as c:
        c.subscribe("rdy", "ch", rdy=2)
        first = c.read_messages(2)
        c.expect_nothing(0.3)
        assert channel_stats(nsqd, "rdy", "ch")["in_flight_count"] == 2
        c.send(encode_fin(first[0].id))
        third = c.read_message()
        c.send(encode_rdy(0) + encode_fin(first[1].id) + encode_fin(third.id))
        c.expect_nothing(0.3)
        c.send(encode_rdy(5))
        assert len(c.read_messages(2)) == 2


def test_max_rdy_count(nsqd_factory: Callable[..., Daemon]) -> None:
    nsqd = nsqd_factory("--max-rdy-count=50")
    with RawClient(nsqd.tcp) as c:
        assert c.identify()["max_rdy_count"] == 50
        c.subscribe("t", "c", rdy=50)
        c.send(encode_rdy(51))
        c.expect_error("E_INVALID RDY count 51 out of range 0-50")
        c.expect_closed()
    with RawClient(nsqd.tcp) as c:
        c.subscribe("t", "c")
        c.send(b"RDY -1\n")
        c.expect_error("E_INVALID RDY could not parse count -1")


def test_fin_errors_are_not_fatal(nsqd: Daemon) -> None:
    publish(nsqd, "fin", b"x")
    with RawClient(nsqd.tcp) as a, RawClient(nsqd.tcp) as b:
        a.subscribe("fin", "ch", rdy=1)
        b.subscribe("fin", "ch", rdy=0)
        msg = a.read_message()
        b.send(encode_fin(msg.id))
        b.expect_error(f"E_FIN_FAILED FIN {msg.id.decode()} failed client does not own message")
        a.send(encode_fin(b"0000000000000000"))
        a.expect_error("E_FIN_FAILED FIN 0000000000000000 failed ID not in flight")
        a.send(encode_touch(b"0000000000000000"))
        a.expect_error("E_TOUCH_FAILED TOUCH 0000000000000000 failed ID not in flight")
        a.send(encode_req(b"0000000000000000", 0))
        a.expect_error("E_REQ_FAILED REQ 0000000000000000 failed ID not in flight")
        a.send(encode_fin(msg.id) + encode_pub("elsewhere", b"still open"))
        a.expect_ok()
        a.send(b"FIN \n")
        a.expect_error("E_INVALID invalid message ID")
        a.expect_closed()


def test_req_0_redelivers_now_and_req_delay_later(nsqd: Daemon) -> None:
    publish(nsqd, "req", b"x")
    with RawClient(nsqd.tcp) as c:
        c.subscribe("req", "ch", rdy=1)
        msg = c.read_message()
        c.send(encode_req(msg.id, 0))
        again = c.read_message()
        assert (again.id, again.attempts) == (msg.id, 2)
        sent = time.monotonic()
        c.send(encode_req(again.id, 600))
        wait_for(lambda: channel_stats(nsqd, "req", "ch")["deferred_count"] == 1, what="deferred")
        third = c.read_message()
        assert time.monotonic() - sent >= 0.55
        assert (third.id, third.attempts) == (msg.id, 3)
    ch = channel_stats(nsqd, "req", "ch")
    assert ch["requeue_count"] == 2


def test_req_beyond_max_is_clamped(nsqd_factory: Callable[..., Daemon]) -> None:
    nsqd = nsqd_factory("--max-req-timeout=2s")
    publish(nsqd, "clamp", b"x")
    with RawClient(nsqd.tcp) as c:
        c.subscribe("clamp", "ch", rdy=1)
        msg = c.read_message()
        sent = time.monotonic()
        c.send(encode_req(msg.id, 3_600_000))
        again = c.read_message(timeout=6)
        assert 1.9 <= time.monotonic() - sent < 5
        assert again.attempts == 2


def test_msg_timeout_requeues_and_late_fin_fails(nsqd: Daemon) -> None:
    publish(nsqd, "timeout", b"x")
    with RawClient(nsqd.tcp) as c:
        c.identify(msg_timeout=1000)
        c.subscribe("timeout", "ch", rdy=1)
        msg = c.read_message()
        again = c.read_message(timeout=5)
        assert (again.id, again.attempts) == (msg.id, 2)
        ch = channel_stats(nsqd, "timeout", "ch")
        assert (ch["timeout_count"], ch["requeue_count"]) == (1, 0)
        c.send(encode_fin(again.id))
        c.send(encode_fin(again.id))
        c.expect_error(f"E_FIN_FAILED FIN {msg.id.decode()} failed ID not in flight")


def test_touch_extends_the_timeout(nsqd: Daemon) -> None:
    publish(nsqd, "touch", b"x")
    with RawClient(nsqd.tcp) as c:
        c.identify(msg_timeout=1000)
        c.subscribe("touch", "ch", rdy=1)
        msg = c.read_message()
        for _ in range(8):  # 2.4 s in all, well past the 1 s timeout
            c.expect_nothing(0.3)
            c.send(encode_touch(msg.id))
        c.send(encode_fin(msg.id) + encode_pub("elsewhere", b"y"))
        c.expect_ok()  # FIN succeeded silently: no E_FIN_FAILED before the OK
    assert channel_stats(nsqd, "touch", "ch")["timeout_count"] == 0


def test_dpub_defers_delivery(nsqd: Daemon) -> None:
    with RawClient(nsqd.tcp) as c:
        c.subscribe("dpub", "ch", rdy=1)
        with RawClient(nsqd.tcp) as p:
            sent = time.monotonic()
            p.send(encode_dpub("dpub", 800, b"later"))
            p.expect_ok()
        ch = channel_stats(nsqd, "dpub", "ch")
        assert (ch["deferred_count"], ch["message_count"]) == (1, 1)
        msg = c.read_message()
        assert msg.body == b"later" and time.monotonic() - sent >= 0.75


def test_cls_gets_close_wait_and_fin_still_works(nsqd: Daemon) -> None:
    publish(nsqd, "cls", b"x", b"y")
    with RawClient(nsqd.tcp) as c:
        c.subscribe("cls", "ch", rdy=1)
        msg = c.read_message()
        c.send(CLS)
        c.expect_response(b"CLOSE_WAIT")
        c.send(encode_rdy(10) + encode_fin(msg.id))
        c.expect_nothing(0.3)
    assert channel_stats(nsqd, "cls", "ch")["depth"] == 1


# --- liveness ------------------------------------------------------------------------------------

def test_heartbeats_are_sent_and_silence_closes(nsqd: Daemon) -> None:
    with RawClient(nsqd.tcp) as c:
        c.identify(heartbeat_interval=1000)
        c.subscribe("hb", "ch", rdy=1)
        assert c.read_frame(timeout=3, skip_heartbeats=False) == (0, b"_heartbeat_")
        c.expect_closed(timeout=5)


def test_nops_keep_a_connection_alive(nsqd: Daemon) -> None:
    with RawClient(nsqd.tcp) as c:
        c.identify(heartbeat_interval=1000)
        c.subscribe("hb", "ch")
        for _ in range(4):  # 4 heartbeats: twice the read deadline
            assert c.read_frame(timeout=3, skip_heartbeats=False) == (0, b"_heartbeat_")
            c.send(NOP)
        c.send(encode_pub("hb", b"x"))
        c.expect_ok()


def test_heartbeats_disabled_keeps_an_idle_connection(nsqd: Daemon) -> None:
    with RawClient(nsqd.tcp) as c:
        c.identify(heartbeat_interval=-1)
        c.expect_nothing(1.0)
        c.send(encode_pub("idle", b"x"))
        c.expect_ok()


def test_disconnect_with_messages_in_flight_redelivers(nsqd: Daemon) -> None:
    publish(nsqd, "gone", b"a", b"b")
    with RawClient(nsqd.tcp) as first:
        first.subscribe("gone", "ch", rdy=2)
        ids = {m.id for m in first.read_messages(2)}
    with RawClient(nsqd.tcp) as second:
        second.subscribe("gone", "ch", rdy=2)
        again = second.read_messages(2)
        assert {m.id for m in again} == ids and {m.attempts for m in again} == {2}


def test_output_buffer_timeout_delays_messages(nsqd: Daemon) -> None:
    with RawClient(nsqd.tcp) as c:
        data = c.identify(output_buffer_size=256 * 1024 // 4, output_buffer_timeout=500)
        assert data["output_buffer_timeout"] == 500
        c.subscribe("buffered", "ch", rdy=10)
        sent = time.monotonic()
        publish(nsqd, "buffered", b"x")
        c.read_message()
        assert time.monotonic() - sent >= 0.45


def test_sample_rate_delivers_a_sample(nsqd_factory: Callable[..., Daemon]) -> None:
    nsqd = nsqd_factory("--max-rdy-count=10000")
    with RawClient(nsqd.tcp) as p:
        for _ in range(10):
            p.send(encode_mpub("sampled", [b"x"] * 1000))
            p.expect_ok()
    with RawClient(nsqd.tcp) as c:
        c.identify(sample_rate=42)
        c.subscribe("sampled", "ch", rdy=10000)
        wait_for(lambda: channel_stats(nsqd, "sampled", "ch")["depth"] == 0, what="channel drained")
        in_flight = channel_stats(nsqd, "sampled", "ch")["in_flight_count"]
    assert 3700 <= in_flight <= 4700


def not_reading(nsqd: Daemon, topic: str, count: int, heartbeat_ms: int) -> socket.socket:
    """``count`` messages of 1 MB in ``topic``, and a consumer of its channel ``ch`` with RDY
    ``count`` that never reads (a small receive buffer: the node's writes pause at once)."""
    publish(nsqd, topic, *[b"z" * 1_000_000] * count)
    lazy = socket.create_connection(nsqd.tcp)
    lazy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    lazy.sendall(b"  V2" + encode_identify(b'{"heartbeat_interval": %d}' % heartbeat_ms)
                 + encode_sub(topic, "ch") + encode_rdy(count))
    return lazy


def test_client_that_stops_reading_is_dropped_and_its_messages_requeued(
        nsqd_factory: Callable[..., Daemon]) -> None:
    nsqd = nsqd_factory("--max-msg-size=2000000")
    lazy = not_reading(nsqd, "stuck", 40, heartbeat_ms=1000)
    try:
        wait_for(lambda: channel_stats(nsqd, "stuck", "ch")["client_count"] == 0, timeout=10,
                 what="the non-reading client to be dropped")
        with RawClient(nsqd.tcp) as other:  # the node kept serving others meanwhile
            other.send(encode_pub("other", b"x"))
            other.expect_ok()
        ch = channel_stats(nsqd, "stuck", "ch")
        assert ch["in_flight_count"] == 0 and ch["depth"] == 40
    finally:
        lazy.close()


def test_a_client_closed_for_silence_while_not_reading_is_still_dropped_at_its_write_deadline(
        nsqd_factory: Callable[..., Daemon]) -> None:
    """When the read deadline (two heartbeats without a byte) is the first one a scan sees,
    the close waits for the output to be written, which a client that does not read never
    allows: the write deadline still ends it. The shard is stopped past both deadlines so
    that the read deadline is seen first."""
    nsqd = nsqd_factory("--max-msg-size=2000000", "--shards=1")
    lazy = not_reading(nsqd, "silent", 10, heartbeat_ms=2000)
    try:
        wait_for(lambda: channel_stats(nsqd, "silent", "ch")["in_flight_count"] > 0, timeout=10,
                 what="messages in flight to the client that does not read")
        shard = stats(nsqd, include_shards="true")["supervisor"]["shard_status"][0]["pid"]
        os.kill(shard, signal.SIGSTOP)
        try:
            time.sleep(4.5)  # the fault's length: past the write deadline (2 s) and the read deadline (4 s)
        finally:
            os.kill(shard, signal.SIGCONT)
        wait_for(lambda: channel_stats(nsqd, "silent", "ch")["client_count"] == 0, timeout=10,
                 what="the client that does not read to be dropped")
        ch = channel_stats(nsqd, "silent", "ch")
        assert ch["in_flight_count"] == 0 and ch["depth"] == 10
    finally:
        lazy.close()


def test_ephemeral_channel_and_topic_vanish_with_last_consumer(nsqd: Daemon) -> None:
    with RawClient(nsqd.tcp) as c:
        c.subscribe("eph#ephemeral", "ch#ephemeral")
        assert topic_stats(nsqd, "eph#ephemeral") is not None
    wait_for(lambda: topic_stats(nsqd, "eph#ephemeral") is None, what="ephemeral topic gone")
    with RawClient(nsqd.tcp) as c:
        c.subscribe("durable", "ch#ephemeral")
    wait_for(lambda: topic_stats(nsqd, "durable")["channels"] == [], what="ephemeral channel gone")  # type: ignore[index]
