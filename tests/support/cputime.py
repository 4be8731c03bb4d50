"""The CPU time a node's processes use, read from ``/proc`` (psutil): the measure of the
work a node does before it serves, which a loaded machine does not stretch (a process that
waits for a core accrues none), where the seconds on the wall clock grow with the load."""

from __future__ import annotations

import psutil

# (pid, start time) → user + system CPU seconds of that process (its threads included,
# not its children's); the start time tells a new process from an old one with the same pid
Snapshot = dict[tuple[int, float], float]


def tree_cpu(root_pid: int) -> Snapshot:
    """The CPU seconds of ``root_pid`` and of every process below it, now."""
    try:
        root = psutil.Process(root_pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return {}
    snapshot: Snapshot = {}
    for proc in procs:
        try:
            times = proc.cpu_times()
            snapshot[(proc.pid, proc.create_time())] = times.user + times.system
        except psutil.NoSuchProcess:
            continue
    return snapshot


def spent_since(before: Snapshot, after: Snapshot) -> float:
    """The CPU seconds the processes alive at ``after`` used since ``before``: the whole of
    it for a process started in between (a process gone by ``after`` is not counted)."""
    return sum(seconds - before.get(key, 0.0) for key, seconds in after.items())
