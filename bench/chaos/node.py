"""The node under test: ``nsqd-supervisor`` run under ``prlimit --nofile=N`` on a data path
that is a small tmpfs mounted for the run; its shards found by index, its placement read,
its process tree's RSS sampled, and whether every shard still serves."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil

from pynsqd.wire import MAGIC_V2
from pynsqd.wire.commands import encode_dpub, encode_fin, encode_pub, encode_rdy, encode_sub
from pynsqd.wire.frames import FRAME_MESSAGE, FRAME_RESPONSE, FrameParser
from testbed.harness import Daemon, remove_segments

WORKER_ENV = "PYNSQD_WORKER"  # names a shard process and its index (the supervisor's contract)
_STARTED = re.compile(r"shard (\d+): started \(pid (\d+),")  # the supervisor's log line for every shard
PROBE_CHANNEL = "probe"


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path`` for the block (needs root), then unmounted."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "chaos", str(path)], check=True)
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], check=False)


class Node:
    def __init__(self, data: Path, shards: int, nofile: int, shard_timeout: float, flags: list[str]) -> None:
        self.data = data
        self.shards = shards
        self.daemon = Daemon("pynsqd.supervisor", [
            "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", f"--data-path={data}",
            f"--shards={shards}", *flags], wrapper=["prlimit", f"--nofile={nofile}"],
            env={"PYNSQD_SHARD_TIMEOUT": str(shard_timeout)})
        self._addresses: tuple[tuple[str, int], tuple[str, int]] | None = None
        self.starts = 0
        self.log: list[str] = []  # the node's output over every start
        self._read = 0  # lines of the running daemon's output already handed out
        self._unread: list[str] = []  # lines of a killed daemon not yet handed out
        self.started_at = 0.0

    def start(self) -> None:
        self.started_at = time.monotonic()
        self.daemon.start(timeout=60)
        self._read = 0
        self._addresses = (self.daemon.tcp, self.daemon.http)
        self.starts += 1

    def new_lines(self) -> list[str]:
        """The node's output since the last call (across a restart too)."""
        out, self._unread = self._unread, []
        lines = self.daemon.lines
        out += lines[self._read:]
        self._read = len(lines)
        return out

    def address(self) -> tuple[tuple[str, int], tuple[str, int]]:
        assert self._addresses is not None
        return self._addresses

    @property
    def url(self) -> str:
        host, port = self.address()[1]
        return f"http://{host}:{port}"

    def kill(self) -> None:
        self.daemon.kill()
        self._unread += self.daemon.lines[self._read:]
        self.log += [*self.daemon.lines, "--- kill -9 of the whole tree ---"]

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.daemon.stop(timeout=30)
        self.log += self.daemon.lines
        remove_segments([self.daemon])

    # --- processes ------------------------------------------------------------------------
    def processes(self) -> list[psutil.Process]:
        if not self.daemon.running:
            return []
        try:
            top = psutil.Process(self.daemon.pid)
            return [top, *top.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def shard_pids(self) -> dict[int, int]:
        """Shard index → pid, from a spawned process's environment or, for one the zygote
        forked (its environment is the supervisor's), from the node's log (no request to the
        node); while a shard is being replaced, the newest of its two processes."""
        logged = {int(m[2]): int(m[1]) for line in self.daemon.lines if (m := _STARTED.search(line))}
        out: dict[int, int] = {}
        for proc in sorted(self.processes()[1:], key=lambda p: p.create_time()):
            with contextlib.suppress(psutil.Error, KeyError, ValueError):
                env = proc.environ()
                index = int(json.loads(env[WORKER_ENV])["index"]) if WORKER_ENV in env else logged[proc.pid]
                out[index] = proc.pid
        return out

    def rss(self) -> int:
        total = 0
        for proc in self.processes():
            with contextlib.suppress(psutil.Error):
                total += proc.memory_info().rss
        return total

    def stats(self) -> dict[str, Any]:
        resp = httpx.get(f"{self.url}/stats", params={"format": "json", "include_shards": "true"}, timeout=5)
        resp.raise_for_status()
        return dict(resp.json())

    def supervisor(self) -> dict[str, Any]:
        """The supervisor's figures (``{}`` if the node does not answer now)."""
        try:
            return dict(self.stats()["supervisor"])
        except (httpx.HTTPError, KeyError, ValueError):
            return {}

    def signal(self, sig: int) -> None:
        self.daemon.signal(sig)

    def wait_shard_back(self, index: int, old_pid: int, timeout: float = 60) -> float | None:
        """Seconds until shard ``index`` runs in a new process and is ready; None if never."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            with contextlib.suppress(httpx.HTTPError, KeyError, IndexError, ValueError):
                status = self.stats()["supervisor"]["shard_status"][index]
                if status["pid"] != old_pid and status["ready"]:
                    return time.monotonic() - start
            time.sleep(0.1)
        return None

    # --- topics ---------------------------------------------------------------------------
    def create(self, topic: str, channels: list[str]) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as http:
            http.post("/topic/create", params={"topic": topic}).raise_for_status()
            for channel in channels:
                http.post("/channel/create", params={"topic": topic, "channel": channel}).raise_for_status()

    def owners(self) -> dict[str, int]:
        table: dict[str, int] = {}
        for line in (self.data / "pynsqd.placement").read_text().splitlines():
            shard, _, topic = line.partition(" ")
            table[topic] = int(shard)
        return table

    def topics_of(self, index: int) -> frozenset[str]:
        return frozenset(t for t, s in self.owners().items() if s == index)

    # --- does it serve --------------------------------------------------------------------
    def serves(self, probe_topic: str, timeout: float = 10) -> str | None:
        """None when a TCP PUB and DPUB, an HTTP /pub and a TCP SUB of ``probe_topic`` all
        work, the deferred message included (so the shard's scan still runs); else what
        failed."""
        try:
            with socket.create_connection(self.address()[0], timeout=timeout) as sock:
                sock.sendall(MAGIC_V2 + encode_pub(probe_topic, b"tcp") + encode_dpub(probe_topic, 200, b"deferred"))
                if _frames(sock, 2) != [(FRAME_RESPONSE, b"OK")] * 2:
                    return "TCP PUB/DPUB not acknowledged"
        except OSError as exc:
            return f"TCP PUB failed: {exc!r}"
        try:
            resp = httpx.post(f"{self.url}/pub", params={"topic": probe_topic}, content=b"http", timeout=timeout)
            if resp.status_code != 200:
                return f"HTTP /pub answered {resp.status_code}"
        except httpx.HTTPError as exc:
            return f"HTTP /pub failed: {exc!r}"
        got: list[tuple[int, bytes]] = []
        try:
            with socket.create_connection(self.address()[0], timeout=timeout) as sock:
                sock.sendall(MAGIC_V2 + encode_sub(probe_topic, PROBE_CHANNEL) + encode_rdy(10))
                got = [f for f in _frames(sock, 4) if f[0] == FRAME_MESSAGE]
                if len(got) != 3:
                    return f"TCP SUB got {len(got)} of 3 messages"
                sock.sendall(b"".join(encode_fin(data[10:26]) for _, data in got))
        except OSError as exc:
            return f"TCP SUB: {len(got)} of 3 messages, then {exc!r}"
        return None


_DEATH = re.compile(r"^\[nsqd\] (\S+ \S+) ERROR: shard (\d+) \(pid (\d+)\)"
                    r"(?:: no heartbeat for ([\d.]+)s| was killed| exited with status)")


def death(line: str) -> tuple[float, int, int] | None:
    """``(wall time the shard stopped working, index, pid)`` if ``line`` is the supervisor
    logging a shard's death or its killing for a silent loop (silent since then)."""
    m = _DEATH.match(line)
    if m is None:
        return None
    wall = datetime.datetime.strptime(m.group(1), "%Y/%m/%d %H:%M:%S.%f").timestamp()
    return wall - float(m.group(4) or 0), int(m.group(2)), int(m.group(3))


def _frames(sock: socket.socket, count: int) -> list[tuple[int, bytes]]:
    parser = FrameParser()
    out: list[tuple[int, bytes]] = []
    while len(out) < count:
        data = sock.recv(1 << 16)
        if not data:
            raise ConnectionError("closed")
        for frame in parser.feed(data):
            if not isinstance(frame, tuple):
                raise ConnectionError(f"bad frame: {frame}")
            if frame == (FRAME_RESPONSE, b"_heartbeat_"):
                sock.sendall(b"NOP\n")
            else:
                out.append((frame[0], bytes(frame[1])))
    return out


def raise_own_nofile() -> None:
    """The soak opens many connections itself: its soft descriptor limit to the hard one."""
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
