"""What every process of an nsqd node shares about the node: its data-path lock, how a queue
gets its disk backend, and the static part of ``/info``.

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
from pynsqd.shard.config import NsqdOptions
from pynsqd.shm.diskqueue import DiskQueue
from pynsqd.wire.message import MIN_MESSAGE_SIZE

log = logging.getLogger("pynsqd.shard")


def lock_data_path(path: str) -> int:
    """``flock`` the data path (one node per path); returns the fd to close on exit.
    Raises ``UsageError``."""
    try:
        os.makedirs(path, exist_ok=True)
        fd = os.open(path, os.O_RDONLY)
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
