"""What every process of a node knows about its data path: the lock that makes it one
node's, the disk queue behind a durable topic or channel, and which leftover shared-memory
segments are worth recovering."""

from __future__ import annotations

import fcntl
import logging
import os

from pynsqd.node.config import NsqdOptions
from pynsqd.options import UsageError
from pynsqd.shm.diskqueue import DiskQueue
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


def recoverable(kind: str, name: str, records: int) -> bool:
    """A leftover segment worth recreating its queue for: a durable topic or channel of
    valid name whose log still holds records (it was made too late to reach nsqd.dat)."""
    parts = name.split(":")
    return (records > 0 and kind in ("topic", "channel") and len(parts) == (1 if kind == "topic" else 2)
            and all(is_valid_name(p) and not is_ephemeral(p) for p in parts))
