"""Discovery: nsqd nodes registering with nsqlookupd, and consumers finding them through it."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from pynsqd.shm.segment import list_segments
from testbed.harness import Daemon, scaled, wait_for
from tests.support.foreign import ClientProc, publish, run

pytestmark = pytest.mark.slow


@pytest.fixture
def lookupd_factory() -> Iterator[Callable[..., Daemon]]:
    started: list[Daemon] = []

    def make(*args: str) -> Daemon:
        daemon = Daemon("pynsqd.lookupd", ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                                           "--broadcast-address=127.0.0.1", *args])
        started.append(daemon)
        return daemon.start()

    yield make
    for daemon in started:
        daemon.stop()


def lookup(lookupd: Daemon, topic: str) -> list[str]:
    """``host:tcp_port`` of the producers lookupd lists for ``topic``."""
    resp = httpx.get(f"{lookupd.http_url}/lookup", params={"topic": topic}, timeout=scaled(5))
    if resp.status_code == 404:
        return []
    return sorted(f"{p['broadcast_address']}:{p['tcp_port']}" for p in resp.json()["producers"])


def node_address(nsqd: Daemon) -> str:
    return f"127.0.0.1:{nsqd.tcp[1]}"


def registered_nsqd(nsqd_factory: Callable[..., Daemon], lookupds: list[Daemon], *args: str,
                    data_path: Path | None = None) -> Daemon:
    flags = [f"--lookupd-tcp-address=127.0.0.1:{lk.tcp[1]}" for lk in lookupds]
    return nsqd_factory("--broadcast-address=127.0.0.1", *flags, *args, data_path=data_path)


def pub(nsqd: Daemon, topic: str, body: bytes = b"x") -> None:
    assert httpx.post(f"{nsqd.http_url}/pub", params={"topic": topic}, content=body,
                      timeout=scaled(5)).text == "OK"


def test_producers_of_a_topic_on_two_nodes_and_two_lookupds(
        lookupd_factory: Callable[..., Daemon], nsqd_factory: Callable[..., Daemon]) -> None:
    lookupds = [lookupd_factory(), lookupd_factory()]
    nodes = [registered_nsqd(nsqd_factory, lookupds) for _ in range(2)]
    for node in nodes:
        pub(node, "shared")
    httpx.post(f"{nodes[0].http_url}/channel/create", params={"topic": "shared", "channel": "ch"})
    expected = sorted(node_address(n) for n in nodes)
    for lk in lookupds:
        wait_for(lambda lk=lk: lookup(lk, "shared") == expected, what="both producers in /lookup")
        channels = httpx.get(f"{lk.http_url}/channels", params={"topic": "shared"}).json()["channels"]
        assert channels == ["ch"]
    # a topic deleted on one node leaves that node's entry
    httpx.post(f"{nodes[0].http_url}/topic/delete", params={"topic": "shared"})
    for lk in lookupds:
        wait_for(lambda lk=lk: lookup(lk, "shared") == [node_address(nodes[1])], what="node 0 gone")


def test_new_topic_gets_channels_known_to_lookupd(
        lookupd_factory: Callable[..., Daemon], nsqd_factory: Callable[..., Daemon]) -> None:
    lk = lookupd_factory()
    httpx.post(f"{lk.http_url}/channel/create", params={"topic": "pre", "channel": "known"})
    httpx.post(f"{lk.http_url}/channel/create", params={"topic": "pre", "channel": "gone#ephemeral"})
    node = registered_nsqd(nsqd_factory, [lk])
    wait_for(lambda: "LOOKUPD" in node.output, what="registration")
    pub(node, "pre")

    def channels() -> list[str]:
        data = httpx.get(f"{node.http_url}/stats", params={"format": "json"}).json()
        return [c["channel_name"] for t in data["topics"] for c in t["channels"]]
    wait_for(lambda: channels() == ["known"], what="channel pre-created from lookupd")


def test_tombstone_hides_a_producer_then_expires(
        lookupd_factory: Callable[..., Daemon], nsqd_factory: Callable[..., Daemon]) -> None:
    lk = lookupd_factory("--tombstone-lifetime=1s")
    node = registered_nsqd(nsqd_factory, [lk])
    pub(node, "tomb")
    wait_for(lambda: lookup(lk, "tomb") == [node_address(node)], what="registered")
    resp = httpx.post(f"{lk.http_url}/topic/tombstone",
                      params={"topic": "tomb", "node": f"127.0.0.1:{node.http[1]}"})
    assert resp.status_code == 200
    assert lookup(lk, "tomb") == []
    wait_for(lambda: lookup(lk, "tomb") == [node_address(node)], timeout=10, what="tombstone expired")


def test_restarted_lookupd_gets_the_full_state_back(
        lookupd_factory: Callable[..., Daemon], nsqd_factory: Callable[..., Daemon]) -> None:
    lk = lookupd_factory()
    node = registered_nsqd(nsqd_factory, [lk])
    for topic in ("a", "b", "c"):
        pub(node, topic)
    httpx.post(f"{node.http_url}/channel/create", params={"topic": "b", "channel": "ch"})
    wait_for(lambda: lookup(lk, "c") == [node_address(node)], what="registered")
    tcp_port, http_port = lk.tcp[1], lk.http[1]
    lk.kill()
    again = lookupd_factory(f"--tcp-address=127.0.0.1:{tcp_port}", f"--http-address=127.0.0.1:{http_port}")
    for topic in ("a", "b", "c"):
        wait_for(lambda t=topic: lookup(again, t) == [node_address(node)], timeout=10,
                 what=f"topic {topic} registered again")
    channels = httpx.get(f"{again.http_url}/channels", params={"topic": "b"}).json()["channels"]
    assert channels == ["ch"]


def test_a_silent_node_drops_out_after_the_inactive_timeout(
        lookupd_factory: Callable[..., Daemon], nsqd_factory: Callable[..., Daemon]) -> None:
    # lookupd counts a node active from its IDENTIFY and PINGs (every 15 s), not its REGISTERs:
    # the timeout leaves room to see the registration on a loaded machine before it passes
    lk = lookupd_factory("--inactive-producer-timeout=6s")
    node = registered_nsqd(nsqd_factory, [lk])
    pub(node, "quiet")
    wait_for(lambda: lookup(lk, "quiet") == [node_address(node)], what="registered")
    node.signal(signal.SIGSTOP)  # connection stays open, pings stop
    try:
        wait_for(lambda: lookup(lk, "quiet") == [], timeout=15, what="inactive producer filtered")
        nodes = httpx.get(f"{lk.http_url}/nodes").json()["producers"]
        assert nodes == []
    finally:
        node.signal(signal.SIGCONT)


def test_put_config_changes_lookupd_peers(
        lookupd_factory: Callable[..., Daemon], nsqd_factory: Callable[..., Daemon]) -> None:
    first, second = lookupd_factory(), lookupd_factory()
    node = registered_nsqd(nsqd_factory, [first])
    pub(node, "moving")
    wait_for(lambda: lookup(first, "moving") == [node_address(node)], what="on the first lookupd")
    addresses = [f"127.0.0.1:{second.tcp[1]}"]
    resp = httpx.put(f"{node.http_url}/config/nsqlookupd_tcp_addresses", json=addresses)
    assert resp.json() == addresses
    wait_for(lambda: lookup(second, "moving") == [node_address(node)], what="on the second lookupd")
    wait_for(lambda: lookup(first, "moving") == [], what="gone from the first lookupd")


def test_pynsq_reader_via_lookupd_consumes_from_every_node(
        lookupd_factory: Callable[..., Daemon], nsqd_factory: Callable[..., Daemon],
        clients: list[ClientProc]) -> None:
    lookupds = [lookupd_factory(), lookupd_factory()]
    nodes = [registered_nsqd(nsqd_factory, lookupds) for _ in range(2)]
    publish(clients, "pynsq", nodes[0], "found", 50, "--prefix", "n0-")
    publish(clients, "pynsq", nodes[1], "found", 50, "--prefix", "n1-")
    for lk in lookupds:
        wait_for(lambda lk=lk: len(lookup(lk, "found")) == 2, what="registered")
    reader = run(clients, "pynsq", "sub", "--topic", "found", "--channel", "ch", "--count", "150",
                 "--max-in-flight", "10", *[a for lk in lookupds for a in ("--lookupd", lk.http_url)])

    def received() -> int:
        stats = [httpx.get(f"{n.http_url}/stats", params={"format": "json"}).json() for n in nodes]
        return sum(c["message_count"] - c["depth"] for s in stats for t in s["topics"] for c in t["channels"])
    wait_for(lambda: received() >= 100, timeout=20, what="the reader to drain both nodes")
    late = registered_nsqd(nsqd_factory, lookupds)  # a node that joins after the reader started
    publish(clients, "pynsq", late, "found", 50, "--prefix", "n2-")
    assert reader.finish(timeout=40) == 0, reader.err.decode()
    bodies = sorted(m["body"] for m in reader.messages())
    assert bodies == sorted([f"n{n}-{i}" for n in range(3) for i in range(50)])


def test_a_malformed_lookupd_address_is_logged_and_the_node_runs_and_exits_cleanly(
        nsqd_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    data = tmp_path / "data"
    nsqd = nsqd_factory("--shards=2", "--lookupd-tcp-address=nohost", "--lookupd-tcp-address=127.0.0.1:nan",
                        data_path=data)
    nsqd.wait_for_log(r"ERROR: LOOKUPD\(nohost\): failed to connect - invalid value 'nohost'", 10)
    nsqd.wait_for_log(r"ERROR: LOOKUPD\(127.0.0.1:nan\): failed to connect", 10)
    assert httpx.get(f"{nsqd.http_url}/ping", timeout=scaled(5)).text == "OK"
    assert nsqd.stop() == 0
    assert "exited cleanly" in nsqd.output
    assert list_segments(str(data)) == []  # the inbound rings are gone with the clean exit
