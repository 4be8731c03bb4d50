"""uvicorn embedded in a daemon's own event loop, on a socket the daemon bound itself."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Iterator
from typing import Any

import uvicorn


class EmbeddedServer(uvicorn.Server):
    """uvicorn's server minus its signal handling: the daemon owns SIGTERM and SIGINT.

    Serve with ``serve(sockets=[sock])`` in a task; stop with ``should_exit = True``."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def embedded_server(app: Any, ssl_context: ssl.SSLContext | None = None,
                    http: type[asyncio.Protocol] | None = None) -> EmbeddedServer:
    """A server for ``app`` with pynsqd's settings: no lifespan, no access log, no
    ``Server`` header, no proxy-header rewriting, errors through the ``pynsqd`` logging
    setup; httptools' parser (uvicorn's ``HttpToolsProtocol``), or the connection protocol
    class ``http`` (a shard's, ``shard/httpconn.py``). With ``ssl_context`` it serves HTTPS
    with that context (the daemon's own TLS settings)."""
    config = uvicorn.Config(app, lifespan="off", access_log=False, log_config=None, proxy_headers=False,
                            server_header=False, timeout_graceful_shutdown=5, http=http or "httptools")
    if ssl_context is not None:
        config.load()
        config.ssl = ssl_context
    return EmbeddedServer(config)
