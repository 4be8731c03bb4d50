"""The sans-IO codec of NSQ's TCP protocol V2: bytes in, events out; events in, bytes out.

No sockets, event loop or clock live here, so the server (``pynsqd.shard``), the client
library, the benchmarks and the fuzz tests all drive the same code.

- ``commands``: the client→server direction. ``CommandParser`` turns a byte stream into
  commands, enforcing the size limits while it parses; ``encode_*`` builds commands.
- ``frames``: the server→client direction. ``encode_frame`` and friends build frames;
  ``FrameParser`` turns a byte stream back into frames.
- ``message``: the message encoding shared by frames and disk, and message-id generation.
- ``names``: topic and channel name rules.
- ``lookup``: nsqlookupd's TCP protocol V1: the server's parser and nsqd's client codec.
- ``errors``: ``ProtocolError``, carrying NSQ's ``E_*`` code and whether it is fatal.
"""

from __future__ import annotations

from pynsqd.wire.errors import ProtocolError

MAGIC_V1 = b"  V1"
MAGIC_V2 = b"  V2"

__all__ = ["MAGIC_V1", "MAGIC_V2", "ProtocolError"]
