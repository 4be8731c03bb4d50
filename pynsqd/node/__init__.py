"""What every process of an nsqd node shares: the contract between the supervisor and its
shards, imported by both (``pynsqd.node`` ← ``pynsqd.shard``, ``pynsqd.supervisor``).

- ``config``: nsqd's flags, resolved once by the supervisor.
- ``boot``: what a shard worker is started with (``BootConfig``).
- ``messages`` / ``control``: the typed control messages and the channel that carries them.
- ``heartbeat``: the page a shard beats into and the supervisor watches.
- ``metadata``, ``placement``, ``datapath``, ``rings``, ``crossrecord``: ``nsqd.dat``, which
  shard owns a topic, the data-path lock and disk backends, the inbound rings and their records.
- ``identify``, ``tls``: IDENTIFY negotiation and the TLS context, used by the supervisor
  (greeting a connection, checking the files) and by the shards (serving it).
"""
