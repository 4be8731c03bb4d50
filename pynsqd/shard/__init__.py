"""An nsqd shard: the topics it owns, their channels, and the clients it serves.

- ``worker``: the shard process, started by the supervisor (``pynsqd.node`` is their contract).
- ``broker`` / ``topic`` / ``channel``: the queues, fan-out, in-flight and deferred bookkeeping.
- ``inflight``: pure timing state (in-flight deadlines, deferred due times).
- ``protocol`` / ``commands`` / ``consumer``: one TCP connection speaking protocol V2 (its
  I/O, its commands and session state, and what a channel needs from it).
- ``crossshard`` / ``relay``: publishing to and subscribing at topics another shard owns;
  ``inbound`` / ``unit``: storing what other shards publish to this one's topics, in order
  and once.
- ``http`` / ``nodehttp``: nsqd's HTTP API, and where each request of it runs.
"""
