"""systemd's readiness protocol (``sd_notify``), for units with ``Type=notify``.

A service manager that wants to know when a daemon is serving sets ``NOTIFY_SOCKET`` to the
path of a unix datagram socket (a leading ``@`` means Linux's abstract namespace); the daemon
sends it one datagram of newline-separated ``KEY=value`` assignments: ``READY=1`` once it
serves, ``STOPPING=1`` when it begins to shut down, ``STATUS=…`` a line for ``systemctl
status``. That is the whole protocol (``man sd_notify``); without ``NOTIFY_SOCKET`` there is
nobody to tell and nothing is sent.

The nsqd supervisor calls ``notify`` when every shard said ready and its listeners are
announced, and when it begins to stop. A datagram that cannot be sent is logged, never raised:
the manager would then time the start out, which says more than a crashed node would.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger("pynsqd.sdnotify")


def notify(*assignments: str) -> bool:
    """Send ``assignments`` (``"READY=1"``, ``"STATUS=…"``) to ``$NOTIFY_SOCKET`` as one
    datagram. Returns True when it was sent, False when no socket is set or sending failed."""
    path = os.environ.get("NOTIFY_SOCKET", "")
    if not path:
        return False
    address = "\0" + path[1:] if path.startswith("@") else path
    message = "\n".join(assignments).encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(message, address)
    except OSError as exc:
        log.warning("could not notify the service manager at %s - %s", path, exc)
        return False
    return True
