"""``LookupProtocol`` in-process on a real uvloop loop and real sockets: flow control.

A producer that pipelines commands and never reads its replies must not make lookupd
buffer without bound: once the transport's write buffer passes its high-water mark the
protocol stops reading, and it resumes when the peer drains. Tiny socket buffers make the
kernel's share small so the test needs only 250 KB of PINGs.
"""

from __future__ import annotations

import asyncio
import logging
import socket

from pynsqd.lookupd.registry import RegistrationDB
from pynsqd.lookupd.tcp import LookupProtocol
from pynsqd.wire.lookup import MAGIC, OK, PING, ResponseReader
from testbed.harness import scaled
from tests.conftest import run_async

LOG = logging.getLogger("test.lookupd.adapter")
PINGS = 50_000


def small_buffers(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)


def test_unread_replies_pause_reading_then_resume() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        listener = socket.create_server(("127.0.0.1", 0))
        small_buffers(listener)  # accepted sockets inherit these
        connections: set[LookupProtocol] = set()
        server = await loop.create_server(
            lambda: LookupProtocol(RegistrationDB(), b"{}", LOG, connections), sock=listener)
        client = socket.create_connection(listener.getsockname())
        small_buffers(client)
        client.setblocking(False)
        sending = asyncio.create_task(loop.sock_sendall(client, MAGIC + PING * PINGS))

        async def stalled() -> LookupProtocol:
            while True:
                if connections:
                    (conn,) = connections
                    assert conn.transport is not None
                    if not conn.transport.is_reading():
                        return conn
                assert not sending.done(), "every PING was taken without pausing"
                await asyncio.sleep(0.005)

        conn = await asyncio.wait_for(stalled(), scaled(10))
        assert conn.transport is not None
        high = conn.transport.get_write_buffer_limits()[1]
        buffered = conn.transport.get_write_buffer_size()
        assert 0 < buffered < high + 256 * 1024 * 6 // 5  # at most one read's replies past high

        # Drain with ordinary buffers: tiny ones make every round trip wait for a delayed ACK.
        for sock in (client, conn.transport.get_extra_info("socket")):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        reader = ResponseReader()
        replies = 0
        async with asyncio.timeout(scaled(30)):
            while replies < PINGS:
                chunk = await loop.sock_recv(client, 65536)
                assert chunk, "lookupd closed the connection"
                for reply in reader.feed(chunk):
                    assert reply == OK
                    replies += 1
            await sending
        assert replies == PINGS
        client.close()
        server.close()
        await server.wait_closed()

    run_async(main())
