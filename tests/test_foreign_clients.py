"""Clients nobody here wrote — pynsq (PyPI) and nsqjs (npm) — against the real server.

Each client runs as its own process (``tests/support/clients/pynsq_app.py``, ``tests/support/js/client.js``,
same arguments); consumers print one JSON line per finished message.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from testbed.harness import Daemon, wait_for
from tests.support.foreign import KINDS, ClientProc, channel_stats, client_count, consume, publish

pytestmark = [pytest.mark.slow, pytest.mark.clients]


@pytest.fixture(params=["default", "4"], ids=lambda p: f"shards-{p}")
def nsqd(request: pytest.FixtureRequest, nsqd_factory: Callable[..., Daemon]) -> Daemon:
    """Every client test runs against the default node (one shard per CPU) and ``--shards 4``."""
    return nsqd_factory() if request.param == "default" else nsqd_factory(f"--shards={request.param}")


@pytest.mark.parametrize("publisher", KINDS)
@pytest.mark.parametrize("consumer", KINDS)
def test_publish_and_consume_with_fin(nsqd: Daemon, clients: list[ClientProc], publisher: str,
                                      consumer: str) -> None:
    publish(clients, publisher, nsqd, "interop", 500)
    publish(clients, publisher, nsqd, "interop", 500, "--mpub", "100", "--prefix", "batch-")
    sub = consume(clients, consumer, nsqd, "interop", "ch", 1000, "--max-in-flight", "50")
    assert sub.finish() == 0, sub.err.decode()
    bodies = sorted(m["body"] for m in sub.messages())
    expected = sorted([f"msg-{i}" for i in range(500)] + [f"batch-{i}" for i in range(500)])
    assert bodies == expected
    wait_for(lambda: channel_stats(nsqd, "interop", "ch")["in_flight_count"] == 0, what="all FINed")
    assert channel_stats(nsqd, "interop", "ch")["depth"] == 0


@pytest.mark.parametrize("kind", KINDS)
def test_deferred_publish(nsqd: Daemon, clients: list[ClientProc], kind: str) -> None:
    sub = consume(clients, kind, nsqd, "deferred", "ch", 10, "--max-in-flight", "10")
    wait_for(lambda: any(t["topic_name"] == "deferred" for t in httpx.get(
        f"{nsqd.http_url}/stats?format=json", timeout=5).json()["topics"]), what="subscription")
    publish(clients, kind, nsqd, "deferred", 10, "--defer", "500")
    assert sub.finish() == 0, sub.err.decode()
    assert len(sub.messages()) == 10


@pytest.mark.parametrize("kind", KINDS)
def test_requeue_redelivers(nsqd: Daemon, clients: list[ClientProc], kind: str) -> None:
    publish(clients, "pynsq", nsqd, "requeue", 20)
    sub = consume(clients, kind, nsqd, "requeue", "ch", 20, "--req-first", "--max-in-flight", "5")
    assert sub.finish() == 0, sub.err.decode()
    got = sub.messages()
    assert sorted(m["body"] for m in got) == sorted(f"msg-{i}" for i in range(20))
    assert {m["attempts"] for m in got} == {2}
    assert channel_stats(nsqd, "requeue", "ch")["requeue_count"] == 20


@pytest.mark.parametrize("kind", KINDS)
def test_touch_keeps_messages_in_flight(nsqd: Daemon, clients: list[ClientProc], kind: str) -> None:
    publish(clients, "pynsq", nsqd, "touched", 3)
    sub = consume(clients, kind, nsqd, "touched", "ch", 3, "--touch", "--msg-timeout", "1000",
                  "--max-in-flight", "3")
    assert sub.finish() == 0, sub.err.decode()
    got = sub.messages()
    assert sorted(m["body"] for m in got) == ["msg-0", "msg-1", "msg-2"]
    assert {m["attempts"] for m in got} == {1}  # held ~2 s on a 1 s timeout, never redelivered
    assert channel_stats(nsqd, "touched", "ch")["timeout_count"] == 0


@pytest.mark.parametrize("kind", KINDS)
def test_several_consumers_share_a_channel(nsqd: Daemon, clients: list[ClientProc], kind: str) -> None:
    subs = [consume(clients, kind, nsqd, "split", "ch", 0, "--max-in-flight", "10") for _ in range(3)]
    wait_for(lambda: client_count(nsqd, "split", "ch") == 3, timeout=15, what="3 consumers")
    publish(clients, "pynsq", nsqd, "split", 600, "--mpub", "50")
    wait_for(lambda: _drained(nsqd, "split", "ch"), timeout=20, what="channel drained")
    for s in subs:
        s.stop()
    per_sub = [[m["body"] for m in s.messages()] for s in subs]
    everything = sorted(b for bodies in per_sub for b in bodies)
    assert everything == sorted(f"msg-{i}" for i in range(600))  # each exactly once
    assert all(per_sub), [len(b) for b in per_sub]


@pytest.mark.parametrize("kind", KINDS)
def test_several_channels_each_get_everything(nsqd: Daemon, clients: list[ClientProc], kind: str) -> None:
    subs = [consume(clients, kind, nsqd, "multi", f"ch{i}", 200, "--max-in-flight", "20") for i in range(2)]
    wait_for(lambda: all(client_count(nsqd, "multi", f"ch{i}") == 1 for i in range(2)), timeout=15,
             what="2 channels")
    publish(clients, "nsqjs" if kind == "pynsq" else "pynsq", nsqd, "multi", 200)
    for s in subs:
        assert s.finish() == 0, s.err.decode()
        assert sorted(m["body"] for m in s.messages()) == sorted(f"msg-{i}" for i in range(200))


def _drained(nsqd: Daemon, topic: str, channel: str) -> bool:
    ch = channel_stats(nsqd, topic, channel)
    return bool(ch["depth"] == 0 and ch["in_flight_count"] == 0 and ch["message_count"] > 0)
