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


def go_quote(raw: bytes) -> str:
    """``raw`` as Go's ``%q`` (``strconv.Quote``) prints it, for error texts that quote a name.

    Printable characters stay; ``"`` and ``\\`` are backslashed; ``\\a \\b \\f \\n \\r \\t \\v``
    by name; other control bytes and invalid UTF-8 bytes as ``\\xNN``; other unprintable
    characters as ``\\uNNNN`` or ``\\UNNNNNNNN``.
    """
    out = ['"']
    for ch in raw.decode("utf-8", "surrogateescape"):
        code = ord(ch)
        if 0xDC80 <= code <= 0xDCFF:  # a byte that is not valid UTF-8
            out.append(f"\\x{code - 0xDC00:02x}")
        elif ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif ch.isprintable():  # the same classes as Go's unicode.IsPrint
            out.append(ch)
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


_GO_ESCAPES = {
    '"': '\\"', "\\": "\\\\", "\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n",
    "\r": "\\r", "\t": "\\t", "\v": "\\v",
}


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
        """The error frame's payload: ``"<CODE> <description>"``.

        A description may carry bytes the client sent that are not UTF-8 (``invalid command
        <NAME>`` quotes them raw, as nsqd does); they are held as ``surrogateescape``
        characters, so encode with ``encode_text``.
        """
        return f"{self.code} {self.description}" if self.description else self.code

    def encode_text(self) -> bytes:
        """``text`` as the exact bytes nsqd would send."""
        return self.text.encode("utf-8", "surrogateescape")

    def __repr__(self) -> str:
        return f"ProtocolError({self.code!r}, {self.description!r})"
