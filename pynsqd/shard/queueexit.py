"""A queue shutting down. A durable queue (one with ``files``, its sidecar and journal:
``deferredfiles.py``) leaves nothing in shared memory on a clean ``close`` (``persist``,
step 3 of docs/architecture.md's "Clean shutdown"): the segment is unlinked only once its
records are on disk, so a kill -9 in between gives duplicates, never loss, and a reboot
after a clean stop loses nothing. ``hand_over`` leaves the segment as it is for a
replacement process."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from pynsqd.shard.deferredfiles import DeferredFiles
from pynsqd.shard.queuestate import QueueState

logger = logging.getLogger("pynsqd.shard")

PERSIST_BATCH = 4096  # records per backend write when a queue moves to disk on exit


def close(queue: QueueState, delete: bool = False, deferred: Sequence[tuple[int, bytes]] = ()) -> None:
    """Shut down. ``delete`` removes everything (disk files, sidecar, segment). Otherwise a
    durable queue moves every live record to disk (see the module doc) and removes its
    segment; a queue without a sidecar detaches and its segment stays for the next
    process. ``deferred`` are [(due wall ns, message)] the owner holds outside the log
    (no room in shared memory): they go to the sidecar, or ready to the backend."""
    unlink = delete
    if delete:
        queue.scan = None
        queue.backend.delete()  # its files include the sidecar (``all_files_pattern``)
    elif queue.files is not None and queue.segment is not None:
        unlink = persist(queue, queue.files, deferred)
    else:
        if deferred:
            try:
                queue.backend.put_many([message for _, message in deferred])
                if queue.files is not None:
                    queue.files.strike([message for _, message in deferred])
            except Exception:
                logger.exception("%d deferred messages lost on exit", len(deferred))
        queue.backend.close()
    queue.log.close()
    if queue.segment is not None:
        if unlink:
            queue.segment.unlink()
        queue.segment.close()


def hand_over(queue: QueueState) -> None:
    """Let another process of this host carry on with this queue (a shard's replacement,
    ``shard/transfer.py``): the backend's files are closed with their metadata written,
    the segment is left as it is (in-flight and deferred records in place; the next
    process recovers it), the journal stays."""
    try:
        queue.backend.release()
    except Exception:  # the next process repairs from the files, as after a crash
        logger.exception("failed to hand %r over cleanly", queue.backend)
    queue.log.close()
    if queue.segment is not None:
        queue.segment.close()


def persist(queue: QueueState, files: DeferredFiles, held: Sequence[tuple[int, bytes]]) -> bool:
    """Write every live record to disk; True once all of it is durable. On failure the
    segment keeps them (and the next process may see some twice)."""
    try:
        ready, deferred = queue.log.live_records()  # in flight or not, recovered or not
        if queue.scan is not None:  # the log proved whole: the backend resumes past its records
            queue.refill.skip_to(queue.scan.resume)
            queue.scan = None
        for start in range(0, len(ready), PERSIST_BATCH):
            queue.backend.put_many(ready[start:start + PERSIST_BATCH])
        queue.backend.close()  # syncs the data and persists the metadata
        files.save(deferred + list(held))
    except Exception:
        logger.exception("failed to move %r to disk; its messages stay in shared memory", queue.backend)
        try:
            queue.backend.close()
        except Exception as exc:  # the same failure, most likely; the segment keeps the messages
            logger.error("failed to close %r - %s", queue.backend, exc)
        return False
    return True
