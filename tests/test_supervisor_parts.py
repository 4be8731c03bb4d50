"""The supervisor's parts without processes: placement, control channel, greeting, stats merge."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from pynsqd.node import metadata
from pynsqd.node.aggregate import merge_stats
from pynsqd.node.boot import BootConfig
from pynsqd.node.config import NsqdOptions
from pynsqd.node.control import DATAGRAM, ControlChannel, Received, channel_pair
from pynsqd.node.crossrecord import decode_batch, encode_batch
from pynsqd.node.datapath import make_backend
from pynsqd.node.identify import Settings
from pynsqd.node.messages import (
    Adopt,
    Changed,
    ConnectionState,
    ControlMessage,
    CreateChannels,
    Done,
    Exit,
    Failed,
    HandOff,
    Health,
    HealthRequest,
    HTTPResponse,
    Proxy,
    Quiesce,
    Ready,
    RunHTTP,
    ServeHTTP,
    SetConfig,
    ShardDocuments,
    Snapshot,
    Standby,
    StatsDocument,
    StatsRequest,
    Updated,
    decode_message,
)
from pynsqd.node.metadata import ChannelRecord, TopicRecord
from pynsqd.node.placement import Placement
from pynsqd.node.rings import ring_name
from pynsqd.shm import sidecar, store
from pynsqd.shm.cpu import refusal
from pynsqd.shm.ring import HEADER_SIZE as RING_HEADER_SIZE
from pynsqd.shm.ring import ByteRing
from pynsqd.shm.segment import Segment, list_segments, segment_name, unlink_segment
from pynsqd.shm.sizing import LogSizing
from pynsqd.supervisor import leftover_rings
from pynsqd.supervisor.handoff import Greeting
from pynsqd.wire import MAGIC_V2
from pynsqd.wire.commands import CommandParser, encode_command, encode_identify, encode_mpub, encode_pub
from pynsqd.wire.message import HEADER
from tests.conftest import run_async

pytestmark = pytest.mark.fast


def test_placement_spreads_topics_evenly_and_is_stable(tmp_path: Path) -> None:
    a = Placement(str(tmp_path), 2)
    owners = {f"topic{i}": a.owner(f"topic{i}") for i in range(32)}
    assert sorted(owners.values()).count(0) == 16
    b = Placement(str(tmp_path), 2)  # another process, or the next run
    assert {t: b.owner(t) for t in owners} == owners
    a.close()
    b.close()
    c = Placement(str(tmp_path), 2)
    c.rebalance_at_start()
    assert c.owners == owners
    c.close()


def test_placement_learns_what_other_processes_assigned(tmp_path: Path) -> None:
    a, b = Placement(str(tmp_path), 4), Placement(str(tmp_path), 4)
    first = [a.owner(f"t{i}") for i in range(6)]
    assert [b.owner(f"t{i}") for i in range(6)] == first
    assert b.owner("new") == a.owner("new")
    assert sorted(a.loads) == [1, 2, 2, 2]
    a.close()
    b.close()


def test_placement_for_another_shard_count_is_rebalanced(tmp_path: Path) -> None:
    four = Placement(str(tmp_path), 4)
    for i in range(8):
        four.owner(f"t{i}")
    four.close()
    two = Placement(str(tmp_path), 2)
    two.rebalance_at_start()
    assert sorted(two.owners.values()) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert len(two.owners) == 8
    two.close()


def test_control_channel_carries_requests_big_payloads_and_fds() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        got: list[tuple[ControlMessage, list[int]]] = []
        second = asyncio.Event()

        def server(chan: ControlChannel, received: Received) -> None:
            msg = received.message
            got.append((msg, received.take_fds() if isinstance(msg, Adopt) else list(received.fds)))
            if len(got) == 2:
                second.set()
            if isinstance(msg, RunHTTP):
                chan.reply(received, HTTPResponse(200, [["n", str(len(msg.body))]], msg.body[::-1]))

        a, b = channel_pair()
        left = ControlChannel(a, lambda *args: None, "left")
        right = ControlChannel(b, server, "right")
        left.start(loop)
        right.start(loop)
        big = os.urandom(5 * DATAGRAM + 17)
        reply = await left.call(RunHTTP("GET", "/echo", body=big))
        assert reply == HTTPResponse(200, [["n", str(len(big))]], big[::-1])
        r, w = os.pipe()
        left.send(Adopt(ConnectionState(remote="x"), b"x"), [w])
        os.close(w)  # the channel sent its own duplicate
        await asyncio.wait_for(second.wait(), 5)
        msg, fds = got[1]
        assert msg == Adopt(ConnectionState(remote="x"), b"x") and len(fds) == 1
        os.write(fds[0], b"through")
        os.close(fds[0])
        assert os.read(r, 16) == b"through"
        os.close(r)
        closed = loop.create_future()
        left.on_close = lambda chan: closed.set_result(True)
        right.close()
        await asyncio.wait_for(closed, 5)
        with pytest.raises(ConnectionError):
            left.send(Exit())

    run_async(main())


def test_control_channel_closes_descriptors_a_handler_does_not_take() -> None:
    """A message's descriptors are the handler's only if it takes them: a message that does
    not expect any (or a handler that fails) leaks nothing."""
    async def main() -> None:
        loop = asyncio.get_running_loop()
        seen = asyncio.Event()
        kept: list[int] = []

        def server(chan: ControlChannel, received: Received) -> None:
            kept.extend(received.fds)
            seen.set()

        a, b = channel_pair()
        left = ControlChannel(a, lambda *args: None, "left")
        right = ControlChannel(b, server, "right")
        left.start(loop)
        right.start(loop)
        r, w = os.pipe()
        left.send(Exit(), [w])
        os.close(w)
        await asyncio.wait_for(seen.wait(), 5)
        assert kept and os.read(r, 1) == b""  # every write end is closed: end of file
        os.close(r)
        left.close()
        right.close()

    run_async(main())


@pytest.mark.parametrize("message", [
    Adopt(ConnectionState(True, "1.2.3.4:5", Settings("c", "h", heartbeat_interval=5)), b"SUB t c\n"),
    ServeHTTP(True),
    RunHTTP("POST", "/topic/create", "topic=t", "https", b"body"), CreateChannels("t", ["a", "b"]),
    Quiesce(2.5), Exit(), Ready("1.0"), Standby(), Changed("created", "t", None), Changed("deleted", "t", "c"),
    Snapshot([TopicRecord("t", True, [ChannelRecord("c", False)])]),
    Updated([TopicRecord("t", False, [ChannelRecord("c", True)])], ["gone", "old"]),
    HandOff(1, ConnectionState(True, "h:1", None, {"t": 2}, {"version": "TLSv1.3"}, "snappy", {"secret": "s"}),
            b"PUB t\n"),
    Proxy(2, "GET", "/topic/pause", "topic=t"),
    StatsRequest("t", "c", False, True, True), StatsRequest(skip=1), HealthRequest(), SetConfig("log_level", b"debug"),
    ShardDocuments(b'{"docs":[[1,{}]],"supervisor":null,"start_time":5}'),
    StatsDocument(b'{"topics":[]}'), Health("NOK - disk"), HTTPResponse(404, [["a", "b"]], b"x"),
    Failed("down"), Done(),
])
def test_every_control_message_survives_the_wire(message: ControlMessage) -> None:
    header, payload = message.encode()
    assert decode_message(orjson.loads(orjson.dumps(header)), payload) == message


def test_an_unknown_or_malformed_control_message_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown"):
        decode_message({"op": "launch"}, b"")
    with pytest.raises(ValueError, match="malformed"):
        decode_message({"op": "handoff", "state": {}}, b"")  # no shard


def test_boot_config_survives_the_environment() -> None:
    boot = BootConfig(index=1, shards=2, parent=7, opts=NsqdOptions(tcp_address="127.0.0.1:0"),
                      log_sizing=LogSizing(1 << 20, 1 << 24, False), start_time=5, start_ns=5_000_000_000,
                      tcp_port=4150, http_port=4151, https_port=-1, http=True, https=False,
                      control_fd=3, heartbeat_fd=4, wake_fds=[5, 6])
    assert BootConfig.decode(boot.encode()) == boot
    assert boot.inherited == [3, 4, 5, 6]


def _greeting(data: bytes) -> tuple[Greeting, list[tuple[str, Any]]]:
    g = Greeting(NsqdOptions(), ("10.0.0.1", 5555))
    g.buf = data
    steps = []
    while True:
        step = g.step()
        steps.append(step)
        if step[0] != "reply":
            return g, steps


def test_greeting_answers_identify_and_routes_on_sub() -> None:
    identify = encode_identify(orjson.dumps({"client_id": "c", "heartbeat_interval": 5000}))
    g, steps = _greeting(MAGIC_V2 + identify + b"NOP\nSUB orders ch\nRDY 5\n")
    assert steps[0][0] == "reply" and steps[-1] == ("route", "orders")
    assert g.buf == b"SUB orders ch\nRDY 5\n"
    state = g.state()
    assert state.magic and state.remote == "10.0.0.1:5555" and state.settings is not None
    assert state.settings.client_id == "c" and state.settings.heartbeat_interval == 5000 * 10**6


@pytest.mark.parametrize(("data", "decision"), [
    (MAGIC_V2[:2], ("need", None)),
    (b"  V1", ("any", None)),
    (MAGIC_V2 + b"IDENTIFY\n\x00\x00", ("need", None)),
    (MAGIC_V2 + encode_identify(b'{"snappy":true}'), ("any", None)),  # a shard negotiates
    (MAGIC_V2 + encode_identify(b'{"heartbeat_interval":1}'), ("any", None)),  # error: a shard says it
    (MAGIC_V2 + b"RDY 1\n", ("any", None)),
    (MAGIC_V2 + encode_pub("t", b"x"), ("route", "t")),
    (MAGIC_V2 + b"PUB bad$name\n", ("any", None)),
])
def test_greeting_decisions(data: bytes, decision: tuple[str, Any]) -> None:
    g, steps = _greeting(data)
    assert steps[-1] == decision
    if decision[0] == "any" and data.startswith(MAGIC_V2):
        assert g.buf == data[4:]  # a shard sees the whole undecided command


def test_unparsed_bytes_round_trip_through_a_new_parser() -> None:
    stream = b"SUB t c\nRDY 3\n" + encode_mpub("t", [b"a", b"bc"]) + encode_pub("t", b"xyz")
    cut = len(stream) - 2
    parser = CommandParser()
    events = parser.feed(stream[:cut])
    assert [e[0] for e in events] == [b"SUB", b"RDY", b"MPUB"]  # type: ignore[index]
    rest = b"".join(encode_command(*e) for e in events[1:]) + parser.unparsed()  # type: ignore[misc]
    again = CommandParser().feed(rest + stream[cut:])
    assert again == [*events[1:], (b"PUB", [b"PUB", b"t"], b"xyz")]


def test_cross_shard_batch_codec() -> None:
    messages = [HEADER.pack(1, 0, b"%016d" % i) + b"body" * i for i in range(2)]
    data = encode_batch("topic", messages, 4, 1234, sent_ns=99)
    topic, records, body_bytes, due, sent = decode_batch(data)
    assert (topic, list(records), body_bytes, due, sent) == ("topic", messages, 4, 1234, 99)
    assert decode_batch(encode_batch("t", [], 0, 0, sent_ns=5)) == ("t", [], 0, 0, 5)
    with pytest.raises(ValueError):
        decode_batch(data + b"x")


def _doc(topics: list[dict[str, Any]] | None, producers: list[Any] | None, health: str = "OK") -> dict[str, Any]:
    return {"version": "1.3.0", "health": health, "start_time": 100, "topics": topics,
            "memory": {"heap_objects": 1, "gc_total_runs": 2}, "producers": producers,
            "shard_counters": {"handoffs": 1, "cross_shard_sent": 5}}


def _topic(name: str, channels: list[dict[str, Any]], count: int) -> dict[str, Any]:
    return {"topic_name": name, "channels": channels, "depth": 1, "backend_depth": 0,
            "message_count": count, "message_bytes": count, "paused": False,
            "e2e_processing_latency": {"count": 0, "percentiles": None}}


def _channel(name: str, count: int) -> dict[str, Any]:
    keys = ("depth", "backend_depth", "in_flight_count", "deferred_count", "requeue_count",
            "timeout_count", "client_count")
    return {"channel_name": name, **dict.fromkeys(keys, 1), "message_count": count, "clients": [],
            "paused": False, "e2e_processing_latency": {"count": 0, "percentiles": None}}


def test_merge_stats_is_one_node_in_the_single_node_shape() -> None:
    a = _doc([_topic("b", [_channel("c", 2)], 2)], [{"remote_address": "x"}])
    b = _doc([_topic("a", [], 3), _topic("b", [_channel("c", 1), _channel("d", 4)], 1)], None, "NOK - disk")
    doc = merge_stats([a, b], {"shards": 2})
    assert list(doc) == ["version", "health", "start_time", "topics", "memory", "producers", "supervisor"]
    assert [t["topic_name"] for t in doc["topics"]] == ["a", "b"]
    merged = doc["topics"][1]
    assert merged["message_count"] == 3
    assert [(c["channel_name"], c["message_count"]) for c in merged["channels"]] == [("c", 3), ("d", 4)]
    assert doc["health"] == "NOK - disk" and doc["producers"] == [{"remote_address": "x"}]
    assert doc["memory"] == {"heap_objects": 2, "gc_total_runs": 4}
    assert doc["supervisor"] == {"shards": 2, "handoffs": 2, "cross_shard_sent": 10}
    # without the supervisor's figures (the default /stats) the shard counters go nowhere
    assert list(merge_stats([a, b])) == ["version", "health", "start_time", "topics", "memory", "producers"]


def test_merge_stats_of_a_topic_no_shard_has_is_nsqds_null_answer() -> None:
    """nsqd returns early for an unknown ``topic`` filter: topics and producers are null,
    though a shard has a producer; a topic one shard has keeps every shard's producers."""
    a = _doc(None, [{"remote_address": "x"}])
    b = _doc(None, None)
    doc = merge_stats([a, b], topic="nosuch")
    assert doc["topics"] is None and doc["producers"] is None
    c = _doc([_topic("t", [], 1)], None)
    doc = merge_stats([_doc(None, [{"remote_address": "x"}]), c], topic="t")
    assert [t["topic_name"] for t in doc["topics"]] == ["t"] and doc["producers"] == [{"remote_address": "x"}]



def test_a_leftover_ring_of_another_shard_count_goes_to_disk_and_a_look_alike_queue_is_kept(
        tmp_path: Path) -> None:
    """``leftover_rings.rescue`` (1 shard now, a ring 0→1 left): ready messages to the
    topic's disk queue, deferred ones to its journal, the topic into nsqd.dat, the ring
    unlinked; a queue whose name merely ends like a ring's is not touched."""
    data = str(tmp_path)
    opts = NsqdOptions(data_path=data)
    segment, log_, _ = store.open_log(data, "topic", "x-inbound-0-1", 1 << 16)
    ring_seg = Segment.open(ring_name(data, 0, 1), 1 << 16, create=True)
    try:
        ring = ByteRing(ring_seg.buf, init=True)
        msgs = [HEADER.pack(1, 0, b"%016d" % i) + b"body%d" % i for i in range(3)]
        assert ring.put(encode_batch("t", msgs[:2], 10, 0, sent_ns=1))
        assert ring.put(encode_batch("t", msgs[2:], 5, time.monotonic_ns() + 60 * 10**9, sent_ns=2))
        ring.close()
        topics: list[Any] = []
        assert leftover_rings.rescue(opts, 1, lambda topic: 0, topics) == set()
        names = list_segments(data)
        assert ring_name(data, 0, 1) not in names and segment_name(data, "topic", "x-inbound-0-1") in names
        assert topics == [("t", False, [])] and metadata.load(data)[0][0] == "t"
        queue = make_backend(opts, "t")
        assert queue.read_many(10) == msgs[:2]
        queue.close()
        journal = sidecar.read_journal(sidecar.journal_of(sidecar.sidecar_path(data, "t")), logging.getLogger())
        assert [m for _, m in journal] == msgs[2:] and journal[0][0] > time.time_ns() + 50 * 10**9
    finally:
        log_.close()
        for seg in (segment, ring_seg):
            seg.close()
        for name in list_segments(data):
            unlink_segment(name)


def test_a_corrupt_leftover_ring_is_logged_and_removed_not_a_failed_start(tmp_path: Path) -> None:
    data = str(tmp_path)
    seg = Segment.open(ring_name(data, 2, 0), 1 << 16, create=True)
    try:
        ring = ByteRing(seg.buf, init=True)
        assert ring.put(encode_batch("t", [b"x" * 40], 1, 0, sent_ns=1))
        ring.close()
        seg.buf[RING_HEADER_SIZE:RING_HEADER_SIZE + 8] = b"\xff" * 8  # the record's length frame
        topics: list[Any] = []
        assert leftover_rings.rescue(NsqdOptions(data_path=data), 2, lambda topic: 0, topics) == set()
        assert topics == [] and ring_name(data, 2, 0) not in list_segments(data)
    finally:
        seg.close()
        for name in list_segments(data):
            unlink_segment(name)


@pytest.mark.parametrize(("system", "machine", "refused"), [
    ("Linux", "x86_64", None), ("Linux", "AMD64", None),
    ("Linux", "aarch64", "x86-64 only (this CPU is aarch64)"), ("Linux", "armv7l", "x86-64 only"),
    ("Linux", "ppc64le", "x86-64 only"), ("Linux", "riscv64", "x86-64 only"), ("Linux", "i686", "x86-64 only"),
    ("Darwin", "x86_64", "Linux only (this is Darwin)"), ("Darwin", "arm64", "Linux only"),
    ("Windows", "AMD64", "Linux only"), ("FreeBSD", "amd64", "Linux only"),
])
def test_nsqd_runs_only_where_the_rings_store_order_holds(system: str, machine: str, refused: str | None) -> None:
    """The rule: Linux (/dev/shm, SOCK_SEQPACKET, eventfd) on x86-64 (its TSO orders the ring's
    index store after the record bytes; other CPUs would need barriers)."""
    why = refusal(system, machine)
    assert why is None if refused is None else refused in str(why)


def test_nsqd_on_another_cpu_exits_at_once_with_one_line(tmp_path: Path) -> None:
    code = ("import platform, sys; platform.machine = lambda: 'aarch64'; "
            "from pynsqd.supervisor.cli import main; main()")
    proc = subprocess.run([sys.executable, "-c", code, f"--data-path={tmp_path}", "--tcp-address=127.0.0.1:0",
                           "--http-address=127.0.0.1:0"], capture_output=True, timeout=60)
    assert (proc.returncode, proc.stdout) == (1, b"")
    assert proc.stderr.decode() == ("nsqd: error: pynsqd's nsqd runs on x86-64 only (this CPU is aarch64): its "
                                    "shared-memory rings rely on x86-64 store ordering\n")
    assert list(tmp_path.iterdir()) == [] and list_segments(str(tmp_path)) == []  # nothing was started
