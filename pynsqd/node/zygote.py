"""The zygote: a process forked from ``nsqd`` at its start that imports the shards' code
while the supervisor sets up, then forks the first boot's shards.

Start-up is mostly imports: a fresh interpreter that imports asyncio, uvloop and a shard's
modules costs more CPU than the rest of a shard's boot, and the supervisor has its own to
pay before it can start anything. So ``nsqd``'s first act, before it imports its own modules
or reads its flags (``supervisor/cli.py``), is ``start``: a ``fork`` (no thread, no event
loop exists yet) whose child imports the worker module on the other core and says ``ready``.
It is a copy of the supervisor's interpreter, so it imports from the same ``sys.path``
exactly the code the supervisor would (``boot.py``'s safe-path rule holds without ``-P``).

The supervisor then asks for one shard at a time (``Zygote.fork``): a ``BootConfig`` as
JSON and its descriptors (``SCM_RIGHTS``) on a ``SOCK_SEQPACKET`` pair. The zygote forks an
intermediate process that forks the shard, sends the shard's pid back and exits; the
supervisor is a child subreaper (``PR_SET_CHILD_SUBREAPER``), so the kernel makes it the
shard's parent at once, and the shard waits for that (``_adopted``) before it runs. From
there a forked shard is like a spawned one: the supervisor reaps it, its
``PR_SET_PDEATHSIG`` names the supervisor, an upgrade's ``execve`` keeps it. Only its command
line and environment are the supervisor's: its name (``/proc/PID/comm``, what ``top`` shows)
says ``nsqd-shard-N``, as a spawned shard's does.

The zygote serves the first boot only: the supervisor closes its socket once every shard of
that boot is started, and it ends (``close``); it is killed if the supervisor ends first (a
bad flag, ``--version``). A shard started later (a crash's restart, a reload's replacement)
is a fresh interpreter (``boot.worker_command``), so it runs the code installed then. A zygote that is not ready
within ``READY_TIMEOUT`` or does not answer is killed and its shards spawned instead; a shard
it forked whose pid never reached the supervisor finds its control socket closed and exits.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import select
import signal
import socket

TYPE_CHECKING = False  # not ``typing``'s: nothing is imported before the fork that need not be
if TYPE_CHECKING:
    from types import ModuleType
    from typing import NoReturn

WORKER_MODULE = "pynsqd.shard.worker"  # its ``forked(config, fds)`` runs a shard
READY = b"ready"
READY_TIMEOUT = 30.0  # seconds the supervisor waits for the zygote's imports
FORK_TIMEOUT = 5.0  # seconds for one shard's pid
ADOPT_TIMEOUT = 5.0  # seconds a forked shard waits to become the supervisor's child
CLOSE_TIMEOUT = 1.0  # seconds a serving zygote has to end once told to
MAX_CONFIG = 1 << 20  # bytes of one request's JSON
MAX_FDS = 253  # the kernel's SCM_MAX_FD: a node of more shards spawns them (``fork`` fails)
PR_SET_CHILD_SUBREAPER = 36


class Zygote:
    """The supervisor's side: the zygote's pid and socket."""

    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid = pid
        self.sock = sock
        self.serving = False  # it said ``ready``: it ends by itself once its socket is closed

    @classmethod
    def start(cls) -> Zygote:
        """Fork the zygote (in the child, never returns); make this process a subreaper."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        supervisor = os.getpid()
        pid = os.fork()
        if pid == 0:
            ours.close()
            _serve(theirs, supervisor)
        theirs.close()
        import ctypes  # not before the fork: the zygote has no use for it yet
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        return cls(pid, ours)

    def ready(self, timeout: float = READY_TIMEOUT) -> bool:
        """Wait for the zygote's imports; False: it failed or is too slow (then killed)."""
        self.sock.settimeout(timeout)
        try:
            self.serving = self.sock.recv(len(READY)) == READY
        except OSError:
            pass
        if not self.serving:
            self.close()
        return self.serving

    def fork(self, config: str, fds: list[int]) -> int | None:
        """A shard process started with ``config`` (a ``BootConfig``'s JSON) and ``fds`` (its
        ``inherited``): its pid, already this process's child; None (the zygote is then
        killed) if it did not answer."""
        if self.pid == 0:
            return None
        self.sock.settimeout(FORK_TIMEOUT)
        try:
            socket.send_fds(self.sock, [config.encode()], fds)
            return int(self.sock.recv(32))
        except (OSError, ValueError):  # gone (an empty answer), or too slow
            self.serving = False
            self.close()
            return None

    def close(self) -> None:
        """End and reap the zygote. One that is serving ends by itself once it has reaped
        its last intermediate process (so no shard is left on the way to being adopted); one
        that is not, or does not end within ``CLOSE_TIMEOUT``, is killed."""
        self.sock.close()
        if not self.pid:
            return
        if not self.serving or not _ends_within(self.pid, CLOSE_TIMEOUT):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):  # reaped already
            os.waitpid(self.pid, 0)
        self.pid = 0


def _serve(sock: socket.socket, supervisor: int) -> NoReturn:
    """The zygote: import the worker, then fork a shard per request until the supervisor
    closes its end. Ctrl-C (sent to the process group) is the supervisor's to handle."""
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGUSR2):
        signal.signal(signum, signal.SIG_IGN)
    try:
        worker = importlib.import_module(WORKER_MODULE)
        gc.freeze()  # the collector is off (``cli.main``); a shard turns it on (``_fork_shard``)
        sock.send(READY)
    except BaseException:  # the supervisor spawns the shards instead, which report it
        os._exit(1)
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, MAX_CONFIG, MAX_FDS)
        except OSError:
            os._exit(1)
        if not data:  # the supervisor closed its end
            os._exit(0)
        intermediate = os.fork()
        if intermediate == 0:
            _fork_shard(sock, worker, supervisor, data, fds)
        for fd in fds:
            os.close(fd)
        os.waitpid(intermediate, 0)


def _fork_shard(sock: socket.socket, worker: ModuleType, supervisor: int, data: bytes, fds: list[int]) -> None:
    """In the intermediate process: fork the shard, tell the supervisor its pid, exit (the
    shard is orphaned and so adopted by the supervisor). The shard returns from here only
    by raising ``SystemExit`` with its exit status, which ends the interpreter as a spawned
    worker's ``main`` does (no frame between here and ``nsqd``'s entry point catches it)."""
    pid = os.fork()
    if pid == 0:
        gc.enable()  # its collections skip what the zygote froze: those pages stay shared
        sock.close()
        _adopted(supervisor)
        raise SystemExit(worker.forked(data.decode(), fds))
    with contextlib.suppress(OSError):
        sock.send(str(pid).encode())
    os._exit(0)


def _adopted(parent: int) -> None:
    """Wait until the intermediate process has exited and ``parent`` is this one's parent
    (``worker.die_with_parent`` then checks it)."""
    ppid = os.getppid()
    if ppid != parent:
        _ends_within(ppid, ADOPT_TIMEOUT)


def _ends_within(pid: int, timeout: float) -> bool:
    """Whether process ``pid`` has ended (or is gone) within ``timeout`` seconds (False, too,
    without pidfds)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)
