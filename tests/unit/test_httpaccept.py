"""The supervisor's HTTP acceptor over real sockets: a listener on a free port, real shard
slots whose control channels are real SEQPACKET pairs (the shard ends read here)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator

import pytest

from pynsqd.supervisor.control import ControlChannel, channel_pair, decode
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


def received(end: socket.socket, want: int, timeout: float = 5.0) -> list[socket.socket]:
    """The connections handed over ``end`` until ``want`` arrived (or the deadline passed)."""
    end.settimeout(0.1)
    conns: list[socket.socket] = []
    deadline = time.monotonic() + timeout
    while len(conns) < want and time.monotonic() < deadline:
        try:
            data, fds, _, _ = socket.recv_fds(end, 65536, 64)
        except TimeoutError:
            continue
        header, _ = decode(data[1:])
        assert header == {"op": "serve_http", "tls": False}
        conns += [socket.socket(fileno=fd) for fd in fds]
    return conns


def test_connections_for_a_shard_that_died_before_its_hand_off_go_to_the_other_shard(
        shards: tuple[list[Slot], list[socket.socket]]) -> None:
    """Shard 1 died (its end of the channel is closed) but is not yet reaped, so it still
    looks ready: its share of the connections is handed to shard 0 instead of being closed,
    and every connection works end to end."""
    slots, ends = shards
    ends[1].close()
    acceptor = HTTPAcceptor(slots)
    listener = socket.create_server(("127.0.0.1", 0))
    clients = [socket.create_connection(listener.getsockname()) for _ in range(4)]

    async def accept_all() -> None:
        acceptor.start(asyncio.get_running_loop(), listener, tls=False)
        for _ in range(500):  # 5 s at most
            if acceptor.handed >= 4:
                break
            await asyncio.sleep(0.01)
        acceptor.stop()

    served: list[socket.socket] = []
    try:
        asyncio.run(accept_all())
        assert slots[1].channel is not None and slots[1].channel.closed
        assert acceptor.handed == 4
        served += received(ends[0], 4)
        assert len(served) == 4
        for i, client in enumerate(clients):
            client.sendall(b"ping %d" % i)
        got = set()
        for conn in served:
            conn.settimeout(5)
            got.add(conn.recv(100))
            conn.sendall(b"pong")
        assert got == {b"ping %d" % i for i in range(4)}
        for client in clients:
            client.settimeout(5)
            assert client.recv(100) == b"pong"
    finally:
        for sock in [listener, *clients, *served]:
            sock.close()
