"""pynsqd.client's batch delivery: ``FrameSplitter`` on its own, ``BatchConsumer`` against a real nsqd."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from pynsqd.client import BatchConsumer, Identity, MessageBatch, Producer
from pynsqd.client.batch import FrameSplitter, MessageRun
from pynsqd.wire.errors import ProtocolError
from pynsqd.wire.frames import FRAME_ERROR, FRAME_MESSAGE, HEARTBEAT, HEARTBEAT_FRAME, encode_frame
from pynsqd.wire.message import encode_message
from testbed.harness import Daemon
from tests.conftest import run_async
from tests.test_client_library import channel_stats, tcp, until

pytestmark = pytest.mark.slow


def message_frame(i: int, body: bytes | None = None) -> bytes:
    body = b"body-%d" % i if body is None else body
    return encode_frame(FRAME_MESSAGE, encode_message(1_000 + i, i + 1, b"%016x" % i, body))


def split(stream: bytes, step: int) -> list[object]:
    """Feed ``stream`` ``step`` bytes at a time; return runs as lists of frames, other items as is."""
    splitter = FrameSplitter()
    out: list[object] = []
    for i in range(0, len(stream), step):
        for item in splitter.feed(stream[i:i + step]):
            if isinstance(item, MessageRun):
                offs = item.offsets
                out.append([item.frames[offs[k]:offs[k + 1]] for k in range(len(offs) - 1)])
            else:
                out.append(item)
    return out


def test_splitter_keeps_frames_whole_and_in_stream_order_whatever_the_read_sizes() -> None:
    frames = [message_frame(i, b"" if i == 3 else None) for i in range(6)]
    error = encode_frame(FRAME_ERROR, b"E_FIN_FAILED nope")
    stream = b"".join(frames[:2]) + HEARTBEAT_FRAME + b"".join(frames[2:5]) + error + frames[5]
    whole = split(stream, len(stream))
    assert whole == [frames[:2], (0, HEARTBEAT), frames[2:5], (FRAME_ERROR, b"E_FIN_FAILED nope"), frames[5:]]
    for step in (1, 3, 39, 64):  # runs split differently, but the frames and their order are the same
        items = split(stream, step)
        flat: list[object] = []
        for item in items:
            flat.extend(item if isinstance(item, list) else [item])
        assert flat == [*frames[:2], (0, HEARTBEAT), *frames[2:5], (FRAME_ERROR, b"E_FIN_FAILED nope"), frames[5]]
    splitter = FrameSplitter()
    (run,) = splitter.feed(frames[0] + frames[1][:10])  # trailing bytes of an incomplete frame are kept
    assert isinstance(run, MessageRun) and len(run.offsets) == 2
    (run,) = splitter.feed(frames[1][10:])
    assert isinstance(run, MessageRun) and run.frames[run.offsets[0]:run.offsets[1]] == frames[1]


@pytest.mark.parametrize("bad, what", [
    (b"\x00\x00\x00\x02", "invalid frame size"),                        # size < 4, seen from 4 bytes
    (b"\x7f\x00\x00\x00\x00\x00\x00\x02", "invalid frame size"),        # size > the maximum
    (encode_frame(FRAME_MESSAGE, b"short"), "message frame too short"),  # shorter than a message header
])
def test_splitter_reports_a_bad_frame_after_the_good_ones_then_ignores_input(bad: bytes, what: str) -> None:
    splitter = FrameSplitter()
    items = splitter.feed(message_frame(0) + bad)
    assert isinstance(items[0], MessageRun) and len(items[0].offsets) == 2
    assert isinstance(items[1], ProtocolError) and what in str(items[1]) and splitter.failed
    assert splitter.feed(message_frame(1)) == []


def test_batch_consumer_gets_every_message_and_auto_fins(nsqd: Daemon) -> None:
    async def main() -> None:
        bodies = [b"m-%d" % i for i in range(3000)] + [b"x", b"with\nnewline"]
        async with Producer(tcp(nsqd)) as p:
            for start in range(0, len(bodies), 500):
                await p.multi_publish("bt", bodies[start:start + 500])
        got: list[bytes] = []
        sizes: list[int] = []

        def on_batch(batch: MessageBatch) -> None:
            sizes.append(len(batch))
            got.extend(batch.bodies())
            assert [m[3] for m in batch] == batch.bodies() and all(a == 1 for a in batch.attempts())
            assert batch.nsqd_address == tcp(nsqd)

        c = BatchConsumer("bt", "ch", on_batch, nsqd_tcp_addresses=[tcp(nsqd)], max_in_flight=1000)
        await c.start()
        await until(lambda: c.stats["finished"] == len(bodies), what="every message FINed")
        await c.stop()
        assert sorted(got) == sorted(bodies)
        assert max(sizes) > 1  # delivered in runs, not one by one
        stats = channel_stats(nsqd, "bt", "ch")
        assert (stats["depth"], stats["in_flight_count"], stats["requeue_count"]) == (0, 0, 0)
    run_async(main())


def test_held_batches_sliced_finished_requeued_and_answered_once(nsqd: Daemon) -> None:
    async def main() -> None:
        async with Producer(tcp(nsqd)) as p:
            await p.multi_publish("hold", [b"h-%d" % i for i in range(200)])
        held: list[MessageBatch] = []

        def on_batch(batch: MessageBatch) -> None:
            batch.disable_auto_response()
            held.append(batch)

        c = BatchConsumer("hold", "ch", on_batch, nsqd_tcp_addresses=[tcp(nsqd)], max_in_flight=500)
        await c.start()
        await until(lambda: sum(len(b) for b in held) == 200, what="200 held messages")
        assert c.in_flight == 200 and channel_stats(nsqd, "hold", "ch")["in_flight_count"] == 200
        first = max(held, key=len)  # a connection's first run is 1 message (RDY 1 until then)
        assert len(first) > 2
        head, tail = first[:1], first[1:]
        head.finish()
        with pytest.raises(RuntimeError, match="already answered"):
            first.finish()  # overlaps the answered head
        with pytest.raises(RuntimeError, match="already answered"):
            first.touch()
        assert [len(part) for part in first.unanswered()] == [len(first) - 1]
        tail.requeue(delay=0, backoff=False)
        assert first.responded
        count = len(held)
        for batch in held[:count]:
            if batch is not first:
                batch.touch()
                batch.finish()
        redelivered = len(first) - 1
        await until(lambda: sum(len(b) for b in held[count:]) == redelivered, what="the requeued messages again")
        again = [body for b in held[count:] for body in b.bodies()]
        assert sorted(again) == sorted(tail.bodies())
        assert all(b.attempts() == [2] * len(b) for b in held[count:])
        for batch in held[count:]:
            batch.finish()
        await until(lambda: c.stats["finished"] == 200, what="all FINed")
        await c.stop()
        stats = channel_stats(nsqd, "hold", "ch")
        assert (stats["depth"], stats["in_flight_count"], stats["requeue_count"]) == (0, 0, redelivered)
    run_async(main())


def test_touch_keeps_a_held_batch_past_its_timeout(nsqd: Daemon) -> None:
    async def main() -> None:
        async with Producer(tcp(nsqd)) as p:
            await p.multi_publish("touchy", [b"t-%d" % i for i in range(50)])
        held: list[MessageBatch] = []

        def on_batch(batch: MessageBatch) -> None:
            batch.disable_auto_response()
            held.append(batch)

        c = BatchConsumer("touchy", "ch", on_batch, nsqd_tcp_addresses=[tcp(nsqd)], max_in_flight=100,
                          identity=Identity(msg_timeout=4000))
        await c.start()
        await until(lambda: sum(len(b) for b in held) == 50, what="50 held messages")
        loop = asyncio.get_running_loop()
        end = loop.time() + 9.0  # 2.25 message timeouts, touched every 0.25 s (slack for a loaded host)
        while loop.time() < end:
            for batch in held:
                batch.touch()
            await asyncio.sleep(0.25)
        for batch in held:
            batch.finish()
        await until(lambda: channel_stats(nsqd, "touchy", "ch")["in_flight_count"] == 0, what="FINs")
        await c.stop()
        stats = channel_stats(nsqd, "touchy", "ch")
        assert (stats["timeout_count"], stats["depth"], c.stats["received"]) == (0, 0, 50)
    run_async(main())


@pytest.mark.parametrize("kind", ["raises", "async-false", "snappy"])
def test_failed_batches_are_requeued_and_features_still_split(nsqd: Daemon, kind: str) -> None:
    async def main() -> None:
        async with Producer(tcp(nsqd)) as p:
            await p.multi_publish("fail", [b"f-%d" % i for i in range(100)])
        seen: list[tuple[bytes, int]] = []

        def sync_handler(batch: MessageBatch) -> None:
            seen.extend(zip(batch.bodies(), batch.attempts()))
            if kind == "raises" and min(batch.attempts()) == 1:
                raise ValueError("boom")

        async def async_handler(batch: MessageBatch) -> bool:
            await asyncio.sleep(0)
            seen.extend(zip(batch.bodies(), batch.attempts()))
            return min(batch.attempts()) > 1

        extra = {"snappy": True} if kind == "snappy" else {}
        handler = async_handler if kind == "async-false" else sync_handler
        c = BatchConsumer("fail", "ch", handler, nsqd_tcp_addresses=[tcp(nsqd)], max_in_flight=200,
                          requeue_delay=0.0, backoff_multiplier=0.01, **extra)
        await c.start()
        await until(lambda: c.stats["finished"] == 100, what="every message FINed")
        if kind == "snappy":
            assert c.conns[tcp(nsqd)].settings["snappy"] is True
        await c.stop()
        bodies = {b"f-%d" % i for i in range(100)}
        assert {body for body, attempts in seen if attempts == 1} == bodies
        stats = channel_stats(nsqd, "fail", "ch")
        assert (stats["depth"], stats["in_flight_count"]) == (0, 0)
        if kind == "snappy":
            assert c.stats["requeued"] == 0 and len(seen) == 100
        else:  # every message failed once at least, was requeued and delivered again
            assert c.stats["requeued"] == stats["requeue_count"] >= 100
            assert {body for body, attempts in seen if attempts > 1} == bodies
    run_async(main())


def test_batch_consumer_refuses_per_message_options() -> None:
    with pytest.raises(TypeError, match="no max_attempts option"):
        BatchConsumer("t", "c", lambda b: None, nsqd_tcp_addresses=["127.0.0.1:1"], max_attempts=3)


def test_max_in_flight_beyond_max_rdy_count_opens_more_connections_to_one_nsqd(
        nsqd_factory: Callable[..., Daemon]) -> None:
    """nsqd caps each connection's RDY at --max-rdy-count; ``connections_per_nsqd=0`` opens as
    many connections to it as ``max_in_flight`` needs, each an ordinary client with its own RDY,
    so the consumer holds ``max_in_flight`` messages at once (a little more while the
    connections come up: the first may fill its RDY before the others share the budget)."""
    nsqd = nsqd_factory("--max-rdy-count=100")

    async def main() -> None:
        async with Producer(tcp(nsqd)) as p:
            await p.multi_publish("wide", [b"w-%d" % i for i in range(1000)])
        held: list[MessageBatch] = []
        hold = True

        def on_batch(batch: MessageBatch) -> None:
            if hold:  # else returning FINs it
                batch.disable_auto_response()
            held.append(batch)

        c = BatchConsumer("wide", "ch", on_batch, nsqd_tcp_addresses=[tcp(nsqd)], max_in_flight=450,
                          connections_per_nsqd=0)
        await c.start()
        try:
            await until(lambda: sum(len(b) for b in held) >= 450, what="450 held messages")
            assert sorted(c.conns) == [tcp(nsqd)] + [f"{tcp(nsqd)}#{i}" for i in range(1, 5)]
            assert {b.nsqd_address for b in held} == {tcp(nsqd)}
            stats = channel_stats(nsqd, "wide", "ch")
            assert stats["in_flight_count"] == sum(len(b) for b in held) and len(stats["clients"]) == 5
            assert max(client["ready_count"] for client in stats["clients"]) <= 100
            hold = False
            for batch in held:
                batch.finish()
            await until(lambda: c.stats["finished"] == 1000 and c.in_flight == 0, what="every message FINed")
            bodies = sorted(body for batch in held for body in batch.bodies())
            assert bodies == sorted(b"w-%d" % i for i in range(1000))
        finally:
            await c.stop()
        stats = channel_stats(nsqd, "wide", "ch")
        assert (stats["depth"], stats["in_flight_count"], stats["requeue_count"]) == (0, 0, 0)
    run_async(main())


def test_connections_per_nsqd_is_checked() -> None:
    with pytest.raises(ValueError, match="connections_per_nsqd"):
        BatchConsumer("t", "c", lambda b: None, nsqd_tcp_addresses=["127.0.0.1:1"], connections_per_nsqd=-1)
