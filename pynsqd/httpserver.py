"""The HTTP(S) server of a daemon, in the daemon's own event loop: on a socket the daemon bound
itself, or on connections accepted by another process (an nsqd shard's, handed over by
``supervisor/httpaccept.py``).

Theory of operation
-------------------
There is little left for a server to do once the connection protocol (``httpconn.py``) reads,
bounds and answers requests itself: ``HTTPServer`` makes one protocol per connection (with
``make_connection(connections)``), over TLS when it has a context, and stops gracefully. It
installs no signal handler: the daemon owns SIGTERM and SIGINT and calls ``stop()``.

- ``serve(sock)`` serves a listening socket until ``stop()``; ``serve()`` without one serves
  only what ``adopt(sock)`` hands it. A TLS handshake that fails only closes that connection.
- ``release_idle()``, ``finish_all()`` and ``close_all()`` serve a shard replaced by a new
  process (``shard/handover.py``): idle plain connections given up for it, the others told
  to close after their last answer, what is still open at the release closed.
- ``stop()`` makes ``serve`` stop: the listener closes (new connections wait in the kernel's
  backlog, or go elsewhere), ``adopt`` closes what it is given, every connection is asked to
  ``shutdown()`` (an idle one closes at once, a busy one once it has answered what it
  received), and after ``GRACE`` seconds what is left is cancelled and closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
import ssl
from collections.abc import Callable

from pynsqd.httpconn import ASGIApp, Connections, HTTPConnection

log = logging.getLogger("pynsqd.http")

GRACE = 5.0  # seconds a graceful stop waits for busy connections before it closes them


class HTTPServer:
    """HTTP (or, with ``ssl_context``, HTTPS) for one daemon; see the module doc."""

    def __init__(self, make_connection: Callable[[Connections], HTTPConnection],
                 ssl_context: ssl.SSLContext | None = None, grace: float = GRACE) -> None:
        self.make_connection = make_connection
        self.ssl_context = ssl_context
        self.grace = grace
        self.connections = Connections()
        self.stopping = False
        self._stop = asyncio.Event()

    def _protocol(self) -> HTTPConnection:
        return self.make_connection(self.connections)

    async def serve(self, sock: socket.socket | None = None) -> None:
        """Serve ``sock`` (a bound, listening socket) and adopted connections until
        ``stop()``, then stop gracefully and return."""
        listener: asyncio.Server | None = None
        if sock is not None:
            listener = await asyncio.get_running_loop().create_server(self._protocol, sock=sock,
                                                                       ssl=self.ssl_context)
        try:
            await self._stop.wait()
        finally:
            self.stopping = True
            if listener is not None:
                listener.close()
            await self._shutdown()

    async def adopt(self, sock: socket.socket) -> None:
        """Serve ``sock``, a connection accepted elsewhere, as if this server had accepted it
        (over TLS when the server has a context). Once the server is stopping it is closed."""
        if self.stopping:
            sock.close()
            return
        try:
            await asyncio.get_running_loop().connect_accepted_socket(self._protocol, sock, ssl=self.ssl_context)
        except (OSError, ssl.SSLError, TimeoutError) as exc:
            log.debug("connection dropped before it was served - %r", exc)
            sock.close()

    def stop(self) -> None:
        """Make ``serve`` stop gracefully; safe to call more than once."""
        self.stopping = True
        self._stop.set()

    # --- a shard replaced by a new process (``shard/handover.py``) --------------------------
    def release_idle(self) -> list[socket.socket]:
        """Give up every plain HTTP connection that is idle between requests, for another
        process to serve (``HTTPConnection.release``); busy ones are left to finish."""
        out = []
        for conn in list(self.connections.open):
            sock = conn.release()
            if sock is not None:
                out.append(sock)
        return out

    def finish_all(self) -> None:
        """Every connection closes once it owes no answer, saying so in that answer
        (``HTTPConnection.finish``)."""
        for conn in list(self.connections.open):
            conn.finish()

    @property
    def open_connections(self) -> int:
        return len(self.connections.open)

    def close_all(self) -> int:
        """Close every connection now; how many there were."""
        conns = list(self.connections.open)
        for conn in conns:
            if conn.transport is not None:
                conn.transport.close()
        return len(conns)

    async def _shutdown(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.grace
        connections = self.connections
        for conn in list(connections.open):
            conn.shutdown()
        if connections.open:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(connections.emptied.wait(), self.grace)
        if connections.tasks:  # apps still running for clients that went away
            await asyncio.wait(list(connections.tasks), timeout=max(deadline - loop.time(), 0.001))
        left = list(connections.open)
        if left or connections.tasks:
            log.info("closing %d HTTP connection(s) still busy after %gs", len(left), self.grace)
        for task in list(connections.tasks):
            task.cancel()
        for conn in left:
            if conn.transport is not None:
                conn.transport.abort()
        if connections.tasks:
            await asyncio.wait(list(connections.tasks))


def app_server(app: ASGIApp, ssl_context: ssl.SSLContext | None = None) -> HTTPServer:
    """A server whose every request goes to the ASGI ``app``."""
    return HTTPServer(functools.partial(HTTPConnection, app), ssl_context)
