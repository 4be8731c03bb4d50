"""Acknowledged publishes are deliverable in the order they were acknowledged, whichever shard
or protocol carried each one.

One producer publishes a round, one request after another, each on a new connection and each
waiting for its answer: HTTP ``/pub``, HTTP ``/mpub`` of two, TCP ``PUB``, HTTP ``/pub``. One
consumer then reads the five. The supervisor hands HTTP connections to the shards in turn, so
a round's HTTP requests land on the topic's owner and on the other shards, and go through
their inbound rings; a TCP connection goes to the shard that owns the topic of its first
publish, so one that first publishes to a topic of another shard publishes the round's
message through that shard's ring."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from pynsqd.wire import MAGIC_V2
from pynsqd.wire.commands import encode_fin, encode_identify, encode_pub, encode_rdy, encode_sub
from pynsqd.wire.frames import FRAME_MESSAGE, FRAME_RESPONSE, FrameParser
from pynsqd.wire.message import decode_message
from testbed.harness import Daemon, scaled
from tests.conftest import run_async

pytestmark = pytest.mark.slow

ROUNDS = 500
NodeFactory = Callable[..., Daemon]  # conftest's ``nsqd_factory``
QUIET = "--log-level=info"  # not a debug line per connection: 2,000 connections a test


def _post(nsqd: Daemon, path: str) -> None:
    request = urllib.request.Request(nsqd.http_url + path, data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=scaled(10)) as resp:
        assert resp.status == 200


def _owners(nsqd: Daemon) -> dict[str, int]:
    data = next(arg.partition("=")[2] for arg in nsqd.args if arg.startswith("--data-path="))
    table = {}
    for line in (Path(data) / "pynsqd.placement").read_text().splitlines():
        shard, _, topic = line.partition(" ")
        table[topic] = int(shard)
    return table


def _topics_by_shard(nsqd: Daemon, shards: int) -> dict[int, str]:
    """One topic owned by each shard (topics are placed on the shard owning the fewest)."""
    for i in range(4 * shards):
        _post(nsqd, f"/topic/create?topic=side{i}")
    by_shard: dict[int, str] = {}
    for topic, shard in _owners(nsqd).items():
        by_shard.setdefault(shard, topic)
    assert len(by_shard) == shards, by_shard
    return by_shard


async def _http(nsqd: Daemon, path: str, body: bytes) -> None:
    """One request on a new connection; returns once its ``200 OK`` answer is read."""
    host, port = nsqd.address("HTTP")
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                     % (path.encode(), len(body), body))
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 "), head
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        assert await reader.readexactly(length) == b"OK"
    finally:
        writer.close()


async def _tcp_pub(nsqd: Daemon, topic: str, body: bytes, via: str | None) -> None:
    """PUB on a new connection, first to ``via`` (a topic of another shard) if given, so the
    connection is served by that shard; returns once every ``OK`` is read."""
    reader, writer = await asyncio.open_connection(*nsqd.tcp)
    try:
        first = encode_pub(via, b"side") if via is not None else b""
        writer.write(MAGIC_V2 + first + encode_pub(topic, body))
        parser = FrameParser()
        answers: list[tuple[int, bytes]] = []
        while len(answers) < (2 if via is not None else 1):
            data = await reader.read(4096)
            assert data, "connection closed"
            answers += [f for f in parser.feed(data) if f != (FRAME_RESPONSE, b"_heartbeat_")]
        assert all(a == (FRAME_RESPONSE, b"OK") for a in answers), answers
    finally:
        writer.close()


class Reader:
    """One consumer of the channel: the bodies in the order they arrived."""

    def __init__(self, nsqd: Daemon, topic: str) -> None:
        self.nsqd = nsqd
        self.topic = topic
        self.bodies: list[bytes] = []
        self.arrived = asyncio.Event()

    async def run(self, ready: asyncio.Event) -> None:
        reader, writer = await asyncio.open_connection(*self.nsqd.tcp)
        try:
            unbuffered = encode_identify(b'{"output_buffer_size":-1}')  # each message written at once
            writer.write(MAGIC_V2 + unbuffered + encode_sub(self.topic, "c") + encode_rdy(100))
            parser = FrameParser()
            oks = 0
            while True:
                data = await reader.read(1 << 16)
                if not data:
                    return
                fins = []
                for kind, payload in parser.feed(data):
                    if kind == FRAME_RESPONSE and payload == b"OK":
                        oks += 1
                        if oks == 2:  # IDENTIFY's, then SUB's
                            ready.set()
                    elif kind == FRAME_RESPONSE and payload == b"_heartbeat_":
                        fins.append(b"NOP\n")
                    elif kind == FRAME_MESSAGE:
                        _, _, msg_id, body = decode_message(payload)
                        self.bodies.append(body)
                        fins.append(encode_fin(msg_id))
                writer.write(b"".join(fins))
                self.arrived.set()
        finally:
            writer.close()

    async def wait_for(self, count: int) -> None:
        deadline = asyncio.get_running_loop().time() + scaled(10)
        while len(self.bodies) < count:
            self.arrived.clear()
            await asyncio.wait_for(self.arrived.wait(), max(0.01, deadline - asyncio.get_running_loop().time()))


def _rounds(nsqd: Daemon, topic: str, tcp_via: list[str | None]) -> list[list[bytes]]:
    """``ROUNDS`` rounds; the TCP publish of round r first publishes to ``tcp_via[r % n]``.
    Returns the rounds whose five messages did not arrive in the order they were sent."""

    async def main() -> list[list[bytes]]:
        reader = Reader(nsqd, topic)
        ready = asyncio.Event()
        task = asyncio.get_running_loop().create_task(reader.run(ready))
        try:
            await asyncio.wait_for(ready.wait(), scaled(10))
            wrong = []
            for r in range(ROUNDS):
                sent = [b"%d:%d" % (r, i) for i in range(5)]
                await _http(nsqd, f"/pub?topic={topic}", sent[0])
                await _http(nsqd, f"/mpub?topic={topic}", sent[1] + b"\n" + sent[2])
                await _tcp_pub(nsqd, topic, sent[3], tcp_via[r % len(tcp_via)])
                await _http(nsqd, f"/pub?topic={topic}", sent[4])
                await reader.wait_for(5 * (r + 1))
                got = reader.bodies[5 * r:5 * r + 5]
                assert sorted(got) == sorted(sent), (sent, got)  # each once: nothing lost or repeated
                if got != sent:
                    wrong.append(got)
            return wrong
        finally:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    return run_async(main())


def _stats_topic(nsqd: Daemon, topic: str) -> dict[str, object]:
    with urllib.request.urlopen(nsqd.http_url + f"/stats?format=json&topic={topic}", timeout=scaled(10)) as resp:
        return next(t for t in json.loads(resp.read())["topics"] if t["topic_name"] == topic)


def test_two_shards_deliver_every_round_in_the_order_it_was_acknowledged(nsqd_factory: NodeFactory) -> None:
    """HTTP requests land on both shards; the TCP PUB is served by the topic's owner."""
    nsqd = nsqd_factory("--shards=2", QUIET)
    _post(nsqd, "/topic/create?topic=order")
    _post(nsqd, "/channel/create?topic=order&channel=c")
    wrong = _rounds(nsqd, "order", [None])
    assert not wrong, f"{len(wrong)} of {ROUNDS} rounds out of order, e.g. {wrong[:3]}"
    assert _stats_topic(nsqd, "order")["message_count"] == 5 * ROUNDS


def test_two_shards_keep_the_order_when_every_publish_may_cross_a_ring(nsqd_factory: NodeFactory) -> None:
    """As above, and every other TCP PUB is served by the shard that does not own the topic."""
    nsqd = nsqd_factory("--shards=2", QUIET)
    side = _topics_by_shard(nsqd, 2)
    _post(nsqd, "/topic/create?topic=order")
    _post(nsqd, "/channel/create?topic=order&channel=c")
    owner = _owners(nsqd)["order"]
    wrong = _rounds(nsqd, "order", [side[1 - owner], None])
    assert not wrong, f"{len(wrong)} of {ROUNDS} rounds out of order, e.g. {wrong[:3]}"


def test_three_shards_keep_the_order_of_publishes_through_two_rings(nsqd_factory: NodeFactory) -> None:
    """The owner drains two inbound rings: HTTP requests land on all three shards, TCP PUBs
    are served by each of the two other shards in turn."""
    nsqd = nsqd_factory("--shards=3", QUIET)
    side = _topics_by_shard(nsqd, 3)
    _post(nsqd, "/topic/create?topic=order")
    _post(nsqd, "/channel/create?topic=order&channel=c")
    owner = _owners(nsqd)["order"]
    others = [side[s] for s in range(3) if s != owner]
    wrong = _rounds(nsqd, "order", others)
    assert not wrong, f"{len(wrong)} of {ROUNDS} rounds out of order, e.g. {wrong[:3]}"
