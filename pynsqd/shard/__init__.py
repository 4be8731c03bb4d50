"""An nsqd shard: the topics it owns, their channels, and the clients it serves.

- ``config``: nsqd's flags.
- ``topic`` / ``channel``: the queues, fan-out, in-flight and deferred bookkeeping.
- ``inflight``: pure timing state (in-flight deadlines, deferred due times).
- ``protocol``: the asyncio adapter that runs protocol V2 for one TCP connection.
- ``node``: the lifecycle object of a running shard (bind, serve, exit).
"""
