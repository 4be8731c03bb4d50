"""pynsqd.client discovering nsqd through real nsqlookupd: nodes added and removed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import pytest

from pynsqd.client import BatchConsumer, Consumer, MessageBatch, Producer
from testbed.harness import Daemon, scaled
from tests.conftest import run_async
from tests.test_client_library import tcp, until
from tests.test_discovery import lookup, lookupd_factory, node_address, registered_nsqd  # noqa: F401

pytestmark = pytest.mark.slow


def test_consumer_follows_lookupd_as_nodes_come_and_go(lookupd_factory: Callable[..., Daemon],  # noqa: F811
                                                       nsqd_factory: Callable[..., Daemon]) -> None:
    lookupds = [lookupd_factory("--tombstone-lifetime=60s"), lookupd_factory()]
    a = registered_nsqd(nsqd_factory, lookupds[:1])
    b = registered_nsqd(nsqd_factory, lookupds[1:])
    got: list[tuple[str, bytes]] = []

    async def main() -> None:
        async with Producer(tcp(a)) as p:
            await p.publish("disc", b"a1")
        await until(lambda: lookup(lookupds[0], "disc"), what="a registered")
        c = Consumer("disc", "ch", lambda m: got.append((m.nsqd_address, m.body)),
                     lookupd_http_addresses=[f"http://127.0.0.1:{lk.http[1]}" for lk in lookupds],
                     lookupd_poll_interval=0.2, lookupd_poll_jitter=0.5, max_in_flight=10)
        await c.start()
        try:
            await until(lambda: got == [(node_address(a), b"a1")])
            async with Producer(tcp(b)) as p:  # a new node gets the topic: picked up
                await p.publish("disc", b"b1")
            await until(lambda: (node_address(b), b"b1") in got)
            assert set(c.conns) == {node_address(a), node_address(b)}
            # lookupd stops listing b (tombstone) while b's connection is fine: dropped
            resp = await asyncio.to_thread(httpx.post, f"{lookupds[1].http_url}/topic/tombstone",
                                           params={"topic": "disc", "node": f"127.0.0.1:{b.http[1]}"},
                                           timeout=scaled(5))
            assert resp.status_code == 200
            await until(lambda: set(c.conns) == {node_address(a)})
            # a node that dies is gone, and comes back only when lookupd lists it again
            await asyncio.to_thread(a.stop)
            await until(lambda: not c.conns)
            await asyncio.to_thread(a.start)
            await until(lambda: set(c.conns) == {node_address(a)}, limit=15)
        finally:
            await c.stop()
    run_async(main())


def test_consumer_opens_as_many_connections_to_each_discovered_nsqd_as_max_in_flight_needs(
        lookupd_factory: Callable[..., Daemon], nsqd_factory: Callable[..., Daemon]) -> None:  # noqa: F811
    lookupd = lookupd_factory()
    nodes = [registered_nsqd(nsqd_factory, [lookupd], "--max-rdy-count=50") for _ in range(2)]
    held: list[MessageBatch] = []

    def on_batch(batch: MessageBatch) -> None:
        batch.disable_auto_response()
        held.append(batch)

    async def main() -> None:
        for node in nodes:
            async with Producer(tcp(node)) as p:
                await p.multi_publish("many", [b"m-%d" % i for i in range(500)])
        await until(lambda: len(lookup(lookupd, "many")) == 2, what="both nodes registered")
        c = BatchConsumer("many", "ch", on_batch, lookupd_http_addresses=[lookupd.http_url],
                          max_in_flight=300, connections_per_nsqd=0)
        await c.start()
        try:
            # each node's share, 150, needs three connections of RDY 50
            await until(lambda: sum(len(b) for b in held) >= 300, what="300 held messages")
            assert sorted(c.conns) == sorted(f"{node_address(n)}{tail}" for n in nodes for tail in ("", "#1", "#2"))
            assert {b.nsqd_address for b in held} == {node_address(n) for n in nodes}
        finally:
            for batch in held:
                batch.finish()
            await c.stop()
    run_async(main())
