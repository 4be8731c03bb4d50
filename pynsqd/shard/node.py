"""What a shard builds for the node: its broker, whose queues' logs live in the node's
shared-memory segments with disk queues behind them, and the static part of ``/info``. What
the supervisor shares with it (data-path lock, disk backends, leftover segments) is in
``node/datapath.py``."""

from __future__ import annotations

import socket
from typing import Any

from pynsqd.node.config import NsqdOptions
from pynsqd.node.datapath import make_backend
from pynsqd.shard.backend import Backend
from pynsqd.shard.broker import NO_HOOKS, Broker, BrokerHooks, QueueFactory, Router
from pynsqd.shard.queue import MessageQueue, segment_queue
from pynsqd.shm.sizing import Grower, Host, HostRoom, LogSizing, plan


def queue_factory(opts: NsqdOptions, sizing: LogSizing | None = None) -> QueueFactory:
    """Queues whose logs live in the node's shared-memory segments (``shm/store.py``): a
    queue whose segment a previous process left is attached and marked for recovery. Logs
    start at ``sizing.initial`` bytes and may grow to its ceiling (``shm/sizing.py``; the
    supervisor plans it once for the node, else it is planned here)."""
    sizing = sizing or plan(opts.mem_queue_bytes, opts.max_msg_size, Host.now())
    room = HostRoom(opts.data_dir)

    def make(kind: str, name: str, backend: Backend) -> MessageQueue:
        queue = segment_queue(opts.data_dir, opts.mem_queue_size, sizing.initial, kind, name, backend)
        if queue.segment is not None and sizing.ceiling > queue.log.capacity:
            queue.grow = Grower(queue.segment, sizing.ceiling, room, f"{kind.upper()}({name})")
        return queue
    return make


def make_broker(opts: NsqdOptions, sizing: LogSizing | None = None, *, shard: int = 0, shards: int = 1,
                router: Router | None = None, hooks: BrokerHooks = NO_HOOKS,
                start_ns: int | None = None) -> Broker:
    """Shard ``shard``'s broker: its queues as ``queue_factory`` makes them, each durable one
    with its disk queue (``node/datapath.make_backend``)."""
    return Broker(opts, queue_factory(opts, sizing), lambda name: make_backend(opts, name), shard=shard,
                  shards=shards, router=router, hooks=hooks, start_ns=start_ns)


def node_info(opts: NsqdOptions, tcp_port: int, http_port: int, start_time: int) -> dict[str, Any]:
    """The static part of ``/info`` (every shard answers the same)."""
    return {
        "broadcast_address": opts.broadcast_address,
        "hostname": socket.gethostname(),
        "http_port": http_port,
        "tcp_port": tcp_port,
        "start_time": start_time,
        "max_heartbeat_interval": opts.max_heartbeat_interval,
        "max_output_buffer_size": opts.max_output_buffer_size,
        "max_output_buffer_timeout": opts.max_output_buffer_timeout,
        "max_deflate_level": opts.max_deflate_level,
    }
