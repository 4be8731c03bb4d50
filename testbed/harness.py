"""Real daemons for tests: start on port 0, learn the bound addresses, stop by pid.

Every daemon logs ``<NAME>: listening on <host>:<port>`` for each listener; ``Daemon``
reads its output on a thread, waits (with a deadline) until the listeners it expects are
announced, and exposes them. Each daemon runs in its own session so ``stop`` can signal the
whole process group: TERM, wait, then KILL. All waits derive from ``TIMEOUT_SCALE``
(environment ``PYNSQD_TEST_TIMEOUT_SCALE``) so a slow machine can stretch them at once.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

TIMEOUT_SCALE = float(os.environ.get("PYNSQD_TEST_TIMEOUT_SCALE", "1"))
_LISTEN = re.compile(r"(\w+): listening on (\S+):(\d+)")
STARTED: list[Daemon] = []  # every daemon started since the test runner last cleared it


def scaled(seconds: float) -> float:
    return seconds * TIMEOUT_SCALE


def wait_for(predicate: Callable[[], Any], timeout: float = 5.0, interval: float = 0.005,
             what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns a truthy value; fail after ``timeout`` (scaled)."""
    end = time.monotonic() + scaled(timeout)
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {scaled(timeout):.1f}s waiting for {what}")
        time.sleep(interval)


class Daemon:
    """One daemon process (``python -m <module> <args>``) started for a test."""

    def __init__(self, module: str, args: Sequence[str], listeners: Sequence[str] = ("TCP", "HTTP"),
                 env: dict[str, str] | None = None, cwd: str | None = None,
                 limits: dict[int, tuple[int, int]] | None = None, wrapper: Sequence[str] = (),
                 python_flags: Sequence[str] = ()) -> None:
        self.module = module
        self.wrapper = list(wrapper)  # a command to run the daemon under (e.g. strace -f)
        self.python_flags = list(python_flags)  # the interpreter's own (e.g. -P)
        self.args = list(args)
        self.listeners = tuple(listeners)
        self.env = env
        self.cwd = cwd
        self.limits = limits or {}  # resource.RLIMIT_* → (soft, hard), set in the child
        self.proc: subprocess.Popen[bytes] | None = None
        self.lines: list[str] = []
        self.addresses: dict[str, tuple[str, int]] = {}
        self._cond = threading.Condition()
        self._reader: threading.Thread | None = None

    # --- lifecycle ------------------------------------------------------------------------
    def start(self, timeout: float = 15.0) -> Daemon:
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        if self.env:
            env.update(self.env)
        self.lines = []
        self.addresses = {}
        self.proc = subprocess.Popen(
            [*self.wrapper, sys.executable, *self.python_flags, "-m", self.module, *self.args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, cwd=self.cwd, start_new_session=True,
            preexec_fn=self._set_limits if self.limits else None,
        )
        STARTED.append(self)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        end = time.monotonic() + scaled(timeout)
        with self._cond:
            while not all(name in self.addresses for name in self.listeners):
                if self.proc.poll() is not None:
                    self._cond.release()
                    try:
                        self.wait()
                    finally:
                        self._cond.acquire()
                    raise RuntimeError(f"{self.module} exited with {self.proc.returncode}:\n{self.output}")
                left = end - time.monotonic()
                if left <= 0:
                    self.kill()
                    raise RuntimeError(f"{self.module} did not start in time:\n{self.output}")
                self._cond.wait(min(left, 0.1))
        return self

    def _set_limits(self) -> None:
        for which, value in self.limits.items():
            resource.setrlimit(which, value)

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            with self._cond:
                self.lines.append(line)
                m = _LISTEN.search(line)
                if m and m.group(1) not in self.addresses:
                    self.addresses[m.group(1)] = (m.group(2), int(m.group(3)))
                self._cond.notify_all()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def output(self) -> str:
        with self._cond:
            return "\n".join(self.lines)

    def signal(self, sig: int) -> None:
        if self.running:
            os.kill(self.pid, sig)

    def wait(self, timeout: float = 10.0) -> int:
        assert self.proc is not None
        code = self.proc.wait(scaled(timeout))
        self._release()
        return code

    def _release(self) -> None:
        """After exit: let the reader finish the output, then close the pipe."""
        assert self.proc is not None
        if self._reader is not None:
            self._reader.join(scaled(5))
        if self.proc.stdout is not None and (self._reader is None or not self._reader.is_alive()):
            self.proc.stdout.close()

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, wait, then SIGKILL the process group. Returns the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                return self.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self._kill_group()
        return self.wait(timeout)

    def kill(self) -> None:
        """SIGKILL the whole process group now (a crash)."""
        if self.proc is not None:
            self._kill_group()
            self.wait()

    def _kill_group(self) -> None:
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    # --- addresses ------------------------------------------------------------------------
    def address(self, name: str) -> tuple[str, int]:
        return self.addresses[name]

    @property
    def tcp(self) -> tuple[str, int]:
        return self.addresses["TCP"]

    @property
    def http(self) -> tuple[str, int]:
        return self.addresses["HTTP"]

    @property
    def http_url(self) -> str:
        host, port = self.http
        return f"http://{host}:{port}"

    def wait_for_log(self, pattern: str, timeout: float = 15.0) -> str:
        """Wait for a line of the output matching ``pattern``; a generous default: the wait ends
        at the line, and a loaded machine can take seconds to print it."""
        rx = re.compile(pattern)

        def found() -> str | None:
            with self._cond:
                return next((line for line in self.lines if rx.search(line)), None)
        return str(wait_for(found, timeout, what=f"log line matching {pattern!r}"))


def connect(address: tuple[str, int], timeout: float = 5.0) -> socket.socket:
    sock = socket.create_connection(address, timeout=scaled(timeout))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def remove_segments(daemons: Sequence[Daemon]) -> None:
    """Unlink the shared-memory segments of the nsqd data paths these daemons used (they
    outlive the processes by design)."""
    from pynsqd.shm.segment import list_segments, unlink_segment
    for path in {arg.partition("=")[2] for d in daemons for arg in d.args if arg.startswith("--data-path=")}:
        for name in list_segments(path):
            unlink_segment(name)


def without_file_permission_overrides() -> list[str]:
    """A command prefix that runs a process under file modes as they are: as root, without
    the capabilities that let it ignore them (``setpriv``; the test is skipped when there is
    none); nothing for another user."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        import pytest
        pytest.skip("setpriv is needed to run without CAP_DAC_OVERRIDE as root")
    caps = "-dac_override,-dac_read_search,-fowner"
    return ["setpriv", f"--bounding-set={caps}", f"--inh-caps={caps}"]


def decoy_checkout(directory: Path) -> Path:
    """Make ``directory`` hold a ``pynsqd/`` package that is not ours (a working directory
    holding another checkout): importing it, or its ``shard`` or ``spark`` package, appends
    the module's name to the returned file and fails."""
    imported = directory.parent / f"{directory.name}-imported"
    for package in ("pynsqd", "pynsqd/shard", "pynsqd/spark"):
        (directory / package).mkdir(parents=True)
        (directory / package / "__init__.py").write_text(
            f"open({str(imported)!r}, 'a').write(__name__ + '\\n')\n"
            "raise ImportError('the decoy package was imported')\n")
    return imported
