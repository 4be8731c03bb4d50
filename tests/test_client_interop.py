"""pynsqd.client with clients written by others (pynsq from PyPI, nsqjs from npm), both ways,
on the same topics of a real nsqd."""

from __future__ import annotations

import pytest

from pynsqd.client import Consumer, Producer
from testbed.harness import Daemon, wait_for
from tests.conftest import run_async
from tests.support.foreign import KINDS, ClientProc, client_count, consume, publish
from tests.test_client_library import tcp, until

pytestmark = [pytest.mark.slow, pytest.mark.clients]


@pytest.mark.parametrize("kind", KINDS)
def test_they_publish_we_consume(nsqd: Daemon, clients: list[ClientProc], kind: str) -> None:
    publish(clients, kind, nsqd, "from-them", 300)
    publish(clients, kind, nsqd, "from-them", 200, "--mpub", "50", "--prefix", "batch-")
    got: list[bytes] = []

    async def main() -> None:
        c = Consumer("from-them", "ours", lambda m: got.append(m.body), nsqd_tcp_addresses=[tcp(nsqd)],
                     max_in_flight=25)
        await c.start()
        try:
            await until(lambda: len(got) >= 500)
        finally:
            await c.stop()
    run_async(main())
    assert sorted(got) == sorted([b"msg-%d" % i for i in range(300)] + [b"batch-%d" % i for i in range(200)])


@pytest.mark.parametrize("kind", KINDS)
def test_we_publish_they_consume_next_to_our_consumer(nsqd: Daemon, clients: list[ClientProc], kind: str) -> None:
    theirs = consume(clients, kind, nsqd, "from-us", "theirs", 400, "--max-in-flight", "20")
    wait_for(lambda: client_count(nsqd, "from-us", "theirs") == 1, timeout=15, what="their subscription")
    ours: list[bytes] = []

    async def main() -> None:
        c = Consumer("from-us", "ours", lambda m: ours.append(m.body), nsqd_tcp_addresses=[tcp(nsqd)],
                     max_in_flight=20)
        await c.start()
        try:
            async with Producer(tcp(nsqd)) as p:
                for i in range(300):
                    await p.publish("from-us", b"msg-%d" % i)
                await p.multi_publish("from-us", [b"m-%d" % i for i in range(100)])
            await until(lambda: len(ours) >= 400)
        finally:
            await c.stop()
    run_async(main())
    assert theirs.finish() == 0, theirs.err.decode()
    expected = sorted([f"msg-{i}" for i in range(300)] + [f"m-{i}" for i in range(100)])
    assert sorted(m["body"] for m in theirs.messages()) == expected
    assert sorted(b.decode() for b in ours) == expected
