"""What every process of an nsqd node shares about the node: its data-path lock, how a queue
gets its shared-memory log and its disk backend, which leftover segments are worth
recovering, and the static part of ``/info``.

The node's lifecycle itself is split between the supervisor (``supervisor/arbiter.py``: lock,
bind, spawn, shut down in phases) and its shard workers (``shard/worker.py``: serve one
shard's topics, connections and HTTP).
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
from typing import Any

from pynsqd.options import UsageError
from pynsqd.shard.broker import QueueFactory
from pynsqd.shard.config import NsqdOptions
from pynsqd.shard.queue import Backend, MessageQueue, segment_queue
from pynsqd.shm.diskqueue import DiskQueue
from pynsqd.shm.sizing import Grower, Host, HostRoom, LogSizing, plan
from pynsqd.wire.message import MIN_MESSAGE_SIZE
from pynsqd.wire.names import is_ephemeral, is_valid_name

log = logging.getLogger("pynsqd.shard")


def lock_data_path(path: str) -> int:
    """``flock`` the data path (one node per path); returns the fd to close on exit.
    Raises ``UsageError``."""
    try:
        os.makedirs(path, exist_ok=True)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except (FileExistsError, NotADirectoryError):  # a file, or a file on the way to it
        raise UsageError(f"failed to open --data-path={path}: not a directory") from None
    except OSError as exc:
        raise UsageError(f"failed to open --data-path={path}: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise UsageError(f"--data-path={path} in use (possibly by another instance of nsqd)") from None
    return fd


def make_backend(opts: NsqdOptions, queue_name: str) -> DiskQueue:
    """The disk queue behind a durable topic or channel."""
    return DiskQueue(queue_name, opts.data_dir, max_bytes_per_file=opts.max_bytes_per_file,
                     min_msg_size=MIN_MESSAGE_SIZE, max_msg_size=opts.max_msg_size + MIN_MESSAGE_SIZE,
                     sync_every=opts.sync_every, sync_timeout_ns=opts.sync_timeout, logger=log)


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


def recoverable(kind: str, name: str, records: int) -> bool:
    """A leftover segment worth recreating its queue for: a durable topic or channel of
    valid name whose log still holds records (it was made too late to reach nsqd.dat)."""
    parts = name.split(":")
    return (records > 0 and kind in ("topic", "channel") and len(parts) == (1 if kind == "topic" else 2)
            and all(is_valid_name(p) and not is_ephemeral(p) for p in parts))


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
