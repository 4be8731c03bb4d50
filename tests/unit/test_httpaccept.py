"""The supervisor's HTTP acceptor over real sockets: a listener on a free port, real shard
slots whose control channels are real SEQPACKET pairs (the shard ends read here)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pynsqd.node.control import ControlChannel, channel_pair, decode, encode
from pynsqd.supervisor.httpaccept import HTTPAcceptor
from pynsqd.supervisor.slots import Slot


@pytest.fixture
def shards() -> Iterator[tuple[list[Slot], list[socket.socket]]]:
    """Two ready slots; the shard ends of their control channels."""
    slots, ends = [], []
    for index in range(2):
        slot = Slot(index)
        ours, theirs = channel_pair()
        slot.channel = ControlChannel(ours, lambda *_: None, f"shard {index}")
        slot.ready.set()
        slots.append(slot)
        ends.append(theirs)
    yield slots, ends
    for slot, end in zip(slots, ends):
        assert slot.channel is not None
        slot.channel.close()
        end.close()


def received(end: socket.socket, want: int, timeout: float = 5.0, answer: bool = True) -> list[socket.socket]:
    """The connections handed over ``end`` until ``want`` arrived (or the deadline passed),
    each hand-off answered as a shard does (``answer``)."""
    end.settimeout(0.1)
    conns: list[socket.socket] = []
    deadline = time.monotonic() + timeout
    while len(conns) < want and time.monotonic() < deadline:
        try:
            data, fds, _, _ = socket.recv_fds(end, 65536, 64)
        except TimeoutError:
            continue
        header, _ = decode(data[1:])
        assert {k: v for k, v in header.items() if k != "rid"} == {"op": "serve_http", "tls": False}
        conns += [socket.socket(fileno=fd) for fd in fds]
        if answer:
            for datagram in encode({"op": "done", "re": header["rid"]}):
                end.send(datagram)
    return conns


def _start(slots: list[Slot]) -> None:
    """The supervisor's ends of the control channels read on the running loop."""
    for slot in slots:
        assert slot.channel is not None
        slot.channel.start(asyncio.get_running_loop())


async def _until(predicate: Callable[[], bool], seconds: float = 5.0) -> None:
    for _ in range(int(seconds / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out")


def _echo(served: list[socket.socket], clients: list[socket.socket]) -> None:
    """Every client reaches one served connection, which answers it."""
    got = set()
    for i, client in enumerate(clients):
        client.sendall(b"ping %d" % i)
    for conn in served:
        conn.settimeout(5)
        got.add(conn.recv(100))
        conn.sendall(b"pong")
    assert got == {b"ping %d" % i for i in range(len(clients))}
    for client in clients:
        client.settimeout(5)
        assert client.recv(100) == b"pong"


def _accept_and_serve(slots: list[Slot], ends: list[socket.socket], then: Callable[[HTTPAcceptor], Any]) -> None:
    """Four clients connect to a listener the acceptor serves; once four hand-offs went out,
    ``then(acceptor)`` runs (on a thread), and shard 0 must end up serving all four, end to
    end."""
    acceptor = HTTPAcceptor(slots)
    listener = socket.create_server(("127.0.0.1", 0))
    clients = [socket.create_connection(listener.getsockname()) for _ in range(4)]
    served: list[socket.socket] = []

    async def accept_all() -> None:
        _start(slots)
        acceptor.start(asyncio.get_running_loop(), listener, tls=False)
        await _until(lambda: acceptor.handed >= 4)
        await asyncio.to_thread(then, acceptor)
        served.extend(await asyncio.to_thread(received, ends[0], 4))
        await _until(lambda: not acceptor.unacknowledged)
        assert acceptor.handed == 4
        acceptor.stop()

    try:
        asyncio.run(accept_all())
        assert len(served) == 4
        _echo(served, clients)
    finally:
        for sock in [listener, *clients, *served]:
            sock.close()


def test_connections_for_a_shard_that_died_before_its_hand_off_go_to_the_other_shard(
        shards: tuple[list[Slot], list[socket.socket]]) -> None:
    """Shard 1 died (its end of the channel is closed) but is not yet reaped, so it still
    looks ready: its share of the connections is handed to shard 0 instead of being closed,
    and every connection works end to end."""
    slots, ends = shards
    ends[1].close()
    _accept_and_serve(slots, ends, lambda acceptor: None)
    assert slots[1].channel is not None and slots[1].channel.closed


def test_connections_a_shard_took_but_never_acknowledged_go_unread_to_another_shard(
        shards: tuple[list[Slot], list[socket.socket]]) -> None:
    """A shard that dies after its hand-off reached it but before it said it has the
    connections (so it read none of them) does not take them along: the supervisor kept its
    copies, and gives them to the other shard, where every client is served end to end."""
    slots, ends = shards

    def die_unanswered(acceptor: HTTPAcceptor) -> None:
        dying = received(ends[1], 2, answer=False)
        assert len(dying) == 2  # its share reached it
        for conn in dying:
            conn.close()
        ends[1].close()  # it dies without a word

    _accept_and_serve(slots, ends, die_unanswered)


def test_connections_given_back_while_no_shard_takes_any_wait_for_the_first_that_does(
        shards: tuple[list[Slot], list[socket.socket]]) -> None:
    """A shard being replaced gives its idle connections back; with no other shard taking
    connections they wait, and go to the first one ready again."""
    slots, ends = shards
    acceptor = HTTPAcceptor(slots)
    pairs = [socket.socketpair() for _ in range(3)]
    served: list[socket.socket] = []

    async def give_back() -> None:
        _start(slots)
        for slot in slots:
            slot.draining = True
        acceptor.give([theirs for _, theirs in pairs], tls=False)
        await asyncio.sleep(0.05)
        assert acceptor.handed == 0  # nobody takes them: they wait
        slots[0].draining = False
        acceptor.flush()
        assert acceptor.handed == 3
        served.extend(await asyncio.to_thread(received, ends[0], 3))
        await _until(lambda: not acceptor.unacknowledged)

    try:
        asyncio.run(give_back())
        _echo(served, [ours for ours, _ in pairs])
    finally:
        for sock in [*served, *(s for pair in pairs for s in pair)]:
            sock.close()
