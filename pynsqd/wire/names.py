"""Topic and channel names: ``^[.a-zA-Z0-9_-]+(#ephemeral)?$``, 1 to 64 characters.

The same rule holds for both; the ``#ephemeral`` suffix counts towards the 64.
"""

from __future__ import annotations

import re

EPHEMERAL_SUFFIX = "#ephemeral"
MAX_NAME_LENGTH = 64
_VALID = re.compile(r"[.a-zA-Z0-9_-]+(?:#ephemeral)?")


_VALID_BYTES = re.compile(_VALID.pattern.encode())


def is_valid_name(name: str) -> bool:
    """True when ``name`` is a valid topic or channel name."""
    return 0 < len(name) <= MAX_NAME_LENGTH and _VALID.fullmatch(name) is not None


def is_valid_name_bytes(name: bytes) -> bool:
    """``is_valid_name`` of a name as it came off the wire (the rule is ASCII only, so bytes
    that are not are invalid either way)."""
    return 0 < len(name) <= MAX_NAME_LENGTH and _VALID_BYTES.fullmatch(name) is not None


is_valid_topic_name = is_valid_name
is_valid_channel_name = is_valid_name


def is_ephemeral(name: str) -> bool:
    """True for names ending in ``#ephemeral``: never written to disk, gone with their users."""
    return name.endswith(EPHEMERAL_SUFFIX)

