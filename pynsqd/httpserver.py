"""uvicorn embedded in a daemon's own event loop, on a socket the daemon bound itself or on
connections accepted by another process (an nsqd shard's, ``supervisor/httpaccept.py``).

uvicorn runs the listening sockets, TLS, the ``date`` header and graceful shutdown; every
connection is served by pynsqd's own protocol (``httpconn.py``), which bounds each request's
head and serves nsqd's publishes inline. That protocol is built on the arguments uvicorn
hands a connection class (``config``, ``server_state``), which is why pyproject.toml pins
the uvicorn versions it is tested with."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Iterator
from typing import Any

import uvicorn

from pynsqd.httpconn import DEFAULT_MAX_BODY, HTTPConnection, Publisher, http_protocol

log = logging.getLogger("pynsqd.http")


class EmbeddedServer(uvicorn.Server):
    """uvicorn's server minus its signal handling: the daemon owns SIGTERM and SIGINT.

    Serve with ``serve(sockets=[sock])`` in a task — or ``serve(sockets=[])`` and ``adopt``
    each accepted connection; stop with ``should_exit = True`` (a graceful stop of every
    connection, adopted ones too)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def adopt(self, sock: socket.socket) -> None:
        """Serve ``sock``, a connection accepted elsewhere, as if this server had accepted it
        (over TLS when the server has a context). A failed TLS handshake only closes it."""
        config = self.config
        if not config.loaded:
            config.load()

        def protocol() -> asyncio.Protocol:
            return config.http_protocol_class(config=config, server_state=self.server_state)  # type: ignore[call-arg]

        try:
            await asyncio.get_running_loop().connect_accepted_socket(protocol, sock, ssl=config.ssl)
        except (OSError, ssl.SSLError, TimeoutError) as exc:
            log.debug("connection dropped before it was served - %r", exc)


    def release_idle(self) -> list[socket.socket]:
        """Give up every plain HTTP connection that is idle between requests, for another
        process to serve (``HTTPConnection.release``); busy ones are left to finish."""
        out = []
        for conn in list(self.server_state.connections):
            if isinstance(conn, HTTPConnection):
                sock = conn.release()
                if sock is not None:
                    out.append(sock)
        return out

    def finish_all(self) -> None:
        """Every connection closes once it owes no answer, saying so in that answer
        (``HTTPConnection.finish``)."""
        for conn in list(self.server_state.connections):
            if isinstance(conn, HTTPConnection):
                conn.finish()

    @property
    def open_connections(self) -> int:
        return len(self.server_state.connections)

    def close_all(self) -> int:
        """Close every connection now; how many there were."""
        conns = list(self.server_state.connections)
        for conn in conns:
            if isinstance(conn, HTTPConnection) and conn.transport is not None:
                conn.transport.close()
        return len(conns)


def embedded_server(app: Any, ssl_context: ssl.SSLContext | None = None, publisher: Publisher | None = None,
                    max_body: int = DEFAULT_MAX_BODY) -> EmbeddedServer:
    """A server for ``app`` with pynsqd's settings: no lifespan, no access log, no
    ``Server`` header, no proxy-header rewriting, errors through the ``pynsqd`` logging
    setup; connections served by ``httpconn.HTTPConnection`` (with ``publisher``: nsqd's
    publishes inline; without: request bodies up to ``max_body`` bytes). With
    ``ssl_context`` it serves HTTPS with that context (the daemon's own TLS settings)."""
    config = uvicorn.Config(app, lifespan="off", access_log=False, log_config=None, proxy_headers=False,
                            server_header=False, timeout_graceful_shutdown=5,
                            http=http_protocol(publisher, max_body))
    if ssl_context is not None:
        config.load()
        config.ssl = ssl_context
    return EmbeddedServer(config)
