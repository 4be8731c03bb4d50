"""``HTTPServer`` in this process on real sockets: a graceful stop closes the listener and the
idle connections at once, answers what a busy connection received (then closes it), and after
its grace closes what is left and cancels the apps still running; ``adopt`` serves a
connection accepted elsewhere, and refuses one once stopping; HTTPS on a listener and on an
adopted connection."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

from pynsqd.httpserver import app_server
from tests.conftest import run_async
from tests.support.certs import Certs
from tests.support.harness import scaled

Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
PING = b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n"


class App:
    """``/slow`` answers once ``release`` is set (``started`` says it is waiting); the rest at once."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.cancelled = False

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["path"] == "/slow":
            self.started.set()
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled = True
                raise
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": scope["path"].encode()})


def listener() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


async def read_all(reader: asyncio.StreamReader) -> bytes:
    return await asyncio.wait_for(reader.read(), scaled(10))


def test_a_graceful_stop_answers_what_was_received_and_closes_the_rest() -> None:
    async def main() -> None:
        app = App()
        server = app_server(app)
        sock = listener()
        address = sock.getsockname()
        serving = asyncio.create_task(server.serve(sock))
        idle_r, idle_w = await asyncio.open_connection(*address)
        idle_w.write(PING)
        assert (await idle_r.readuntil(b"/ping")).startswith(b"HTTP/1.1 200 OK\r\n")  # kept alive, idle
        busy_r, busy_w = await asyncio.open_connection(*address)
        busy_w.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.wait_for(app.started.wait(), scaled(10))
        server.stop()
        assert await read_all(idle_r) == b""  # closed at once
        try:
            await asyncio.open_connection(*address)
            raise AssertionError("the listener still accepts")
        except OSError:
            pass
        assert not serving.done()
        app.release.set()
        answer = await read_all(busy_r)  # answered, then closed
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b"/slow")
        await asyncio.wait_for(serving, scaled(10))
        for writer in (idle_w, busy_w):
            writer.close()
    run_async(main())


def test_after_its_grace_a_stop_closes_busy_connections_and_cancels_their_apps() -> None:
    async def main() -> None:
        app = App()
        server = app_server(app)
        server.grace = 0.2
        sock = listener()
        serving = asyncio.create_task(server.serve(sock))
        reader, writer = await asyncio.open_connection(*sock.getsockname())
        writer.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.wait_for(app.started.wait(), scaled(10))
        server.stop()
        await asyncio.wait_for(serving, scaled(10))
        assert app.cancelled
        assert await read_all(reader) == b""
        writer.close()
    run_async(main())


def test_adopt_serves_a_connection_accepted_elsewhere_until_the_server_stops() -> None:
    async def main() -> None:
        server = app_server(App())
        serving = asyncio.create_task(server.serve())
        ours, theirs = socket.socketpair()
        await server.adopt(ours)
        reader, writer = await asyncio.open_connection(sock=theirs)
        writer.write(PING)
        assert (await reader.readuntil(b"/ping")).startswith(b"HTTP/1.1 200 OK\r\n")
        server.stop()
        assert await read_all(reader) == b""
        late, other = socket.socketpair()
        await server.adopt(late)  # stopping: closed, not served
        assert other.recv(1) == b""
        other.close()
        writer.close()
        await asyncio.wait_for(serving, scaled(10))
    run_async(main())


def test_https_on_a_listener_and_on_an_adopted_connection(certs: Certs) -> None:
    async def main() -> None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(certs.server_cert, certs.server_key)
        server = app_server(App(), context)
        sock = listener()
        serving = asyncio.create_task(server.serve(sock))
        client = certs.client_context()
        reader, writer = await asyncio.open_connection(*sock.getsockname(), ssl=client, server_hostname="127.0.0.1")
        writer.write(PING)
        assert (await reader.readuntil(b"/ping")).startswith(b"HTTP/1.1 200 OK\r\n")
        ours, theirs = socket.socketpair()
        adopting = asyncio.create_task(server.adopt(ours))
        reader2, writer2 = await asyncio.open_connection(sock=theirs, ssl=client, server_hostname="127.0.0.1")
        await adopting
        writer2.write(PING)
        assert (await reader2.readuntil(b"/ping")).startswith(b"HTTP/1.1 200 OK\r\n")
        plain, other = socket.socketpair()  # not TLS: the handshake fails and only closes it
        adopting = asyncio.create_task(server.adopt(plain))
        other.sendall(PING)
        await asyncio.wait_for(adopting, scaled(10))
        server.stop()
        await asyncio.wait_for(serving, scaled(10))
        for w in (writer, writer2):
            w.close()
        other.close()
    run_async(main())
