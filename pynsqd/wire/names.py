"""Topic and channel names: ``^[.a-zA-Z0-9_-]+(#ephemeral)?$``, 1 to 64 characters.

The same rule holds for both; the ``#ephemeral`` suffix counts towards the 64.
"""

from __future__ import annotations

import re

EPHEMERAL_SUFFIX = "#ephemeral"
MAX_NAME_LENGTH = 64
_VALID = re.compile(r"[.a-zA-Z0-9_-]+(?:#ephemeral)?")


def is_valid_name(name: str) -> bool:
    """True when ``name`` is a valid topic or channel name."""
    return 0 < len(name) <= MAX_NAME_LENGTH and _VALID.fullmatch(name) is not None


is_valid_topic_name = is_valid_name
is_valid_channel_name = is_valid_name


def is_ephemeral(name: str) -> bool:
    """True for names ending in ``#ephemeral``: never written to disk, gone with their users."""
    return name.endswith(EPHEMERAL_SUFFIX)


_GO_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t",
               "\v": "\\v", "\\": "\\\\", '"': '\\"'}


def go_quote(text: str) -> str:
    """``text`` quoted as Go's ``%q`` quotes it (nsqd uses ``%q`` in its name errors)."""
    out = ['"']
    for ch in text:
        if ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif ch.isprintable():
            out.append(ch)
        elif ord(ch) < 0x100:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) < 0x10000:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    out.append('"')
    return "".join(out)
