"""Where the shared-memory queues can run: Linux on x86-64, checked before nsqd starts.

The rings (``shm/ring.py``) publish an index with a plain aligned 8-byte store after the
bytes it covers, and the other process reads the index before those bytes. x86-64 keeps
stores in order with stores and loads with loads (TSO), so that is enough there; ARM,
POWER and RISC-V may reorder either side and would need barriers that Python cannot issue
around a memoryview store. The segments, the control sockets and the wake-ups are Linux's
(``/dev/shm``, ``SOCK_SEQPACKET``, ``eventfd``, ``MADV_REMOVE``). So nsqd refuses to start
anywhere else, with one line, rather than lose or corrupt messages there.
"""

from __future__ import annotations

import platform

X86_64 = ("x86_64", "amd64", "x64")


def refusal(system: str, machine: str) -> str | None:
    """Why nsqd cannot run on ``system``/``machine`` (``platform.system()``,
    ``platform.machine()``), or None where it can."""
    if system != "Linux":
        return (f"pynsqd's nsqd runs on Linux only (this is {system or 'an unknown system'}): its queues "
                "live in POSIX shared memory under /dev/shm")
    if machine.lower() not in X86_64:
        return (f"pynsqd's nsqd runs on x86-64 only (this CPU is {machine or 'unknown'}): its "
                "shared-memory rings rely on x86-64 store ordering")
    return None


def this_host_refusal() -> str | None:
    return refusal(platform.system(), platform.machine())
