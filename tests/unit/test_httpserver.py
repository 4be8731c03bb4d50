"""``HTTPServer`` in this process on real sockets: a graceful stop closes the listener and the
idle connections at once, answers what a busy connection received (then closes it), and after
its grace closes what is left and cancels the apps still running; ``adopt`` serves a
connection accepted elsewhere, and refuses one once stopping; HTTPS on a listener and on an
adopted connection; what a shard replaced by a new process does with its connections."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from pynsqd.httpserver import HTTPServer, app_server
from testbed.certs import Certs
from testbed.harness import scaled
from tests.conftest import run_async

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


class Held:
    """What a test opens, closed at its end whatever happened (an open transport left to the
    garbage collector at the loop's close is an error)."""

    def __init__(self) -> None:
        self.servers: list[tuple[HTTPServer, asyncio.Task[None]]] = []
        self.closers: list[Callable[[], Any]] = []

    def serve(self, server: HTTPServer, sock: socket.socket | None = None) -> asyncio.Task[None]:
        task = asyncio.create_task(server.serve(sock))
        self.servers.append((server, task))
        return task

    def hold(self, thing: Any) -> Any:
        """``thing`` (a socket or a stream writer) closed at the end."""
        self.closers.append(thing.close)
        return thing

    async def connect(self, *args: Any, **kwargs: Any) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection(*args, **kwargs)
        self.hold(writer)
        return reader, writer

    async def close(self) -> None:
        for close in self.closers:
            close()
        for server, _ in self.servers:
            server.grace = min(server.grace, 0.1)
            server.stop()
        await asyncio.wait([task for _, task in self.servers] or [asyncio.sleep(0)], timeout=scaled(10))


def run(main: Callable[[Held], Coroutine[Any, Any, None]]) -> None:
    async def held() -> None:
        things = Held()
        try:
            await main(things)
        finally:
            await things.close()
    run_async(held())


def listener() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


async def read_all(reader: asyncio.StreamReader) -> bytes:
    return await asyncio.wait_for(reader.read(), scaled(10))


def test_a_graceful_stop_answers_what_was_received_and_closes_the_rest() -> None:
    async def main(held: Held) -> None:
        app = App()
        server = app_server(app)
        sock = listener()
        address = sock.getsockname()
        serving = held.serve(server, sock)
        idle_r, idle_w = await held.connect(*address)
        idle_w.write(PING)
        assert (await idle_r.readuntil(b"/ping")).startswith(b"HTTP/1.1 200 OK\r\n")  # kept alive, idle
        busy_r, busy_w = await held.connect(*address)
        busy_w.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.wait_for(app.started.wait(), scaled(10))
        server.stop()
        assert await read_all(idle_r) == b""  # closed at once
        try:
            await held.connect(*address)
            raise AssertionError("the listener still accepts")
        except OSError:
            pass
        assert not serving.done()
        app.release.set()
        answer = await read_all(busy_r)  # answered, then closed
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b"/slow")
        await asyncio.wait_for(serving, scaled(10))
    run(main)


def test_a_client_that_ends_its_side_after_an_answer_is_closed_and_forgotten() -> None:
    """An idle keep-alive connection whose client sends its last byte (FIN) is closed by the
    server, not left half-open (CLOSE-WAIT) for a graceful stop to wait on until its grace."""
    async def main(held: Held) -> None:
        server = app_server(App())
        sock = listener()
        held.serve(server, sock)
        reader, writer = await held.connect(*sock.getsockname())
        writer.write(PING)
        assert (await reader.readuntil(b"/ping")).startswith(b"HTTP/1.1 200 OK\r\n")
        writer.write_eof()
        assert await read_all(reader) == b""  # the server closed its side too
        await asyncio.wait_for(server.connections.emptied.wait(), scaled(10))
        assert server.open_connections == 0
    run(main)


def test_after_its_grace_a_stop_closes_busy_connections_and_cancels_their_apps() -> None:
    async def main(held: Held) -> None:
        app = App()
        server = app_server(app)
        server.grace = 0.2
        sock = listener()
        serving = held.serve(server, sock)
        reader, writer = await held.connect(*sock.getsockname())
        writer.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.wait_for(app.started.wait(), scaled(10))
        server.stop()
        await asyncio.wait_for(serving, scaled(10))
        assert app.cancelled
        assert await read_all(reader) == b""
    run(main)


def test_adopt_serves_a_connection_accepted_elsewhere_until_the_server_stops() -> None:
    async def main(held: Held) -> None:
        server = app_server(App())
        serving = held.serve(server)
        ours, theirs = socket.socketpair()
        await server.adopt(ours)
        reader, writer = await held.connect(sock=theirs)
        writer.write(PING)
        assert (await reader.readuntil(b"/ping")).startswith(b"HTTP/1.1 200 OK\r\n")
        server.stop()
        assert await read_all(reader) == b""
        late, other = socket.socketpair()
        held.hold(other)
        await server.adopt(late)  # stopping: closed, not served
        assert other.recv(1) == b""
        await asyncio.wait_for(serving, scaled(10))
    run(main)


def test_https_on_a_listener_and_on_an_adopted_connection(certs: Certs) -> None:
    async def main(held: Held) -> None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(certs.server_cert, certs.server_key)
        server = app_server(App(), context)
        sock = listener()
        serving = held.serve(server, sock)
        client = certs.client_context()
        reader, writer = await held.connect(*sock.getsockname(), ssl=client, server_hostname="127.0.0.1")
        writer.write(PING)
        assert (await reader.readuntil(b"/ping")).startswith(b"HTTP/1.1 200 OK\r\n")
        ours, theirs = socket.socketpair()
        adopting = asyncio.create_task(server.adopt(ours))
        reader2, writer2 = await held.connect(sock=theirs, ssl=client, server_hostname="127.0.0.1")
        await adopting
        writer2.write(PING)
        assert (await reader2.readuntil(b"/ping")).startswith(b"HTTP/1.1 200 OK\r\n")
        plain, other = socket.socketpair()  # not TLS: the handshake fails and only closes it
        held.hold(other)
        adopting = asyncio.create_task(server.adopt(plain))
        other.sendall(PING)
        await asyncio.wait_for(adopting, scaled(10))
        server.stop()
        await asyncio.wait_for(serving, scaled(10))
    run(main)


def test_an_idle_connection_is_released_to_another_server_and_a_finished_one_says_close() -> None:
    """What a shard replaced by a new process does with its HTTP connections: an idle plain
    one moves (the client's next request is answered by the other server, on the same TCP
    connection); a busy one is not released; after ``finish_all`` the next answer says
    ``connection: close`` and the connection closes."""
    async def main(held: Held) -> None:
        app = App()
        old, new = app_server(app), app_server(App())
        sock = listener()
        held.serve(old, sock)
        held.serve(new)
        idle_r, idle_w = await held.connect(*sock.getsockname())
        idle_w.write(PING)
        assert (await idle_r.readuntil(b"/ping")).startswith(b"HTTP/1.1 200 OK\r\n")
        busy_r, busy_w = await held.connect(*sock.getsockname())
        busy_w.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.wait_for(app.started.wait(), scaled(10))
        released = [held.hold(s) for s in old.release_idle()]
        assert len(released) == 1  # the busy one stays
        await new.adopt(released[0].dup())
        idle_w.write(PING)
        assert (await idle_r.readuntil(b"/ping")).startswith(b"HTTP/1.1 200 OK\r\n")
        assert (old.open_connections, new.open_connections) == (1, 1)
        old.finish_all()
        app.release.set()
        answer = await read_all(busy_r)
        assert b"\r\nconnection: close\r\n" in answer and answer.endswith(b"/slow")
    run(main)
