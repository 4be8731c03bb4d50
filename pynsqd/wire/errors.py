"""Protocol errors as NSQ splits them: a code, a description, and whether the connection ends.

NSQ (``internal/protocol/errors.go``, ``nsqd/protocol_v2.go``) answers every bad command with
an error frame ``"<CODE> <description>"``. Only three codes leave the connection open, the
ones that say a message was not in flight: ``E_FIN_FAILED``, ``E_REQ_FAILED`` and
``E_TOUCH_FAILED``. Everything else is fatal: the frame is sent, then the connection closes.
"""

from __future__ import annotations

NON_FATAL_CODES = frozenset({"E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED"})

# Every code nsqd sends on the wire, for tests and documentation.
CODES = frozenset({
    "E_INVALID", "E_BAD_PROTOCOL", "E_BAD_BODY", "E_BAD_TOPIC", "E_BAD_CHANNEL",
    "E_BAD_MESSAGE", "E_PUB_FAILED", "E_MPUB_FAILED", "E_DPUB_FAILED", "E_FIN_FAILED",
    "E_REQ_FAILED", "E_TOUCH_FAILED", "E_SUB_FAILED", "E_IDENTIFY_FAILED", "E_AUTH_FIRST",
    "E_AUTH_FAILED", "E_AUTH_DISABLED", "E_AUTH_ERROR", "E_UNAUTHORIZED",
})


class ProtocolError(Exception):
    """A protocol violation to report to the peer with NSQ's code and description.

    ``fatal`` tells the server to close the connection after sending the error frame.
    """

    def __init__(self, code: str, description: str = "") -> None:
        super().__init__(f"{code} {description}".rstrip())
        self.code = code
        self.description = description
        self.fatal = code not in NON_FATAL_CODES

    @property
    def text(self) -> str:
        """The error frame's payload: ``"<CODE> <description>"``."""
        return f"{self.code} {self.description}" if self.description else self.code

    def __repr__(self) -> str:
        return f"ProtocolError({self.code!r}, {self.description!r})"
