"""The client's exceptions (the tree is drawn in ``pynsqd.client``'s docstring).

Transport failures (``OSError``, ``ssl.SSLError``, ``httpx.TransportError``) are turned into
these at one place each — ``handshake.open_connection`` for TCP and ``http.request`` for
HTTP — with ``raise ... from exc`` so the original cause stays on ``__cause__``.
"""

from __future__ import annotations

from pynsqd.wire.errors import NON_FATAL_CODES


class NSQError(Exception):
    """Base class of every error ``pynsqd.client`` raises."""


class TransportError(NSQError):
    """The network failed under us; ``__cause__`` holds the original exception."""


class ConnectError(TransportError):
    """A TCP or HTTP connection could not be opened (refused, unreachable, DNS)."""


class ConnectionClosedError(TransportError):
    """The connection closed while a command was waiting for its response, or before use."""


class NSQTimeoutError(TransportError):
    """A connect, handshake or response took longer than its configured timeout."""


class ProtocolViolationError(NSQError):
    """The peer sent something that is not NSQ protocol (a bad frame, an unexpected reply)."""


class ResponseError(NSQError):
    """nsqd answered a command with an error frame ``"<CODE> <description>"``.

    ``code`` is NSQ's ``E_*`` code; ``fatal`` is True when nsqd closes the connection after it
    (every code except ``E_FIN_FAILED``, ``E_REQ_FAILED`` and ``E_TOUCH_FAILED``).
    """

    def __init__(self, code: str, description: str = "") -> None:
        super().__init__(f"{code} {description}".rstrip())
        self.code = code
        self.description = description
        self.fatal = code not in NON_FATAL_CODES

    @classmethod
    def from_frame(cls, data: bytes) -> ResponseError:
        text = data.decode("utf-8", "replace")
        code, _, description = text.partition(" ")
        return cls(code, description)


class HTTPError(NSQError):
    """An NSQ HTTP endpoint answered with a non-2xx status.

    ``status`` is the HTTP status and ``code`` NSQ's message (``MSG_TOO_BIG``,
    ``INVALID_TOPIC``, …) taken from the ``{"message": ...}`` body, or the raw text.
    """

    def __init__(self, status: int, code: str, url: str = "") -> None:
        super().__init__(f"HTTP {status} {code}" + (f" from {url}" if url else ""))
        self.status = status
        self.code = code
        self.url = url


class ClientClosedError(NSQError):
    """The producer or consumer was closed; it takes no more work."""
