"""Listening addresses as NSQ takes them: ``host:port``, ``[v6]:port``, ``:port``, or a
unix socket path. Sockets are bound here, once, so port 0 works and the real port is known."""

from __future__ import annotations

import os
import socket

from pynsqd.options import UsageError


def split_host_port(address: str) -> tuple[str, int]:
    """``"0.0.0.0:4150"`` → ``("0.0.0.0", 4150)``; raises ``UsageError``."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise UsageError(f"invalid address {address!r} (want <addr>:<port>)")
    host = host.strip("[]")
    return host, int(port)


def is_unix_path(address: str) -> bool:
    return "/" in address and not address.startswith("[")


def bind(address: str, backlog: int = 1024) -> socket.socket:
    """Bind and listen on ``address``. Raises ``UsageError`` when it cannot."""
    try:
        if is_unix_path(address):
            if os.path.exists(address):
                os.unlink(address)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(address)
        else:
            host, port = split_host_port(address)
            infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
            family, _, _, _, sockaddr = infos[0]
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(sockaddr)
        sock.listen(backlog)
        sock.setblocking(False)
        return sock
    except OSError as exc:
        raise UsageError(f"listen ({address}) failed - {exc.strerror or exc}") from None
    except socket.gaierror as exc:
        raise UsageError(f"listen ({address}) failed - {exc}") from None


def describe(sock: socket.socket) -> str:
    """The bound address as ``host:port`` (or the unix path)."""
    name = sock.getsockname()
    if isinstance(name, tuple):
        host = name[0]
        return f"[{host}]:{name[1]}" if ":" in host else f"{host}:{name[1]}"
    return str(name)


def bound_port(sock: socket.socket) -> int:
    """The bound TCP port, or -1 for a unix socket (as nsqd's /info reports it)."""
    name = sock.getsockname()
    return int(name[1]) if isinstance(name, tuple) else -1
