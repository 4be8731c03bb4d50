"""pynsqd: NSQ, the realtime distributed messaging platform, as a multiprocess Python broker.

Subpackages, each owning one part of the product:

- ``pynsqd.wire``: the sans-IO codec of NSQ's TCP protocol (commands, frames, messages),
  shared by the server, the client library and the fuzz tests.
- ``pynsqd.shard``: an nsqd shard: topics, channels, in-flight and deferred messages, and
  the asyncio protocol that serves client connections.
- ``pynsqd.supervisor``: the ``nsqd-supervisor`` / ``nsqd`` command and the process tree.
- ``pynsqd.shm``: message storage outside the process heap (shared memory and disk spill).
- ``pynsqd.lookupd``: the ``nsqlookupd`` discovery daemon.
"""

from __future__ import annotations

__version__ = "0.1.0"

#: The NSQ release whose protocols and APIs pynsqd speaks; reported wherever NSQ reports
#: its own version (IDENTIFY, /info, /stats), so tools that compare versions keep working.
NSQ_VERSION = "1.3.0"
