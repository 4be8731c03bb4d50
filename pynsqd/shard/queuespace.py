"""Room in a queue's log. When the log is out of room while most of it is DONE behind a
long-lived record at the front, ``make_room`` moves that record to the write end
(``on_move`` tells the owner, which holds positions of in-flight and deferred messages);
``make_larger`` grows the log within its ceiling (``pynsqd.shm.sizing``)."""

from __future__ import annotations

from pynsqd.shard.queuestate import QueueState
from pynsqd.shm.log import DONE, READY


def make_room(queue: QueueState, frame: int) -> bool:
    """Release DONE records, then move live ones that block the front; True if a frame
    of ``frame`` bytes may fit now."""
    log = queue.log
    log.release(queue.delivery_end())
    queue.done_since_release = 0
    moved = 0
    while (log.free_bytes < frame + 8 and queue.scan is None and queue.live < len(log) // 2
           and moved < 4096):
        front = log.front()
        if front is None:
            break
        pos, state, size = front
        if state == DONE:
            log.release()
            continue
        if log.free_bytes < 2 * size:
            break
        state, due, message = log.message_at(pos)
        new = log.append(message, state, due)
        if new is None:
            break
        log.set_state(pos, DONE)
        if state == READY:
            queue.again.pop(pos, None)  # the cursor finds the new copy
        elif queue.on_move is not None:
            queue.on_move(pos, new, state, message)
        moved += 1
        log.release()
    if queue.cursor < log.read_index:
        queue.cursor = log.read_index
    return log.free_bytes >= frame


def make_larger(queue: QueueState, need: int) -> bool:
    """Make the log larger so ``need`` more bytes fit (``grow``); True if they do now."""
    if queue.grow is None:
        return False
    shift = queue.grow(queue.log, need)
    if shift is None:
        return False
    queue.cursor -= shift  # the log's indices moved back by ``shift``; positions did not
    queue.shifted += shift
    if queue.scan is not None:
        queue.scan.shift(shift)
    return queue.log.free_bytes >= need
