"""The multi-shard node end to end: placement, hand-off, relay, cross-shard publish, crashes,
restarts and shutdown, all on real processes."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import resource
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from pynsqd.node.control import PROXY_WAIT
from pynsqd.shm.segment import list_segments
from pynsqd.wire.commands import encode_auth, encode_dpub, encode_fin, encode_mpub, encode_pub, encode_rdy, encode_sub
from pynsqd.wire.frames import FRAME_MESSAGE, FRAME_RESPONSE
from testbed.certs import Certs
from testbed.harness import Daemon, decoy_checkout, remove_segments, scaled, wait_for
from tests.conftest import run_async
from tests.support.authserver import AuthServer, grant
from tests.support.nodeclient import Consumer, Producer
from tests.support.rawclient import Message, RawClient

pytestmark = pytest.mark.slow

NodeFactory = Callable[..., Daemon]


@pytest.fixture
def node(tmp_path: Path) -> Iterator[NodeFactory]:
    """``node("--shards=4", env={...})`` → a started nsqd on ``tmp_path/data``."""
    started: list[Daemon] = []

    def make(*args: str, env: dict[str, str] | None = None, start: bool = True) -> Daemon:
        path = tmp_path / "data"
        path.mkdir(exist_ok=True)
        daemon = Daemon("pynsqd.supervisor", ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                                              f"--data-path={path}", *args], env=env)
        started.append(daemon)
        return daemon.start() if start else daemon

    yield make
    for daemon in started:
        daemon.stop()
    remove_segments(started)  # shared memory outlives the daemons: give it back


SHARD_STATS = "/stats?format=json&include_shards=true"  # with pynsqd's shard facts


def get_json(nsqd: Daemon, path: str) -> Any:
    with urllib.request.urlopen(nsqd.http_url + path, timeout=scaled(10)) as resp:
        return json.loads(resp.read())


def owners(tmp_path: Path) -> dict[str, int]:
    table = {}
    for line in (tmp_path / "data" / "pynsqd.placement").read_text().splitlines():
        shard, _, topic = line.partition(" ")
        table[topic] = int(shard)
    return table


def client_shards(stats: dict[str, Any]) -> dict[tuple[str, str], set[int]]:
    out: dict[tuple[str, str], set[int]] = {}
    for t in stats["topics"]:
        for c in t["channels"]:
            out[(t["topic_name"], c["channel_name"])] = {cl["shard"] for cl in c["clients"] or []}
    return out


async def _subscribe_all(nsqd: Daemon, topics: list[str], channels: list[str]) -> list[Consumer]:
    consumers = [Consumer(nsqd.tcp, t, c) for t in topics for c in channels]
    for consumer in consumers:
        consumer.start()
    await asyncio.wait_for(asyncio.gather(*(c.subscribed.wait() for c in consumers)), scaled(30))
    return consumers


async def _until(predicate: Callable[[], bool], seconds: float, what: str) -> None:
    end = asyncio.get_running_loop().time() + scaled(seconds)
    while not predicate():
        if asyncio.get_running_loop().time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def test_forty_topics_on_four_shards_every_message_arrives_at_its_owner(node: NodeFactory, tmp_path: Path) -> None:
    nsqd = node("--shards=4")
    topics = [f"load{i:02d}" for i in range(40)]

    async def main() -> None:
        consumers = await _subscribe_all(nsqd, topics, ["a", "b"])
        producer = Producer(nsqd.tcp)
        await producer.connect()
        for r in range(5):
            for t in topics:
                await producer.mpub(t, [f"{t}:{r}:{k}".encode() for k in range(20)])
        expected = 100
        await _until(lambda: all(len(c.received) == expected for c in consumers), 60, "every message")
        for c in consumers:
            assert sorted(c.received) == sorted(f"{c.topic}:{r}:{k}".encode() for r in range(5) for k in range(20))
            assert set(c.received.values()) == {1}
        stats = get_json(nsqd, SHARD_STATS)
        table = owners(tmp_path)
        assert sorted(table[t] for t in topics) == sorted(list(range(4)) * 10)  # 10 topics per shard
        for (topic, _), shards in client_shards(stats).items():
            assert shards == {table[topic]}  # every consumer is served by its topic's owner
        assert {t["topic_name"]: t["message_count"] for t in stats["topics"]} == dict.fromkeys(topics, 100)
        sup = stats["supervisor"]
        assert sup["shards"] == 4 and sup["handoffs"] >= 81 and sup["relays"] == 0
        assert sup["cross_shard_sent"] == sup["cross_shard_received"] == 30 * 100  # 30 of 40 topics elsewhere
        producer.close()
        for c in consumers:
            await c.stop()

    run_async(main())


def test_kill_9_of_a_shard_under_load(node: NodeFactory, tmp_path: Path) -> None:
    """Queues live in shared memory: a killed shard loses nothing that got OK. Its
    consumers reconnect to the restarted shard and get every message, those it had in
    flight again with their attempts counted on; the other shards never stop serving."""
    nsqd = node("--shards=4")
    topics = [f"k{i:02d}" for i in range(12)]

    async def main() -> None:
        consumers = await _subscribe_all(nsqd, topics, ["a", "b"])
        table = owners(tmp_path)
        producer = Producer(nsqd.tcp)
        await producer.connect()
        await producer.mpub(topics[0], [b"first"])
        victim = next(s for s in range(4) if s != table[topics[0]])  # not the producer's shard
        before = get_json(nsqd, SHARD_STATS)["supervisor"]["shard_status"]
        for r in range(30):
            for t in topics:
                await producer.mpub(t, [f"{t}:{r}:{k}".encode() for k in range(10)])
            if r == 10:
                os.kill(before[victim]["pid"], signal.SIGKILL)
        await _until(lambda: get_json(nsqd, SHARD_STATS)["supervisor"]["shard_restarts"] == 1,
                     30, "the shard's restart")
        acked = set(producer.acked)

        def want(c: Consumer) -> set[bytes]:
            prefix = f"{c.topic}:".encode()
            return {b for b in acked if b.startswith(prefix) or (b == b"first" and c.topic == topics[0])}

        await _until(lambda: all(want(c) <= set(c.received) for c in consumers), 60,
                     "every acknowledged message")
        after = get_json(nsqd, SHARD_STATS)["supervisor"]["shard_status"]
        assert after[victim]["pid"] != before[victim]["pid"] and after[victim]["ready"]
        for c in consumers:
            assert set(c.received) == want(c)  # nothing lost, nothing invented
            if table[c.topic] == victim:
                assert c.connections >= 2  # reconnected to the restarted shard
                for body in c.unfinished_on_lost:  # in flight when the shard died, if not FINed
                    seen = c.attempts[body]
                    assert seen == sorted(seen) and (len(seen) == 1 or seen[-1] >= 2), (body, seen)
            else:
                assert c.connections == 1 and not c.unfinished_on_lost  # never stopped serving
                assert set(c.received.values()) == {1}
        producer.close()
        for c in consumers:
            await c.stop()

    run_async(main())


def test_kill_9_of_the_whole_tree_under_load_loses_nothing(node: NodeFactory, tmp_path: Path) -> None:
    """SIGKILL to the supervisor and every shard at once, mid-publish; a new node on the
    same data path delivers every message that got OK."""
    nsqd = node("--shards=2")
    topics = [f"w{i}" for i in range(6)]

    async def main() -> set[bytes]:
        producer = Producer(nsqd.tcp)
        await producer.connect()
        try:
            for r in range(1000):
                for t in topics:
                    await producer.mpub(t, [f"{t}:{r}:{k}".encode() for k in range(20)])
                if r == 20:
                    await asyncio.to_thread(nsqd.kill)
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            pass
        producer.close()
        return set(producer.acked)

    acked = run_async(main())
    assert len(acked) >= 21 * 6 * 20
    again = node("--shards=2")

    async def resume() -> None:
        consumers = await _subscribe_all(again, topics, ["a"])
        await _until(lambda: acked <= {b for c in consumers for b in c.received}, 60,
                     "every acknowledged message after the crash")
        for c in consumers:
            await c.stop()

    run_async(resume())


def test_sigterm_under_load_then_restart_loses_nothing(node: NodeFactory, tmp_path: Path) -> None:
    nsqd = node("--shards=2")
    topics = [f"s{i}" for i in range(6)]

    async def main() -> tuple[set[bytes], dict[bytes, int]]:
        consumers = await _subscribe_all(nsqd, topics, ["a"])
        producer = Producer(nsqd.tcp)
        await producer.connect()
        try:
            for r in range(1000):
                for t in topics:
                    await producer.mpub(t, [f"{t}:{r}:{k}".encode() for k in range(50)])
                if r == 5:
                    nsqd.signal(signal.SIGTERM)
        except ConnectionError:
            pass
        producer.close()
        assert await asyncio.to_thread(nsqd.wait, 30) == 0
        got: dict[bytes, int] = {}
        for c in consumers:
            await c.stop()
            for body, n in c.received.items():
                got[body] = got.get(body, 0) + n
        return set(producer.acked), got

    acked, got = run_async(main())
    assert "exited cleanly" in nsqd.output
    again = node("--shards=2")

    async def resume() -> dict[bytes, int]:
        consumers = await _subscribe_all(again, topics, ["a"])
        await _until(lambda: acked <= set(got) | {b for c in consumers for b in c.received}, 60,
                     "every acknowledged message after the restart")
        out: dict[bytes, int] = {}
        for c in consumers:
            await c.stop()
            for body, n in c.received.items():
                out[body] = out.get(body, 0) + n
        return out

    later = run_async(resume())
    total = {b: got.get(b, 0) + later.get(b, 0) for b in set(got) | set(later)}
    assert acked <= set(total)
    # The shutdown stops delivering and waits for the FINs of what is in flight before it
    # closes the connections, so no FINed message comes back.
    assert [b for b, n in total.items() if n > 1] == []
    assert "requeueing" not in nsqd.output


def test_a_connection_that_subscribes_elsewhere_is_relayed(node: NodeFactory, tmp_path: Path) -> None:
    nsqd = node("--shards=2")
    with RawClient(nsqd.tcp) as c:
        c.send(encode_pub("relay_a", b"one"))
        assert c.read_frame() == (FRAME_RESPONSE, b"OK")
        table = owners(tmp_path)
        other = next(f"relay_b{i}" for i in range(50)
                     if _owner_after_create(nsqd, tmp_path, f"relay_b{i}") != table["relay_a"])
        c.send(encode_sub(other, "ch") + encode_rdy(5))
        assert c.read_frame() == (FRAME_RESPONSE, b"OK")
        with RawClient(nsqd.tcp) as p:
            p.send(encode_pub(other, b"through the relay"))
            assert p.read_frame() == (FRAME_RESPONSE, b"OK")
        kind, data = c.read_frame()
        assert kind == FRAME_MESSAGE and Message(data).body == b"through the relay"
        stats = get_json(nsqd, SHARD_STATS)
        assert client_shards(stats)[(other, "ch")] == {owners(tmp_path)[other]}
        assert stats["supervisor"]["relays"] == 1


def _owner_after_create(nsqd: Daemon, tmp_path: Path, topic: str) -> int:
    with urllib.request.urlopen(urllib.request.Request(f"{nsqd.http_url}/topic/create?topic={topic}",
                                                       method="POST"), timeout=scaled(10)):
        pass
    return owners(tmp_path)[topic]


@pytest.mark.parametrize("upgrade", ["snappy", "deflate", "tls", "tls+snappy", "tls+deflate"])
def test_an_upgraded_connection_is_relayed_through_its_codec(node: NodeFactory, certs: Certs, tmp_path: Path,
                                                             upgrade: str) -> None:
    """TLS/compression are negotiated on the shard that got the IDENTIFY (round robin); a
    SUB to a topic another shard owns is relayed, the codec between the client socket and
    the pump: PUB, SUB, messages, FIN and stats all work through it."""
    nsqd = node("--shards=2", *certs.server_args())
    tls = upgrade.startswith("tls")
    compression = upgrade.rpartition("+")[2] if upgrade != "tls" else ""
    with RawClient(nsqd.tcp) as c:
        c.negotiate(certs.client_context() if tls else None, compression)
        for i in range(6):
            c.send(encode_pub(f"z{i}", b"x"))
            c.expect_ok()
    owner = {t: s for t, s in owners(tmp_path).items() if t.startswith("z")}
    by_shard = [next(t for t in sorted(owner) if owner[t] == shard) for shard in (0, 1)]
    assert len(set(by_shard)) == 2
    # connections land on the shards in turn: t0, t0, t1, t1 relays two of the four SUBs
    for topic in (by_shard[0], by_shard[0], by_shard[1], by_shard[1]):
        with RawClient(nsqd.tcp) as c:
            c.negotiate(certs.client_context() if tls else None, compression)
            c.send(encode_sub(topic, "c") + encode_rdy(1))
            c.expect_ok()
            msg = c.read_message()
            assert msg.body == b"x"
            c.send(b"FIN " + msg.id + b"\n")
            c.send(encode_pub(topic, b"x"))  # PUB after SUB, answered through the relay too
            c.expect_ok()
            client = next(cl for t in get_json(nsqd, SHARD_STATS)["topics"] if t["topic_name"] == topic
                          for ch in t["channels"] for cl in ch["clients"])
            assert client["tls"] is tls and client["shard"] == owner[topic]
            assert client["snappy"] is (compression == "snappy") and client["deflate"] is (compression == "deflate")
    assert get_json(nsqd, SHARD_STATS)["supervisor"]["relays"] == 2


def test_an_authenticated_connection_keeps_its_session_through_the_relay(node: NodeFactory, tmp_path: Path) -> None:
    """AUTH runs on the shard that got the connection; the owner of a relayed SUB gets the
    session (permissions, identity, remaining TTL) and enforces it without asking again."""
    auth = AuthServer().start()
    try:
        auth.replies["s3cret"] = grant(("^a", ["^ch$"], ["subscribe"]), ("^a", [".*"], ["publish"]), identity="alice")
        nsqd = node("--shards=2", f"--auth-http-address={auth.address}")

        def authed() -> RawClient:
            c = RawClient(nsqd.tcp)
            assert c.identify()["auth_required"] is True
            c.send(encode_auth(b"s3cret"))
            assert json.loads(c.expect_response())["identity"] == "alice"
            return c

        with authed() as c:
            for i in range(6):
                c.send(encode_pub(f"a{i}", b"x"))
                c.expect_ok()
        owner = {t: s for t, s in owners(tmp_path).items() if t.startswith("a")}
        by_shard = [next(t for t in sorted(owner) if owner[t] == shard) for shard in (0, 1)]
        queries = len(auth.requests)
        for topic in (by_shard[0], by_shard[0], by_shard[1], by_shard[1]):  # two of these are relayed
            with authed() as c:
                c.send(encode_sub(topic, "nope"))
                c.expect_error(f'E_UNAUTHORIZED AUTH failed for SUB on "{topic}" "nope"')
            with authed() as c:
                c.send(encode_sub(topic, "ch") + encode_rdy(1))
                c.expect_ok()
                assert c.read_message().body == b"x"
                client = next(cl for t in get_json(nsqd, SHARD_STATS)["topics"] if t["topic_name"] == topic
                              for ch in t["channels"] for cl in ch["clients"])
                assert client["shard"] == owner[topic] and client["auth_identity"] == "alice"
        assert len(auth.requests) == queries + 8  # one per AUTH: the owner never asked again
        assert get_json(nsqd, SHARD_STATS)["supervisor"]["relays"] >= 2
    finally:
        auth.stop()


def test_admin_calls_reach_the_owner_and_stats_show_one_node(node: NodeFactory, tmp_path: Path) -> None:
    nsqd = node("--shards=2")

    def post(path: str) -> int:
        req = urllib.request.Request(nsqd.http_url + path, method="POST", data=b"")
        with urllib.request.urlopen(req, timeout=scaled(10)) as resp:
            return int(resp.status)

    topics = [f"adm{i}" for i in range(8)]
    for t in topics:  # each request is a new connection: either shard may answer it
        assert post(f"/topic/create?topic={t}") == 200
        assert post(f"/channel/create?topic={t}&channel=c") == 200
        assert post(f"/channel/pause?topic={t}&channel=c") == 200
    assert {owners(tmp_path)[t] for t in topics} == {0, 1}
    for _ in range(4):
        stats = get_json(nsqd, SHARD_STATS)
        assert [t["topic_name"] for t in stats["topics"]] == topics
        assert all(t["channels"][0]["paused"] for t in stats["topics"])
    for t in topics[:4]:
        assert post(f"/topic/delete?topic={t}") == 200
    assert [t["topic_name"] for t in get_json(nsqd, SHARD_STATS)["topics"]] == topics[4:]
    with urllib.request.urlopen(nsqd.http_url + "/metrics", timeout=scaled(10)) as resp:
        text = resp.read().decode()
    assert all(f'nsq_channel_paused{{channel="c",topic="{t}"}} 1.0' in text for t in topics[4:])
    assert "nsq_supervisor_shards 2.0" in text


def _post(nsqd: Daemon, path: str) -> tuple[int, bytes, str | None]:
    """POST ``path`` on a new connection → (status, body, X-NSQ-Content-Type)."""
    req = urllib.request.Request(nsqd.http_url + path, method="POST", data=b"")
    try:
        with urllib.request.urlopen(req, timeout=scaled(30)) as resp:
            return int(resp.status), resp.read(), resp.headers["X-NSQ-Content-Type"]
    except urllib.error.HTTPError as err:
        return err.code, err.read(), err.headers["X-NSQ-Content-Type"]


def test_an_admin_call_whose_owner_shard_is_down_answers_500_internal_error(node: NodeFactory,
                                                                            tmp_path: Path) -> None:
    """The topic's owner is stopped (alive, silent): the other shard answers nsqd's 500 once
    PROXY_WAIT has passed. It is killed: 500 at once, without waiting. Restarted: 200 again."""
    nsqd = node("--shards=2")
    topics = [f"down{i}" for i in range(12)]
    for t in topics:
        assert _post(nsqd, f"/topic/create?topic={t}")[0] == 200
    table = owners(tmp_path)
    topic = next(t for t in topics if table[t] == 1)
    failed = (500, b'{"message":"INTERNAL_ERROR"}', "nsq; version=1.0")
    pid = get_json(nsqd, SHARD_STATS)["supervisor"]["shard_status"][1]["pid"]

    _stop(nsqd, 1, pid)  # the only shard that takes the connection is shard 0
    try:
        started = time.monotonic()
        assert _post(nsqd, f"/topic/pause?topic={topic}") == failed
        assert PROXY_WAIT <= time.monotonic() - started < PROXY_WAIT + scaled(2)
        nsqd.wait_for_log(rf"HTTP POST /topic/pause failed - shard 1 did not answer in {PROXY_WAIT:g}s")
    finally:
        os.kill(pid, signal.SIGCONT)
    assert _post(nsqd, f"/topic/pause?topic={topic}")[0] == 200

    os.kill(pid, signal.SIGKILL)
    # A connection handed over in the instant between the kill and the kernel closing the
    # shard's end of its channel dies with the shard (as one it had accepted itself would):
    # the hand-off is not acknowledged. From the reaping on, connections go to shard 0.
    nsqd.wait_for_log(rf"shard 1 \(pid {pid}\) was killed", timeout=10)
    started = time.monotonic()
    assert _post(nsqd, f"/channel/create?topic={topic}&channel=c") == failed
    assert time.monotonic() - started < PROXY_WAIT  # not a wait for the bound: it is known dead
    nsqd.wait_for_log(r"HTTP POST /channel/create failed - shard 1 is down", timeout=10)
    wait_for(lambda: _post(nsqd, f"/channel/create?topic={topic}&channel=c")[0] == 200, 30,
             interval=0.2, what="the restarted owner answering again")
    assert get_json(nsqd, f"/stats?format=json&topic={topic}")["topics"][0]["paused"] is True


def _stop(nsqd: Daemon, index: int, pid: int) -> None:
    """SIGSTOP shard ``index``, then wait until the supervisor passes it over for new HTTP
    connections (its loop silent for ``STALL_AFTER``)."""
    os.kill(pid, signal.SIGSTOP)
    nsqd.wait_for_log(rf"shard {index} \(pid {pid}\): loop silent for .* new HTTP connections go to the other shards",
                      timeout=10)


def _established(pid: int, port: int) -> int:
    """Established TCP connections of process ``pid`` on local port ``port``."""
    return sum(1 for c in psutil.Process(pid).net_connections(kind="tcp")
               if c.laddr and c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED)


def test_http_connections_go_to_the_shards_in_turn_and_a_stalled_one_is_passed_over(node: NodeFactory) -> None:
    """The supervisor accepts HTTP connections and hands them out in turn, so 6 keep-alive
    connections end up 3 and 3. On a shared socket a burst of 50 split 50/0 in two runs of
    six. A shard whose loop stops gets none, and every new connection is answered at once by
    the other shard; once it beats again it gets its turn back."""
    nsqd = node("--shards=2")
    pids = [s["pid"] for s in get_json(nsqd, SHARD_STATS)["supervisor"]["shard_status"]]
    info = b"GET /info HTTP/1.1\r\nHost: x\r\n\r\n"  # answered by the shard that has the connection
    socks = [socket.create_connection(nsqd.http, timeout=scaled(10)) for _ in range(6)]
    try:
        for sock in socks:
            assert _http_exchange(sock, info)[0] == b"HTTP/1.1 200 OK"
        wait_for(lambda: [_established(pid, nsqd.http[1]) for pid in pids] == [3, 3], 10,
                 what="three connections at each shard")
    finally:
        for sock in socks:
            sock.close()
    _stop(nsqd, 1, pids[1])
    try:
        for _ in range(4):
            with socket.create_connection(nsqd.http, timeout=scaled(10)) as sock:
                assert _http_exchange(sock, info)[0] == b"HTTP/1.1 200 OK"
    finally:
        os.kill(pids[1], signal.SIGCONT)
    nsqd.wait_for_log(rf"shard 1 \(pid {pids[1]}\): beating again", timeout=10)
    socks = [socket.create_connection(nsqd.http, timeout=scaled(10)) for _ in range(2)]
    try:
        for sock in socks:
            assert _http_exchange(sock, info)[0] == b"HTTP/1.1 200 OK"
        wait_for(lambda: _established(pids[1], nsqd.http[1]) == 1, 10, what="shard 1 serving again")
    finally:
        for sock in socks:
            sock.close()
    assert get_json(nsqd, SHARD_STATS)["supervisor"]["http_handoffs"] >= 13
    with urllib.request.urlopen(nsqd.http_url + "/metrics", timeout=scaled(10)) as resp:
        assert re.search(rb"^nsq_supervisor_http_handoffs_total (1[4-9]|[2-9]\d)\.0$", resp.read(), re.M)


def test_while_every_shard_is_stalled_an_http_connection_waits_and_is_then_served(node: NodeFactory) -> None:
    """One shard, stopped: the supervisor hands the connection to nobody (it is not lost
    either). The request waits, and is answered once the shard beats again."""
    nsqd = node("--shards=1")
    pid = get_json(nsqd, SHARD_STATS)["supervisor"]["shard_status"][0]["pid"]
    _stop(nsqd, 0, pid)
    try:
        with socket.create_connection(nsqd.http, timeout=scaled(10)) as sock:
            sock.sendall(b"GET /info HTTP/1.1\r\nHost: x\r\n\r\n")
            sock.settimeout(1.0)
            with pytest.raises(TimeoutError):
                sock.recv(65536)
            os.kill(pid, signal.SIGCONT)
            sock.settimeout(scaled(10))
            data = b""
            while b"\r\n\r\n" not in data:
                data += sock.recv(65536) or b"!"
            assert data.startswith(b"HTTP/1.1 200 OK")
    finally:
        os.kill(pid, signal.SIGCONT)
    assert get_json(nsqd, SHARD_STATS)["supervisor"]["http_handoffs"] >= 3


def test_a_shard_whose_loop_stops_beating_is_killed_and_restarted(node: NodeFactory) -> None:
    nsqd = node("--shards=2", env={"PYNSQD_SHARD_TIMEOUT": "1"})
    pid = get_json(nsqd, SHARD_STATS)["supervisor"]["shard_status"][1]["pid"]
    os.kill(pid, signal.SIGSTOP)  # the process is alive, its loop is not
    nsqd.wait_for_log(rf"shard 1 \(pid {pid}\): no heartbeat", timeout=10)
    nsqd.wait_for_log(rf"shard 1 \(pid {pid}\): still stuck - SIGKILL", timeout=10)
    nsqd.wait_for_log(r"shard 1: restarting", timeout=10)
    wait_for(lambda: get_json(nsqd, SHARD_STATS)["supervisor"]["shard_status"][1]["ready"]
             and get_json(nsqd, SHARD_STATS)["supervisor"]["shard_restarts"] == 1, 20,
             what="the restarted shard")


def test_a_shard_that_cannot_boot_stops_the_node_with_one_line(node: NodeFactory, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "nsqd.dat").write_text('{"topics":[{"name":"broken","paused":false,"channels":[]}],"version":"1.3.0"}')
    (data / "broken.diskqueue.meta.dat").mkdir()  # the shard cannot open its queue
    nsqd = node("--shards=2", start=False)
    with pytest.raises(RuntimeError, match="exited with 1"):
        nsqd.start()
    assert "nsqd: shard 0 failed to boot" in nsqd.output
    assert nsqd.output.count("failed to boot -") == 1


def test_shards_run_the_supervisors_code_whatever_directory_the_node_starts_from(tmp_path: Path) -> None:
    """``python -m`` puts the working directory first on ``sys.path``. A node started (as the
    ``nsqd`` command starts, without that) from a directory holding another ``pynsqd/``
    package runs its shards on the supervisor's code, not that one's."""
    decoy = tmp_path / "checkout"
    imported = decoy_checkout(decoy)
    (tmp_path / "data").mkdir()
    nsqd = Daemon("pynsqd.supervisor", ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                                        f"--data-path={tmp_path / 'data'}", "--shards=2"],
                  cwd=str(decoy), python_flags=["-P"])
    try:
        nsqd.start()
        with RawClient(nsqd.tcp) as c:  # two topics, one per shard (the fewest-topics rule)
            for topic in ("a", "b"):
                c.send(encode_pub(topic, topic.encode()))
                c.expect_ok()
        assert sorted(owners(tmp_path).values()) == [0, 1]
        for topic in ("a", "b"):
            with RawClient(nsqd.tcp) as c:
                c.subscribe(topic, "ch", rdy=1)
                assert c.read_message().body == topic.encode()
        assert all(s["ready"] for s in get_json(nsqd, SHARD_STATS)["supervisor"]["shard_status"])
    finally:
        nsqd.stop()
        remove_segments([nsqd])
    assert not imported.exists(), imported.read_text()
    assert "Traceback" not in nsqd.output


def _drained(nsqd: Daemon, topic: str, channel: str) -> bool:
    """Nothing left in ``topic:channel``: not queued, in flight or deferred."""
    return all(c["depth"] == c["in_flight_count"] == c["deferred_count"] == 0
               for t in get_json(nsqd, SHARD_STATS)["topics"] if t["topic_name"] == topic
               for c in t["channels"] if c["channel_name"] == channel)


def test_cross_shard_mpubs_are_framed_runs_where_they_fit_and_arrive_once_with_exact_stats(
        node: NodeFactory, tmp_path: Path) -> None:
    """``--mem-queue-size=300``; a connection on one shard MPUBs 3 x 200 to a topic the other
    shard owns, with two channels: the first batch is appended to both logs as its framed run
    (one copy each), the second fits only in part (100 in the log, 100 to the disk queue) and
    the third goes to disk whole — both take the per-message path, as does a DPUB. Counts
    are exact and each channel gets every message exactly once."""
    nsqd = node("--shards=2", "--mem-queue-size=300")
    with RawClient(nsqd.tcp) as p:
        p.send(encode_pub("frm_home", b"x"))
        assert p.read_frame() == (FRAME_RESPONSE, b"OK")
        home = owners(tmp_path)["frm_home"]
        away = next(f"frm_away{i}" for i in range(50) if _owner_after_create(nsqd, tmp_path, f"frm_away{i}") != home)
        for channel in ("a", "b"):
            request = urllib.request.Request(f"{nsqd.http_url}/channel/create?topic={away}&channel={channel}",
                                             method="POST")
            urllib.request.urlopen(request, timeout=scaled(10)).close()
        batches = [[b"%d-%03d" % (r, i) + b"." * (i % 9) for i in range(200)] for r in range(3)]
        for batch in batches:
            p.send(encode_mpub(away, batch))
            assert p.read_frame() == (FRAME_RESPONSE, b"OK")
        p.send(encode_dpub(away, 200, b"deferred"))
        assert p.read_frame() == (FRAME_RESPONSE, b"OK")
    bodies = [b for batch in batches for b in batch] + [b"deferred"]
    stats = get_json(nsqd, SHARD_STATS)  # each owner drains its rings before answering
    sup = stats["supervisor"]
    assert sup["cross_shard_sent"] == sup["cross_shard_received"] == 601
    assert sup["cross_shard_framed"] == 200
    (topic,) = [t for t in stats["topics"] if t["topic_name"] == away]
    assert (topic["message_count"], topic["message_bytes"], topic["depth"]) == (601, sum(map(len, bodies)), 0)
    assert [c["channel_name"] for c in topic["channels"]] == ["a", "b"]
    for c in topic["channels"]:
        assert (c["message_count"], c["backend_depth"], c["depth"] + c["deferred_count"]) == (601, 300, 601)
    for channel in ("a", "b"):
        with RawClient(nsqd.tcp) as c:
            c.subscribe(away, channel, rdy=1000)
            got = []
            for _ in range(601):
                m = c.read_message(timeout=scaled(10))
                assert m.attempts == 1
                got.append(m.body)
                c.send(encode_fin(m.id))
            assert sorted(got) == sorted(bodies)
            wait_for(functools.partial(_drained, nsqd, away, channel), 10, what=f"channel {channel} drained")
    (topic,) = [t for t in get_json(nsqd, SHARD_STATS)["topics"] if t["topic_name"] == away]
    assert [c["message_count"] for c in topic["channels"]] == [601, 601] and topic["message_count"] == 601


def test_a_full_inbound_ring_holds_the_publisher_back_and_loses_nothing(node: NodeFactory, tmp_path: Path) -> None:
    nsqd = node("--shards=2", "--mem-queue-size=100000")
    with RawClient(nsqd.tcp) as p:
        p.send(encode_pub("bp_home", b"x"))  # the connection now lives on bp_home's owner
        assert p.read_frame() == (FRAME_RESPONSE, b"OK")
        home = owners(tmp_path)["bp_home"]
        away = next(f"bp_away{i}" for i in range(50) if _owner_after_create(nsqd, tmp_path, f"bp_away{i}") != home)
        pid = get_json(nsqd, SHARD_STATS)["supervisor"]["shard_status"][1 - home]["pid"]
        os.kill(pid, signal.SIGSTOP)  # the owner stops draining its inbound ring (16 MiB)
        try:
            batches = [[b"%04d-%04d-" % (b, i) + b"z" * 10_000 for i in range(100)] for b in range(24)]
            out = p.sock.dup()  # its own timeout: the reader below uses short ones
            out.settimeout(scaled(60))
            sender = threading.Thread(target=lambda: [out.sendall(encode_mpub(away, batch)) for batch in batches])
            sender.start()
            acked = 0
            with pytest.raises(TimeoutError):
                while True:
                    assert p.read_frame(timeout=1.5) == (FRAME_RESPONSE, b"OK")
                    acked += 1
            assert 10 <= acked < len(batches)  # ~16 MiB went in, then the publisher was held back
        finally:
            os.kill(pid, signal.SIGCONT)
        for _ in range(len(batches) - acked):
            assert p.read_frame(timeout=10) == (FRAME_RESPONSE, b"OK")
        sender.join()
        out.close()
    wait_for(lambda: _topic_count(nsqd, away) == 2400, 20, what="every held-back message at its owner")
    with RawClient(nsqd.tcp) as c:
        c.send(encode_sub(away, "ch") + encode_rdy(2500))
        assert c.read_frame() == (FRAME_RESPONSE, b"OK")
        bodies = set()
        while len(bodies) < 2400:
            kind, data = c.read_frame()
            assert kind == FRAME_MESSAGE
            bodies.add(Message(data).body[:10])
    assert bodies == {b"%04d-%04d-" % (b, i) for b in range(24) for i in range(100)}


def _http_exchange(sock: socket.socket, request: bytes) -> tuple[bytes, bytes]:
    """Send one raw HTTP request on a keep-alive socket; → (status line, body)."""
    sock.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536) or b"!"
    head, _, rest = data.partition(b"\r\n\r\n")
    length = int(next(v for k, _, v in (h.partition(b": ") for h in head.split(b"\r\n")[1:])
                      if k.lower() == b"content-length"))
    while len(rest) < length:
        rest += sock.recv(65536)
    return head.split(b"\r\n")[0], rest


def test_http_publish_waits_for_room_in_a_full_inbound_ring_and_loses_nothing(node: NodeFactory,
                                                                            tmp_path: Path) -> None:
    """The owner is stopped, so the other shard takes the connection: /mpub batches of 4 MB
    fill the owner's 16 MiB inbound ring, the next one gets no answer while the ring is full,
    then OK once the owner drains; every message arrives."""
    nsqd = node("--shards=2", "--mem-queue-size=100000")
    topic = "http_bp"
    pid = get_json(nsqd, SHARD_STATS)["supervisor"]["shard_status"][
        _owner_after_create(nsqd, tmp_path, topic)]["pid"]
    bodies = [b"\n".join(b"%d-%04d-" % (b, i) + b"y" * 4000 for i in range(1000)) for b in range(5)]
    requests = [b"POST /mpub?topic=%s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                % (topic.encode(), len(body), body) for body in bodies]
    _stop(nsqd, owners(tmp_path)[topic], pid)
    try:
        with socket.create_connection(nsqd.http, timeout=scaled(10)) as sock:
            for request in requests[:4]:
                assert _http_exchange(sock, request) == (b"HTTP/1.1 200 OK", b"OK")
            sock.sendall(requests[4])
            sock.settimeout(1.0)
            with pytest.raises(TimeoutError):  # the ring is full: held back, not refused
                sock.recv(65536)
            os.kill(pid, signal.SIGCONT)
            sock.settimeout(scaled(10))
            data = b""
            while not data.endswith(b"\r\n\r\nOK"):
                data += sock.recv(65536) or b"!"
            assert data.startswith(b"HTTP/1.1 200 OK")
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_for(lambda: _topic_count(nsqd, topic) == 5000, 20, what="every held-back message at its owner")


def _topic_count(nsqd: Daemon, topic: str) -> int:
    stats = get_json(nsqd, f"/stats?format=json&topic={topic}")
    return int(stats["topics"][0]["message_count"]) if stats["topics"] else 0


def test_an_inbound_ring_survives_kill_9_of_the_whole_tree_and_a_clean_exit_removes_it(
        node: NodeFactory, tmp_path: Path) -> None:
    nsqd = node("--shards=2")
    with RawClient(nsqd.tcp) as p:
        p.send(encode_pub("ring_home", b"x"))
        assert p.read_frame() == (FRAME_RESPONSE, b"OK")
        home = owners(tmp_path)["ring_home"]
        away = next(f"ring_away{i}" for i in range(50) if _owner_after_create(nsqd, tmp_path, f"ring_away{i}") != home)
        pid = get_json(nsqd, SHARD_STATS)["supervisor"]["shard_status"][1 - home]["pid"]
        os.kill(pid, signal.SIGSTOP)  # the owner never drains: the OKed batch is only in shm
        p.send(encode_mpub(away, [b"kept-%d" % i for i in range(50)]))
        assert p.read_frame() == (FRAME_RESPONSE, b"OK")
    nsqd.kill()  # SIGKILL to the whole process group
    assert list_segments(str(tmp_path / "data"))  # the rings outlived every process
    again = node("--shards=2")
    wait_for(lambda: _topic_count(again, away) == 50, 20, what="the ring drained by the restarted owner")
    assert again.stop() == 0
    # empty rings are removed on a clean exit; the queues' segments stay for the next start
    assert [n for n in list_segments(str(tmp_path / "data")) if "-inbound-" in n] == []


def _stop_away_owner(nsqd: Daemon, tmp_path: Path, p: RawClient, prefix: str) -> tuple[str, int]:
    """With ``p`` living on the owner of ``<prefix>_home``: a topic owned by the other shard,
    and that shard's pid."""
    p.send(encode_pub(f"{prefix}_home", b"x"))
    assert p.read_frame() == (FRAME_RESPONSE, b"OK")
    home = owners(tmp_path)[f"{prefix}_home"]
    away = next(f"{prefix}_away{i}" for i in range(50)
                if _owner_after_create(nsqd, tmp_path, f"{prefix}_away{i}") != home)
    return away, get_json(nsqd, SHARD_STATS)["supervisor"]["shard_status"][owners(tmp_path)[away]]["pid"]


def test_a_cross_shard_dpub_is_due_counted_from_its_ok(node: NodeFactory, tmp_path: Path) -> None:
    """The owner drains the DPUB late (stopped past the due time): the delay still counts
    from the OK, not from the drain."""
    nsqd = node("--shards=2")
    delay = 2.0
    with RawClient(nsqd.tcp) as p, RawClient(nsqd.tcp) as c:
        away, pid = _stop_away_owner(nsqd, tmp_path, p, "due")
        c.subscribe(away, "ch", rdy=10)
        os.kill(pid, signal.SIGSTOP)
        try:
            p.send(encode_dpub(away, int(delay * 1000), b"later"))
            assert p.read_frame() == (FRAME_RESPONSE, b"OK")
            due = time.time() + delay
            wait_for(lambda: time.time() > due + 0.5, delay + 5, what="the due time, owner stopped")
        finally:
            os.kill(pid, signal.SIGCONT)
        resumed = time.time()
        m = c.read_message(timeout=scaled(10) + delay)
        arrived = time.time()
    assert m.body == b"later"
    assert arrived >= due - 0.05
    assert arrived < resumed + delay  # counted from the drain it could not arrive before this


@pytest.mark.parametrize("restart_shards", [1, 2])
def test_an_inbound_ring_left_by_a_run_with_another_shard_count_is_not_lost(
        node: NodeFactory, tmp_path: Path, restart_shards: int) -> None:
    """kill -9 while the owner had not drained its ring, restart with another --shards: the
    rescued ring's messages (ready and deferred, due time kept) reach the topic's new owner."""
    nsqd = node("--shards=3")
    with RawClient(nsqd.tcp) as p:
        away, pid = _stop_away_owner(nsqd, tmp_path, p, "resc")
        os.kill(pid, signal.SIGSTOP)  # the owner never drains: the OKed batches are only in shm
        p.send(encode_mpub(away, [b"kept-%d" % i for i in range(50)]))
        assert p.read_frame() == (FRAME_RESPONSE, b"OK")
        p.send(encode_dpub(away, 3000, b"later"))
        assert p.read_frame() == (FRAME_RESPONSE, b"OK")
        due = time.time() + 3.0
    nsqd.kill()
    again = node(f"--shards={restart_shards}")
    arrived: dict[bytes, float] = {}
    with RawClient(again.tcp) as c:
        c.subscribe(away, "ch", rdy=100)
        while len(arrived) < 51:
            m = c.read_message(timeout=scaled(10) + 3)
            assert m.body not in arrived
            arrived[m.body] = time.time()
            c.send(encode_fin(m.id))
    assert set(arrived) == {b"kept-%d" % i for i in range(50)} | {b"later"}
    assert arrived[b"later"] >= due - 0.05
    if restart_shards == 1:  # no pair of this run: drained to disk and removed
        assert [n for n in list_segments(str(tmp_path / "data")) if "-inbound-" in n] == []


def test_a_cross_shard_batch_the_owner_cannot_store_stays_in_the_ring_until_it_can(
        node: NodeFactory, tmp_path: Path) -> None:
    """The owner's disk refuses writes (RLIMIT_FSIZE): an acknowledged cross-shard batch is
    not dropped but retried, and stored once the disk takes it again."""
    nsqd = node("--shards=2", "--mem-queue-size=0")  # every message goes to the disk queue
    with RawClient(nsqd.tcp) as p:
        away, pid = _stop_away_owner(nsqd, tmp_path, p, "full")
        subprocess.run(["prlimit", f"--pid={pid}", "--fsize=1:unlimited"], check=True)
        try:
            p.send(encode_mpub(away, [b"held-%d" % i for i in range(10)]))
            assert p.read_frame() == (FRAME_RESPONSE, b"OK")
            wait_for(lambda: "failed to store 10 cross-shard message(s)" in nsqd.output, 20,
                     what="the owner's failed write")
            assert _topic_count(nsqd, away) == 0
        finally:
            subprocess.run(["prlimit", f"--pid={pid}", "--fsize=unlimited:unlimited"], check=True)
    wait_for(lambda: _topic_count(nsqd, away) == 10, 20, what="the batch stored on retry")
    nsqd.wait_for_log(rf"TOPIC\({away}\): cross-shard messages stored again", 10)
    assert nsqd.output.count("failed to store 10 cross-shard message(s)") == 1  # once per spell
    with RawClient(nsqd.tcp) as c:
        c.subscribe(away, "ch", rdy=20)
        assert sorted(c.read_message(timeout=scaled(10)).body for _ in range(10)) == sorted(
            b"held-%d" % i for i in range(10))


def _lowest_free_fd(pid: int) -> int:
    used = {int(fd) for fd in os.listdir(f"/proc/{pid}/fd")}
    return next(n for n in range(len(used) + 1) if n not in used)


def test_a_shard_that_cannot_be_restarted_for_lack_of_descriptors_is_retried(node: NodeFactory) -> None:
    nsqd = node("--shards=2")
    pid = get_json(nsqd, SHARD_STATS)["supervisor"]["shard_status"][1]["pid"]
    soft, hard = resource.prlimit(nsqd.pid, resource.RLIMIT_NOFILE)
    # the supervisor can open no new descriptor (its soft limit only: root may lack CAP_SYS_RESOURCE):
    # the limit follows its lowest free descriptor until that stays put (the connection of the
    # request above may still be closing there, freeing a lower one)
    readings: list[int] = []

    def no_descriptor_free() -> bool:
        readings.append(_lowest_free_fd(nsqd.pid))
        resource.prlimit(nsqd.pid, resource.RLIMIT_NOFILE, (readings[-1], hard))
        return len(readings) >= 10 and len(set(readings[-10:])) == 1
    wait_for(no_descriptor_free, 10, interval=0.02, what="the supervisor's descriptors to settle")
    try:
        os.kill(pid, signal.SIGKILL)  # its restart needs a control socketpair
        nsqd.wait_for_log(r"shard 1: cannot start - .*Too many open files; retrying with back-off", 10)
        nsqd.wait_for_log(r"shard 1: restarting in", 10)
        assert nsqd.running
    finally:
        resource.prlimit(nsqd.pid, resource.RLIMIT_NOFILE, (soft, hard))
    nsqd.wait_for_log(r"shard 1: started again after failed attempts", 20)
    wait_for(lambda: get_json(nsqd, SHARD_STATS)["supervisor"]["shard_status"][1]["ready"], 20,
             what="the restarted shard")
    assert nsqd.output.count("shard 1: cannot start") == 1  # once per failing spell
    assert get_json(nsqd, SHARD_STATS)["supervisor"]["shard_restarts"] == 1
