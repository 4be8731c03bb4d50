"""A shard's state moved to its replacement, without processes: a queue's bookkeeping adopted
over the same log (``MessageQueue.export`` → ``adopt``) and its in-flight messages held in flight
again (``Channel.deliveries`` → ``hold_again``), the ``Handover`` part's encoding, and the control
channel holding its messages back."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

from pynsqd.node.config import NsqdOptions
from pynsqd.node.control import ControlChannel, Received, channel_pair
from pynsqd.node.identify import Settings
from pynsqd.node.messages import ConnectionState, Done, Ready, StatsRequest
from pynsqd.shard.backend import DropBackend
from pynsqd.shard.channel import Channel
from pynsqd.shard.node import make_broker
from pynsqd.shard.protocol import ClientV2
from pynsqd.shard.queue import MessageQueue
from pynsqd.shard.transfer import MovedClient, Part, Restorer, capture
from pynsqd.shard.unit import Unit
from pynsqd.shm.log import IN_FLIGHT, MessageLog
from pynsqd.shm.ring import buffer_size
from pynsqd.wire.message import HEADER
from tests.unit.test_channel_inflight import TIMEOUT, Consumer


def test_messages_in_flight_are_put_back_in_flight_over_the_same_log_with_their_deadlines() -> None:
    """What one process held in flight, the next holds in flight: same consumers, same
    deadlines, nothing made ready again (so nothing is redelivered), and what was ready
    stays ready; a TOUCHed message keeps its own deadline."""
    buf = bytearray(buffer_size(1 << 20))
    old = Channel("t", "c", MessageQueue(MessageLog(buf, init=True), 10_000, DropBackend()), lambda _: None)
    old.put_many([HEADER.pack(i, 0, b"%016d" % i) + b"body" for i in range(10)])
    a, b = Consumer(rdy=3), Consumer(rdy=2)
    old.add_consumer(a)
    old.add_consumer(b)
    old.pump(0)
    held_a, held_b = a.received_ids(), b.received_ids()
    touched = sorted(held_a)[0]
    old.touch(a, touched, 5 * TIMEOUT, 100 * TIMEOUT)
    moved = old.deliveries()
    assert sorted(len(ids) for _, _, _, ids, _ in moved) == [1, 2, 2]  # a's delivery, its TOUCH, b's

    new = Channel("t", "c", MessageQueue(MessageLog(buf, init=False), 10_000, DropBackend(), recovering=True),
                  lambda _: None)
    new.queue.adopt(old.queue.export())  # not walked: a walk would make every one ready again
    assert new.queue.ready == 5 and new.queue.live == 10 and not new.queue.recovering
    a2, b2 = Consumer(rdy=3), Consumer(rdy=2)
    clients = {id(a): a2, id(b): b2}
    held = sum(new.hold_again(clients[id(c)], ids, positions, delivered, deadline)
               for c, delivered, deadline, ids, positions in moved)
    assert held == 5 and new.queue.ready == 5 and a2.in_flight_count == 3 and b2.in_flight_count == 2
    assert {i for i, d in new.in_flight.items() if d.client is a2} == held_a
    assert {i for i, d in new.in_flight.items() if d.client is b2} == held_b
    assert all(new.queue.log.states[new.in_flight_pos[i]] == IN_FLIGHT for i in held_a | held_b)
    new.consumers += [a2, b2]
    new.pump(0)
    assert a2.received() == [] and b2.received() == []  # full: nothing more, nothing again
    new.process_timers(TIMEOUT + 20_000_000)  # the original deadline passed: all but the TOUCHed one
    assert sorted(new.in_flight) == [touched] and new.timeout_count == 4
    assert new.finish_many(a2, [touched]) == [] and a2.in_flight_count == 0 and b2.in_flight_count == 0
    assert new.queue.ready == 9 and new.queue.live == 9  # 5 never delivered, 4 timed out, 1 finished


def test_a_record_no_longer_as_it_was_is_not_put_back_in_flight() -> None:
    buf = bytearray(buffer_size(1 << 20))
    old = Channel("t", "c", MessageQueue(MessageLog(buf, init=True), 10_000, DropBackend()), lambda _: None)
    old.put_many([HEADER.pack(i, 0, b"%016d" % i) + b"body" for i in range(2)])
    a = Consumer(rdy=2)
    old.add_consumer(a)
    old.pump(0)
    (_, delivered, deadline, ids, positions), = old.deliveries()
    old.requeue(a, ids[0], 0, 0)  # ready again, after its delivery was noted
    new = Channel("t", "c", MessageQueue(MessageLog(buf, init=False), 10_000, DropBackend()), lambda _: None)
    new.queue.adopt(old.queue.export())
    a2 = Consumer(rdy=2)
    wrong = [b"x" * 16, ids[1]]  # an id that is not the record's
    assert new.hold_again(a2, wrong, positions, delivered, deadline) == 1 and a2.in_flight_count == 1
    assert new.hold_again(a2, ids[:1], positions[:1], delivered, deadline) == 0  # not in flight any more
    assert new.hold_again(a2, ids[1:], [1 << 40], delivered, deadline) == 0  # off the log
    new.consumers.append(a2)
    new.pump(0)
    assert a2.received_ids() == {ids[0]}  # the requeued one, and only it


def test_what_a_queue_holds_of_a_cross_shard_batch_is_handed_over_too() -> None:
    """A batch that one queue of its topic took and another refused stays in the ring; the
    replacement stores it again (``shard/unit.py``): the queue that took it must know."""
    buf = bytearray(buffer_size(1 << 20))
    old = MessageQueue(MessageLog(buf, init=True), 10_000, DropBackend())
    batch = [HEADER.pack(i, 0, b"%016d" % i) + b"body" for i in range(3)]
    unit = Unit(0, 12345)
    old.put_many(batch, unit)
    new = MessageQueue(MessageLog(buf, init=False), 10_000, DropBackend(), recovering=True)
    new.adopt(old.export())
    new.put_many(batch, unit)
    assert new.ready == 3 and new.tally.skip(unit, 3) == 3


def test_a_handover_part_round_trips_with_binary_output_and_unread_bytes() -> None:
    settings = Settings(client_id="ü", hostname="h", msg_timeout=7_000_000_000)
    clients = [MovedClient(ConnectionState(magic=True, remote="1.2.3.4:5", settings=settings, pub_counts={"t": 3}),
                           {"state": 3, "topic": "t", "channel": "c", "rdy": 9}, bytes(range(256)), b"FIN 0123\n"),
               MovedClient(ConnectionState(magic=False), {"state": 0}, b"", b" V")]
    part = Part([{"name": "t", "channels": []}], clients)
    again = Part.decode(part.encode())
    assert again == part
    assert Part.decode(Part(None, []).encode()) == Part(None, [])


def test_a_held_control_channel_sends_replies_only_then_everything_in_order() -> None:
    async def run() -> None:
        here, there = channel_pair()
        got: list[object] = []
        far = ControlChannel(there, lambda chan, r: got.append(r.message), "far")
        near = ControlChannel(here, lambda chan, r: None, "near")
        loop = asyncio.get_running_loop()
        far.start(loop)
        near.start(loop)
        near.hold()
        near.send(Ready("1.0"))
        a, b = socket.socketpair()
        near.send(StatsRequest(topic="x"), [a.fileno()])
        a.close()
        near.reply(Received(StatsRequest(), [], 7), Done())  # a reply goes at once
        for _ in range(100):
            await asyncio.sleep(0.01)
        assert got == []  # the reply answered no call of ``far``: dropped there, nothing else came
        near.release()
        for _ in range(100):
            if len(got) == 2:
                break
            await asyncio.sleep(0.01)
        assert got == [Ready("1.0"), StatsRequest(topic="x")]
        near.close()
        far.close()
        b.close()
    asyncio.run(run())


def test_connections_whose_descriptors_were_lost_on_the_way_are_given_up_and_the_rest_keep_their_own_state(
        tmp_path: Path) -> None:
    """A process out of descriptors receives the first of a message's descriptors and loses
    the rest: each connection that arrived is served with its own state, and each that did
    not is given up (as a consumer that leaves), never paired with another's socket."""
    opts = NsqdOptions(data_path=str(tmp_path), mem_queue_size=1000)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        old = make_broker(opts)
        peers = []
        for i in range(3):
            here, there = socket.socketpair()
            state = ConnectionState(magic=True, remote=f"10.0.0.{i}:1")
            await loop.connect_accepted_socket(lambda s=state: ClientV2(old, opts, None, (s, b"")), here)
            peers.append(there)
        await asyncio.sleep(0)
        captured = capture(old)
        (part, fds), = captured.parts
        assert captured.moved == 3 and len(fds) == 3
        for fd in fds[1:]:  # what the kernel drops when the receiver runs out of descriptors
            os.close(fd)
        new = make_broker(opts)
        restorer = Restorer(new, lambda state, unread: ClientV2(new, opts, None, (state, unread)))
        restorer.add(part, [fds[0]])
        restorer.restore_queues()
        assert await restorer.connect() == 2
        (served,) = new.clients
        first = part.clients[0].state.remote  # the connection whose descriptor arrived
        assert served.remote_address == first
        for peer in peers:
            peer.setblocking(False)
        arrived = peers.pop(int(first.split(".")[3].split(":")[0]))
        await loop.sock_sendall(arrived, b"BOGUS\n")
        assert b"E_INVALID" in await asyncio.wait_for(loop.sock_recv(arrived, 1024), 5)
        for peer in peers:  # closed, not served as another connection
            assert await asyncio.wait_for(loop.sock_recv(peer, 1024), 5) == b""
        peers.append(arrived)
        for peer in peers:
            peer.close()
        for client in list(new.clients):
            assert client.transport is not None
            client.transport.close()
        await asyncio.sleep(0)

    asyncio.run(run())
