"""Listening addresses as NSQ takes them: ``host:port``, ``[v6]:port``, ``:port``, or a
unix socket path. Sockets are bound here, once, so port 0 works and the real port is known."""

from __future__ import annotations

import os
import socket
from typing import Any

from pynsqd.options import UsageError


def split_host_port(address: str, flag_name: str = "address") -> tuple[str, int]:
    """``host:port`` (``[v6]:port``, ``:port`` for every interface) → ``(host, port)``.

    Raises ``UsageError`` naming ``--flag_name``."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) > 65535:
        raise UsageError(f"invalid value {address!r} for flag --{flag_name}: expected <addr>:<port>")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise UsageError(f"invalid value {address!r} for flag --{flag_name}: "
                         "IPv6 addresses must be bracketed")
    return host, int(port_text)


def format_address(sockname: Any) -> str:
    """A socket address as Go prints it: ``host:port``, IPv6 hosts in brackets."""
    host, port = sockname[0], sockname[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_unix_path(address: str) -> bool:
    return "/" in address and not address.startswith("[")


def bind(address: str, flag_name: str = "address", backlog: int = 1024) -> socket.socket:
    """Bind and listen on ``address`` (port 0 picks a free port). Raises ``UsageError``."""
    try:
        if is_unix_path(address):
            if os.path.exists(address):
                os.unlink(address)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            _bind_or_close(sock, address)
        else:
            host, port = split_host_port(address, flag_name)
            infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
            family, _, _, _, sockaddr = infos[0]
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            _bind_or_close(sock, sockaddr)
        sock.listen(backlog)
        sock.setblocking(False)
        return sock
    except OSError as exc:
        raise UsageError(f"listen ({address}) failed - {exc.strerror or exc}") from None
    except socket.gaierror as exc:
        raise UsageError(f"listen ({address}) failed - {exc}") from None


def _bind_or_close(sock: socket.socket, where: Any) -> None:
    try:
        sock.bind(where)
    except OSError:
        sock.close()
        raise


def describe(sock: socket.socket) -> str:
    """The bound address as ``host:port`` (or the unix path)."""
    name = sock.getsockname()
    return format_address(name) if isinstance(name, tuple) else str(name)


def bound_port(sock: socket.socket) -> int:
    """The bound TCP port, or -1 for a unix socket (as nsqd's /info reports it)."""
    name = sock.getsockname()
    return int(name[1]) if isinstance(name, tuple) else -1
