"""pynsqd: NSQ, the realtime distributed messaging platform, as a multiprocess Python broker.

Subpackages, each owning one part of the product:

- ``pynsqd.wire``: the sans-IO codec of NSQ's TCP protocol (commands, frames, messages),
  shared by the server, the client library and the fuzz tests.
- ``pynsqd.shm``: message storage outside the process heap: shared-memory segments, rings
  and logs; the disk queue, sidecar and journal files.
- ``pynsqd.node``: what the supervisor and the shards of one nsqd node share: options,
  ``nsqd.dat``, placement, the data path, the inbound rings, and the typed control protocol.
- ``pynsqd.shard``: an nsqd shard: topics, channels, in-flight and deferred messages, and
  the asyncio protocol that serves client connections.
- ``pynsqd.supervisor``: the ``nsqd-supervisor`` / ``nsqd`` command and the process tree; it
  never imports ``pynsqd.shard``.
- ``pynsqd.lookupd``: the ``nsqlookupd`` discovery daemon.
- ``pynsqd.admin``: the ``nsqadmin`` web UI, which knows the cluster only through NSQ's
  public HTTP APIs.
- ``pynsqd.client``: the asyncio client library (producer, consumer, batch consumer).
- ``pynsqd.tools``: the utilities built on the client (nsq_tail, nsq_to_file, nsq_to_http,
  nsq_to_nsq, to_nsq, nsq_stat).
- ``pynsqd.spark``: the optional ``nsq`` PySpark data source, sink and pipeline command.

Beside them, single modules shared by the daemons: the HTTP server (``httpserver.py``,
``httpconn.py``, ``httpparse.py``), signals, logging, back-off and the daemon runner.
"""

from __future__ import annotations

__version__ = "0.1.0"

#: The NSQ release whose protocols and APIs pynsqd speaks; reported wherever NSQ reports
#: its own version (IDENTIFY, /info, /stats), so tools that compare versions keep working.
NSQ_VERSION = "1.3.0"
