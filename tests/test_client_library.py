"""pynsqd.client against a real nsqd (and against FakeNsqd for the error paths)."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from pynsqd.client import (
    ConnectError,
    ConnectionClosedError,
    Consumer,
    HTTPError,
    Message,
    NSQTimeoutError,
    Producer,
    ProtocolViolationError,
    ResponseError,
    SyncProducer,
)
from pynsqd.wire.commands import encode_touch
from testbed.harness import Daemon, scaled
from tests.conftest import run_async
from tests.support.fake_nsqd import FakeNsqd

pytestmark = pytest.mark.fast

T = scaled(10)


def tcp(nsqd: Daemon) -> str:
    return f"127.0.0.1:{nsqd.tcp[1]}"


def http(nsqd: Daemon) -> str:
    return f"127.0.0.1:{nsqd.http[1]}"


async def until(predicate: Callable[[], object], limit: float = 10.0, what: str = "condition") -> None:
    """Poll ``predicate`` on the loop until it holds; fail after ``limit`` seconds (scaled)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + scaled(limit)
    while True:
        if predicate():
            return
        if loop.time() > end:
            raise AssertionError(f"timed out after {scaled(limit):.1f}s waiting for {what}")
        await asyncio.sleep(0.01)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def channel_stats(nsqd: Daemon, topic: str, channel: str) -> dict[str, object]:
    data = httpx.get(f"{nsqd.http_url}/stats", params={"format": "json"}, timeout=5).json()
    t = next(t for t in data["topics"] if t["topic_name"] == topic)
    return dict(next(c for c in t["channels"] if c["channel_name"] == channel))


def test_publish_every_way_then_consume_everything(nsqd: Daemon) -> None:
    async def main() -> None:
        async with Producer(tcp(nsqd), http_address=http(nsqd)) as p:
            await asyncio.gather(*(p.publish("t", b"pub-%d" % i) for i in range(300)))  # pipelined
            await p.multi_publish("t", [b"mpub-%d" % i for i in range(100)])
            await p.deferred_publish("t", 200, b"dpub")
            await p.publish_http("t", b"http")
            await p.publish_http("t", b"http-deferred", defer_ms=100)
            await p.multi_publish_http("t", [b"line\nwith newline", b"other"])
        got: list[bytes] = []
        c = Consumer("t", "ch", lambda m: got.append(m.body), nsqd_tcp_addresses=[tcp(nsqd)], max_in_flight=50)
        await c.start()
        await until(lambda: len(got) == 405)
        await c.stop()
        assert sorted(got) == sorted([b"pub-%d" % i for i in range(300)] + [b"mpub-%d" % i for i in range(100)]
                                     + [b"dpub", b"http", b"http-deferred", b"line\nwith newline", b"other"])
        assert c.stats["finished"] == 405
    run_async(main())
    ch = channel_stats(nsqd, "t", "ch")
    assert ch["depth"] == 0 and ch["in_flight_count"] == 0 and ch["message_count"] == 405


def test_errors_carry_the_nsq_code_and_the_producer_reconnects(nsqd_factory: Callable[..., Daemon]) -> None:
    nsqd = nsqd_factory("--max-msg-size=100")

    async def main() -> None:
        async with Producer(tcp(nsqd), http_address=http(nsqd)) as p:
            with pytest.raises(ResponseError) as err:
                await p.publish("t", b"x" * 101)
            assert err.value.code == "E_BAD_MESSAGE" and err.value.fatal
            assert "too big" in err.value.description
            await p.publish("t", b"fine")  # nsqd closed the connection; a new one is made
            with pytest.raises(HTTPError) as herr:
                await p.publish_http("t", b"x" * 101)
            assert (herr.value.status, herr.value.code) == (413, "MSG_TOO_BIG")
            with pytest.raises(ValueError):
                await p.publish("bad topic!", b"x")
    run_async(main())


def test_sync_producer(nsqd: Daemon) -> None:
    with SyncProducer(tcp(nsqd), http_address=http(nsqd)) as p:
        p.publish("sync", b"a")
        p.multi_publish("sync", [b"b", b"c"])
        p.deferred_publish("sync", 0, b"d")
        p.publish_http("sync", b"e")
        with pytest.raises(ResponseError):
            p.deferred_publish("sync", -5, b"bad")
    data = httpx.get(f"{nsqd.http_url}/stats", params={"format": "json"}, timeout=5).json()
    assert next(t for t in data["topics"] if t["topic_name"] == "sync")["message_count"] == 5


def test_transport_errors_are_converted_at_the_boundary() -> None:
    async def main() -> None:
        port = free_port()
        with pytest.raises(ConnectError) as refused:
            await Producer(f"127.0.0.1:{port}").publish("t", b"x")
        assert isinstance(refused.value.__cause__, OSError)
        for mode, exc in (("garbage", ProtocolViolationError), ("close", ConnectionClosedError),
                          ("silent", NSQTimeoutError)):
            fake = FakeNsqd(mode)
            address = await fake.start()
            p = Producer(address, connect_timeout=0.5)
            with pytest.raises(exc):
                await p.publish("t", b"x")
            await p.close()
            await fake.close()
        fake = FakeNsqd("pub-error")
        p = Producer(await fake.start())
        with pytest.raises(ResponseError) as err:
            await p.publish("t", b"x")
        assert err.value.code == "E_PUB_FAILED"
        await p.close()
        await fake.close()
    run_async(main())


def test_handshake_heartbeat_and_max_rdy_count_against_a_scripted_server() -> None:
    async def main() -> None:
        fake = FakeNsqd(settings={"max_rdy_count": 3, "version": "1.3.0"})
        address = await fake.start()
        got: list[Message] = []
        c = Consumer("t", "ch", got.append, nsqd_tcp_addresses=[address], max_in_flight=10)
        try:
            await steps(fake, c)
        finally:
            await c.stop()
            await fake.close()
        assert fake.names()[-1] == b"CLS"

    async def steps(fake: FakeNsqd, c: Consumer) -> None:
        await c.start()
        await until(lambda: b"RDY" in fake.names())
        assert fake.names()[:3] == [b"IDENTIFY", b"SUB", b"RDY"]
        assert fake.commands[1][1][1:] == [b"t", b"ch"]
        assert fake.commands[2][1][1:] == [b"1"]  # RDY 1 first
        fake.push_message(b"0" * 16, b"first")
        await until(lambda: b"FIN" in fake.names())
        await until(lambda: fake.names().count(b"RDY") == 2)
        assert fake.commands[-1][1][1:] == [b"3"]  # the share, capped at the server's max_rdy_count
        fake.push_heartbeat()
        await until(lambda: b"NOP" in fake.names())
    run_async(main())


def test_backoff_sends_rdy_0_then_tests_with_rdy_1() -> None:
    async def main() -> None:
        fake = FakeNsqd()
        address = await fake.start()
        c = Consumer("t", "ch", lambda m: False, nsqd_tcp_addresses=[address], max_in_flight=5,
                     backoff_multiplier=0.2, requeue_delay=0)
        try:
            await steps(fake, c)
        finally:
            await c.stop()
            await fake.close()

    async def steps(fake: FakeNsqd, c: Consumer) -> None:
        await c.start()
        await until(lambda: b"RDY" in fake.names())
        fake.push_message(b"1" * 16, b"fails")
        await until(lambda: b"REQ" in fake.names())
        await until(lambda: fake.commands[-1][:2] == (b"RDY", [b"RDY", b"0"]))
        assert c.backoff.active
        await until(lambda: fake.commands[-1][:2] == (b"RDY", [b"RDY", b"1"]), limit=5)  # testing the water
        c.handler = lambda m: None  # recovered
        fake.push_message(b"2" * 16, b"works")
        await until(lambda: not c.backoff.active)
        rdys = [int(cmd[1][1]) for cmd in fake.commands if cmd[0] == b"RDY"]
        assert rdys[-1] == 5 and max(rdys) <= 5
    run_async(main())


def test_max_attempts_calls_the_discard_callback(nsqd: Daemon) -> None:
    discarded: list[Message] = []

    async def main() -> None:
        async with Producer(tcp(nsqd)) as p:
            await p.publish("retry", b"poison")
        c = Consumer("retry", "ch", lambda m: False, nsqd_tcp_addresses=[tcp(nsqd)], max_attempts=3,
                     on_discard=discarded.append, requeue_delay=0, backoff_multiplier=0)
        await c.start()
        await until(lambda: discarded)
        await c.stop()
        assert discarded[0].attempts == 4 and discarded[0].body == b"poison"
        assert c.stats["requeued"] == 3
    run_async(main())
    wait_ch = channel_stats(nsqd, "retry", "ch")
    assert wait_ch["depth"] == 0 and wait_ch["in_flight_count"] == 0


def test_is_starved_and_graceful_stop_waits_for_handlers(nsqd: Daemon) -> None:
    async def main() -> None:
        async with Producer(tcp(nsqd)) as p:
            await p.multi_publish("held", [b"%d" % i for i in range(10)])
        held: list[Message] = []

        async def handler(m: Message) -> None:
            held.append(m)
            await asyncio.sleep(0.3)

        c = Consumer("held", "ch", handler, nsqd_tcp_addresses=[tcp(nsqd)], max_in_flight=4)
        await c.start()
        await until(lambda: len(held) >= 4)  # RDY 1, then the share of 4
        assert c.in_flight <= 4
        await until(c.is_starved)
        await c.stop(grace=10)  # waits for the sleeping handlers, which then FIN
        assert c.in_flight == 0
    run_async(main())
    ch = channel_stats(nsqd, "held", "ch")
    assert ch["in_flight_count"] == 0 and ch["requeue_count"] == 0 and ch["timeout_count"] == 0


def test_consumer_and_producer_reconnect_to_a_restarted_nsqd(nsqd_factory: Callable[..., Daemon],
                                                             tmp_path: Path) -> None:
    port = free_port()
    data = tmp_path / "node"
    nsqd = nsqd_factory(f"--tcp-address=127.0.0.1:{port}", data_path=data)
    address = f"127.0.0.1:{port}"

    async def main() -> None:
        got: list[bytes] = []
        c = Consumer("rc", "ch", lambda m: got.append(m.body), nsqd_tcp_addresses=[address],
                     reconnect_interval=0.05, max_reconnect_interval=0.2)
        p = Producer(address)
        await c.start()
        await p.publish("rc", b"before")
        await until(lambda: got == [b"before"])
        await asyncio.to_thread(nsqd.stop)
        await until(lambda: not c.conns)
        with pytest.raises((ConnectError, ConnectionClosedError)):
            await p.publish("rc", b"while down")
        await asyncio.to_thread(nsqd.start)
        await until(lambda: c.conns, limit=15)
        await p.publish("rc", b"after")
        await until(lambda: got == [b"before", b"after"])
        assert c.stats["connects"] == 2
        await p.close()
        await c.stop()
    run_async(main())


def test_rdy_is_spread_and_never_exceeds_max_in_flight_over_two_nodes(nsqd_factory: Callable[..., Daemon]) -> None:
    nodes = [nsqd_factory(), nsqd_factory()]

    async def main() -> None:
        for node in nodes:
            async with Producer(tcp(node)) as p:
                await p.multi_publish("two", [b"%d" % i for i in range(50)])
        got: list[str] = []
        c = Consumer("two", "ch", lambda m: got.append(m.nsqd_address), nsqd_tcp_addresses=[tcp(n) for n in nodes],
                     max_in_flight=1, low_rdy_idle_timeout=0.2, rdy_redistribute_interval=0.1)
        await c.start()
        seen_max = 0

        def check() -> bool:
            nonlocal seen_max
            seen_max = max(seen_max, c.rdy.total, c.in_flight)
            return len(got) == 100
        await until(check, limit=30)
        assert seen_max <= 1
        assert {a for a in got} == {tcp(n) for n in nodes}
        await c.stop()
    run_async(main())


def test_testing_the_water_moves_to_another_node_when_the_first_is_idle() -> None:
    async def main() -> None:
        fakes = [FakeNsqd(), FakeNsqd()]
        addresses = [await f.start() for f in fakes]
        c = Consumer("t", "ch", lambda m: False, nsqd_tcp_addresses=addresses, max_in_flight=2,
                     backoff_multiplier=0.05, requeue_delay=0, low_rdy_idle_timeout=0.1,
                     rdy_redistribute_interval=0.05)
        try:
            await c.start()
            await until(lambda: all(b"RDY" in f.names() for f in fakes))
            fakes[0].push_message(b"3" * 16, b"fails")
            await until(lambda: b"REQ" in fakes[0].names())
            marks = [len(f.commands) for f in fakes]

            def rdy1_after_mark(i: int) -> bool:
                return any(cmd[0] == b"RDY" and cmd[1][1:] == [b"1"] for cmd in fakes[i].commands[marks[i]:])
            await until(lambda: rdy1_after_mark(0) and rdy1_after_mark(1), limit=10)
            assert c.rdy.total <= 1  # still testing with one RDY, never more
        finally:
            await c.stop()
            for f in fakes:
                await f.close()
    run_async(main())


def test_non_fatal_errors_are_counted_and_logged_once_per_burst(nsqd: Daemon,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """500 TOUCHes of messages no longer in flight (what message timeouts cause): every
    E_TOUCH_FAILED is counted, the log gets the first one and one summary, not 500 lines."""
    async def main() -> None:
        c = Consumer("touchy", "ch", lambda m: None, nsqd_tcp_addresses=[tcp(nsqd)])
        await c.start()
        await until(lambda: c.conns)
        conn = next(iter(c.conns.values()))
        for i in range(500):
            conn.send(encode_touch(b"%016d" % i))
        await until(lambda: c.stats["errors"] == 500, what="500 errors counted")
        assert conn.errors is not None and conn.errors.counts == {"E_TOUCH_FAILED": 500}
        await c.stop()

    with caplog.at_level(logging.WARNING, logger="pynsqd.client"):
        run_async(main())
    lines = [r.getMessage() for r in caplog.records if "E_TOUCH_FAILED" in r.getMessage()]
    assert len(lines) == 2, lines
    assert lines[0].endswith("E_TOUCH_FAILED TOUCH 0000000000000000 failed ID not in flight")
    assert "499 more E_TOUCH_FAILED" in lines[1] and "500 in all" in lines[1]
