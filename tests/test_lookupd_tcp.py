"""The real nsqlookupd daemon over TCP: NSQ's nsqlookupd_test.go and lookup_protocol_v1_test.go,
the protocol's error paths, and the command line (bad flag, --version, SIGTERM)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from pynsqd import NSQ_VERSION
from pynsqd.lookupd.config import parse_args
from pynsqd.options import SECOND
from pynsqd.wire.lookup import PING, IdentifyInfo, encode_identify, encode_register, encode_unregister
from testbed.harness import Daemon, wait_for
from tests.support.lookupd_helpers import PRODUCER, Producer, http, lookupd, ms, shut_write, stop

pytestmark = pytest.mark.fast


@pytest.fixture(scope="module")
def shared() -> Iterator[Daemon]:
    """One daemon for the tests that leave nothing behind that others would see."""
    with lookupd() as daemon:
        yield daemon


def producers(daemon: Daemon, topic: str) -> list[dict[str, object]]:
    with http(daemon) as client:
        response = client.get("/lookup", params={"topic": topic})
    assert response.status_code == 200, response.text
    result: list[dict[str, object]] = response.json()["producers"]
    return result


def test_basic_lookupd() -> None:
    with lookupd() as daemon, http(daemon) as client:
        assert client.get("/topics").json() == {"topics": []}
        assert client.get("/nodes").json() == {"producers": []}
        p = Producer(daemon)
        reply = p.identify()
        assert p.command(encode_register("connectmsg", "channel1")) == b"OK"

        nodes = client.get("/nodes").json()["producers"]
        assert len(nodes) == 1
        assert client.get("/topics").json() == {"topics": ["connectmsg"]}
        lookup = client.get("/lookup?topic=connectmsg").json()
        assert lookup["channels"] == ["channel1"]
        (producer,) = lookup["producers"]
        host, port = p.sock.getsockname()[:2]
        local = f"{host}:{port}"
        assert producer == {"remote_address": local, "hostname": "ip.address",
                            "broadcast_address": "ip.address", "tcp_port": 5000,
                            "http_port": 5555, "version": "fake-version"}
        assert nodes[0] == {**producer, "tombstones": [False], "topics": ["connectmsg"]}

        # The IDENTIFY reply: the lookupd's own info, keys in alphabetical order.
        assert list(reply) == ["broadcast_address", "hostname", "http_port", "tcp_port", "version"]
        assert reply == {"broadcast_address": "127.0.0.1", "hostname": socket.gethostname(),
                         "http_port": daemon.http[1], "tcp_port": daemon.tcp[1],
                         "version": NSQ_VERSION}

        listening = [line for line in daemon.output.splitlines() if "TCP: listening on" in line]
        assert listening[0].startswith("[nsqlookupd] ")
        assert listening[0].endswith(f" INFO: TCP: listening on 127.0.0.1:{daemon.tcp[1]}")

        p.close()  # producers go with the connection; topic and channel stay
        wait_for(lambda: client.get("/lookup?topic=connectmsg").json()["producers"] == [],
                 what="the producer to be removed")
        assert client.get("/lookup?topic=connectmsg").json()["channels"] == ["channel1"]
        assert client.get("/nodes").json() == {"producers": []}
        assert client.get("/debug").json() == {}


def test_channel_unregister(shared: Daemon) -> None:
    with Producer(shared) as p, http(shared) as client:
        p.identify()
        assert p.command(encode_register("unreg_topic", "ch1")) == b"OK"
        assert len(producers(shared, "unreg_topic")) == 1
        assert p.command(encode_unregister("unreg_topic", "ch1")) == b"OK"
        lookup = client.get("/lookup?topic=unreg_topic").json()
        assert lookup["channels"] == ["ch1"]  # the channel registration stays
        assert len(lookup["producers"]) == 1  # the topic producer stays
        debug = client.get("/debug").json()
        assert "channel:unreg_topic:ch1" not in debug  # no producers → not listed
        assert [e["tcp_port"] for e in debug["topic:unreg_topic:"]] == [5000]


def test_ping_refreshes_last_update(shared: Daemon) -> None:
    with Producer(shared) as p, http(shared) as client:
        p.identify(IdentifyInfo("pinger", 1, 2, "v"))
        assert p.command(encode_register("ping_topic")) == b"OK"

        def last_update() -> int:
            (entry,) = client.get("/debug").json()["topic:ping_topic:"]
            value: int = entry["last_update"]
            return value

        first = last_update()
        assert p.command(PING) == b"OK"
        assert last_update() > first


def test_tombstone_recover() -> None:
    with lookupd(f"--tombstone-lifetime={ms(1.0)}") as daemon, http(daemon) as client:
        p = Producer(daemon)
        p.identify()
        assert p.command(encode_register("topic_a")) == b"OK"
        assert p.command(encode_register("topic_b")) == b"OK"
        r = client.post("/topic/tombstone?topic=topic_a&node=ip.address:5555")
        assert (r.status_code, r.content) == (200, b"")
        assert producers(daemon, "topic_a") == []
        assert len(producers(daemon, "topic_b")) == 1
        wait_for(lambda: len(producers(daemon, "topic_a")) == 1, timeout=10,
                 what="the tombstone to expire")
        p.close()


def test_tombstone_unregister() -> None:
    with lookupd(f"--tombstone-lifetime={ms(0.5)}") as daemon, http(daemon) as client:
        p = Producer(daemon)
        p.identify()
        for topic in ("tomb_unreg", "witness"):
            assert p.command(encode_register(topic)) == b"OK"
        for topic in ("tomb_unreg", "witness"):  # the witness's tombstone ends last
            r = client.post("/topic/tombstone", params={"topic": topic, "node": "ip.address:5555"})
            assert r.status_code == 200
        assert producers(daemon, "tomb_unreg") == []
        assert p.command(encode_unregister("tomb_unreg")) == b"OK"
        wait_for(lambda: len(producers(daemon, "witness")) == 1, timeout=10,
                 what="the tombstone lifetime to pass")
        assert producers(daemon, "tomb_unreg") == []  # unregistered: it does not come back
        p.close()


def test_inactive_nodes() -> None:
    with lookupd(f"--inactive-producer-timeout={ms(1.0)}") as daemon, http(daemon) as client:
        p = Producer(daemon)
        p.identify()
        assert p.command(encode_register("inactive_topic", "ch")) == b"OK"
        (node,) = client.get("/nodes").json()["producers"]
        assert node["topics"] == ["inactive_topic"] and node["tombstones"] == [False]
        wait_for(lambda: client.get("/nodes").json()["producers"] == [], timeout=10,
                 what="the producer to become inactive")
        assert producers(daemon, "inactive_topic") == []
        assert p.command(PING) == b"OK"  # a PING brings it back
        assert len(client.get("/nodes").json()["producers"]) == 1
        p.close()


def test_tombstoned_nodes(shared: Daemon) -> None:
    with Producer(shared) as p, http(shared) as client:
        p.identify(IdentifyInfo("tomb.node", 6000, 6001, "v"))
        assert p.command(encode_register("tombstoned_nodes", "ch")) == b"OK"

        def mine() -> dict[str, object]:
            nodes = client.get("/nodes").json()["producers"]
            (node,) = [n for n in nodes if n["broadcast_address"] == "tomb.node"]
            return dict(node)

        assert mine()["topics"] == ["tombstoned_nodes"] and mine()["tombstones"] == [False]
        assert client.post("/topic/tombstone",
                           params={"topic": "tombstoned_nodes", "node": "tomb.node:6001"}).status_code == 200
        assert mine()["tombstones"] == [True]  # still listed in /nodes, marked tombstoned
        assert producers(shared, "tombstoned_nodes") == []


# --- protocol errors over a real socket: reply, then close ---------------------------------

@pytest.mark.parametrize(("magic", "identify", "send", "error"), [
    (b"  V2", False, b"", b"E_BAD_PROTOCOL"),
    (b"GET / HTTP/1.1\r\n\r\n", False, b"", b"E_BAD_PROTOCOL"),
    (None, False, b"INVALID_COMMAND\n", b"E_INVALID invalid command INVALID_COMMAND"),
    (None, False, b"REGISTER t\n", b"E_INVALID client must IDENTIFY"),
    (None, False, b"IDENTIFY\n\x00\x00\x00\x02{}", b"E_BAD_BODY IDENTIFY missing fields"),
    (None, False, b"IDENTIFY\n\x00\x00\x00\x03{x}", b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
    (None, True, b"REGISTER b@d\n", b"E_BAD_TOPIC REGISTER topic name 'b@d' is not valid"),
    (None, True, b"UNREGISTER t b@d\n", b"E_BAD_CHANNEL UNREGISTER channel name 'b@d' is not valid"),
    (None, True, b"REGISTER\n", b"E_INVALID REGISTER insufficient number of params"),
    (None, True, b"IDENTIFY\n", b"E_INVALID cannot IDENTIFY again"),
])
def test_fatal_errors(shared: Daemon, magic: bytes | None, identify: bool, send: bytes,
                      error: bytes) -> None:
    with Producer(shared, **({"magic": magic} if magic else {})) as p:
        if identify:
            p.identify()
        p.send(send)
        assert p.read() == error
        assert wait_for(p.is_closed_by_peer, what="lookupd to close")


def test_half_close_inside_identify_gets_an_error(shared: Daemon) -> None:
    with Producer(shared) as p:
        p.send(b"IDENTIFY\n\x00\x00\x00\x10{")
        shut_write(p)
        assert p.read() == b"E_BAD_BODY IDENTIFY failed to read body"


def test_pipelined_commands_get_replies_in_order(shared: Daemon) -> None:
    with Producer(shared) as p:
        p.send(encode_identify(PRODUCER) + encode_register("pipe", "c") + PING * 50
               + encode_unregister("pipe"))
        orjson.loads(p.read())
        assert [p.read() for _ in range(52)] == [b"OK"] * 52


# --- the command line ---------------------------------------------------------------------

def run_lookupd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pynsqd.lookupd", *args], capture_output=True,
                          text=True, timeout=60)


def test_bad_flag_is_one_line_and_exit_1() -> None:
    done = run_lookupd("--no-such-flag")
    assert done.returncode == 1
    assert done.stderr.splitlines() == ["nsqlookupd: error: unrecognized arguments: --no-such-flag"]
    bad = run_lookupd("--tcp-address=nonsense")
    assert bad.returncode == 1 and len(bad.stderr.splitlines()) == 1
    assert "--tcp-address" in bad.stderr
    assert run_lookupd("--inactive-producer-timeout=0s").returncode == 1


def test_config_file_and_flag_precedence(tmp_path: Path) -> None:
    config = tmp_path / "nsqlookupd.cfg"
    config.write_text('tcp_address = "127.0.0.1:4999"\ninactive_producer_timeout = "1m"\n'
                      'tombstone_lifetime = "10s"\nlog_level = "WARN"\n')
    opts, version = parse_args([f"--config={config}", "--tombstone-lifetime=2s"])
    assert not version
    assert opts.tcp_address == "127.0.0.1:4999" and opts.http_address == "0.0.0.0:4161"
    assert opts.inactive_producer_timeout == 60 * SECOND
    assert opts.tombstone_lifetime == 2 * SECOND  # the flag beats the file
    assert opts.log_level == "warn" and opts.log_prefix == "[nsqlookupd] "
    assert opts.broadcast_address == socket.gethostname()


def test_version() -> None:
    done = run_lookupd("--version")
    assert done.returncode == 0 and done.stdout.startswith(f"nsqlookupd v{NSQ_VERSION} ")


def test_port_in_use_exits_1(shared: Daemon) -> None:
    done = run_lookupd(f"--tcp-address=127.0.0.1:{shared.tcp[1]}", "--http-address=127.0.0.1:0")
    assert done.returncode == 1
    assert f"listen (127.0.0.1:{shared.tcp[1]}) failed" in done.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_exits_cleanly(sig: int) -> None:
    daemon = Daemon("pynsqd.lookupd", ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"])
    daemon.start()
    try:
        p = Producer(daemon)  # an open connection must not hold up the exit
        p.identify()
        daemon.signal(sig)
        assert daemon.wait() == 0
        assert p.is_closed_by_peer()
        p.close()
    finally:
        stop(daemon)
