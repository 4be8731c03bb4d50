"""The faults the soak injects, each a blocking function run off the clients' loop. Each
records the crash it causes in the ledger (the moment the affected processes stopped applying
commands) and returns what happened, for the report.

- ``shard-kill``: kill -9 of one shard; the supervisor restarts it.
- ``tree-kill``: kill -9 of the supervisor and every shard; a new node on the same data path.
- ``shard-stop``: SIGSTOP of one shard for longer than the heartbeat deadline (the supervisor
  kills it and starts another), then SIGCONT.
- ``disk-full``: the tmpfs data path filled to the last byte, held, then freed.
- ``fd-exhaustion``: idle connections opened until a TCP publish is no longer served (the
  node runs under ``prlimit --nofile``), held, then closed; then how long until it serves.
- ``reload``: SIGHUP, a rolling restart of every shard (``supervisor/reload.py``); no crash:
  nothing may come twice, no consumer may be disconnected, no publish may fail.
- ``upgrade``: SIGUSR2, the supervisor re-executes itself and then reloads; no crash either.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import signal
import socket
import time
from collections.abc import Callable
from typing import Any

from bench.chaos.ledger import Ledger
from bench.chaos.node import Node
from pynsqd.wire import MAGIC_V2
from pynsqd.wire.commands import encode_pub

KINDS = ("shard-kill", "tree-kill", "shard-stop", "disk-full", "fd-exhaustion", "reload", "upgrade")
RESTARTS = ("reload", "upgrade")  # no crash: the node replaces its processes with clients connected
RESTART_WAIT = 180.0  # seconds for a reload or an upgrade to complete
FD_PROBE_TOPIC = "chaos_fd_probe#ephemeral"
CONNECTIONS_CAP = 16_000  # the soak's own descriptors are limited too


class Faults:
    def __init__(self, node: Node, ledger: Ledger, rng: random.Random, hold: float, stop_for: float,
                 nofile: int) -> None:
        self.node, self.ledger, self.rng, self.hold, self.stop_for = node, ledger, rng, hold, stop_for
        self.nofile = nofile
        self.victims: set[int] = set()  # pids this soak killed or stopped itself
        self.run: dict[str, Callable[[], dict[str, Any]]] = {
            "shard-kill": self.shard_kill, "tree-kill": self.tree_kill, "shard-stop": self.shard_stop,
            "disk-full": self.disk_full, "fd-exhaustion": self.fd_exhaustion, "reload": self.reload,
            "upgrade": self.upgrade}

    def inject(self, kind: str) -> dict[str, Any]:
        began = time.monotonic()
        try:
            return self.run[kind]()
        finally:
            self.ledger.faults.append((began, time.monotonic(), kind))

    def _victim(self) -> tuple[int, int]:
        pids = self.node.shard_pids()
        if not pids:
            raise RuntimeError("no shard process found")
        index = self.rng.choice(sorted(pids))
        self.victims.add(pids[index])
        return index, pids[index]

    def shard_kill(self) -> dict[str, Any]:
        index, pid = self._victim()
        topics = self.node.topics_of(index)
        at = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        self.ledger.crash(at, "shard-kill", topics)
        back = self.node.wait_shard_back(index, pid)
        return {"shard": index, "back_after_s": back}

    def tree_kill(self) -> dict[str, Any]:
        at = time.monotonic()
        self.node.kill()
        self.ledger.crash(at, "tree-kill", None)
        self.node.start()
        return {"restarted_after_s": round(time.monotonic() - at, 2)}

    def shard_stop(self) -> dict[str, Any]:
        index, pid = self._victim()
        topics = self.node.topics_of(index)
        at = time.monotonic()
        os.kill(pid, signal.SIGSTOP)
        self.ledger.crash(at, "shard-stop", topics)
        time.sleep(self.stop_for)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        back = self.node.wait_shard_back(index, pid)
        return {"shard": index, "stopped_s": self.stop_for, "back_after_s": back}

    def reload(self) -> dict[str, Any]:
        return self.restart(signal.SIGHUP, "reloads")

    def upgrade(self) -> dict[str, Any]:
        return self.restart(signal.SIGUSR2, "upgrades", "reloads")

    def restart(self, sig: int, *counters: str) -> dict[str, Any]:
        """Signal the supervisor; seconds until each of its ``counters`` went up (None: not
        within ``RESTART_WAIT``), with the shards' pids before and after."""
        before = self.node.supervisor()
        pids = self.node.shard_pids()
        start = time.monotonic()
        self.node.signal(sig)
        took = None
        while time.monotonic() - start < RESTART_WAIT:
            now = self.node.supervisor()
            if now and all(now[c] > before[c] for c in counters):
                took = round(time.monotonic() - start, 2)
                break
            time.sleep(0.1)
        return {"completed_after_s": took, "shards_before": pids, "shards_after": self.node.shard_pids()}

    def disk_full(self) -> dict[str, Any]:
        ballast = self.node.data / "chaos.ballast"
        written = 0
        with open(ballast, "wb", buffering=0) as f:
            for chunk in (1 << 20, 4096, 1):
                block = b"\0" * chunk
                try:
                    while True:
                        written += f.write(block) or 0
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
        time.sleep(self.hold)
        ballast.unlink()
        return {"ballast_bytes": written, "held_s": self.hold}

    def fd_exhaustion(self) -> dict[str, Any]:
        """A burst of ``nofile`` idle connections first (the supervisor holds each until it is
        handed off, so it runs out), then more in batches until a publish is not served."""
        tcp, http = self.node.address()
        held: list[socket.socket] = []
        ok = True
        try:
            batch = self.nofile + 64
            while ok and len(held) < CONNECTIONS_CAP:
                for i in range(batch):
                    try:
                        sock = socket.create_connection(tcp if i % 4 else http, timeout=1)
                    except OSError:
                        ok = False
                        break
                    held.append(sock)
                ok = ok and served(tcp, timeout=1.0)
                batch = 64
            time.sleep(self.hold)
        finally:
            for sock in held:
                sock.close()
        start = time.monotonic()
        again = None
        while time.monotonic() - start < 30:
            if served(tcp, timeout=1.0):
                again = round(time.monotonic() - start, 2)
                break
            time.sleep(0.2)
        return {"connections_opened": len(held), "exhausted": not ok, "tcp_served_again_after_s": again}


def served(tcp: tuple[str, int], timeout: float) -> bool:
    """A new TCP connection gets OK for a PUB within ``timeout``."""
    try:
        with socket.create_connection(tcp, timeout=timeout) as sock:
            sock.sendall(MAGIC_V2 + encode_pub(FD_PROBE_TOPIC, b"probe"))
            data = b""
            while len(data) < 10:
                chunk = sock.recv(64)
                if not chunk:
                    return False
                data += chunk
            return data[8:10] == b"OK"
    except OSError:
        return False


def schedule(rng: random.Random, duration: float, count: int) -> list[tuple[float, str]]:
    """``count`` faults over ``duration`` seconds: evenly spaced with seeded jitter, every
    kind once in each run of ``len(KINDS)``, in a seeded order."""
    kinds: list[str] = []
    while len(kinds) < count:
        block = list(KINDS)
        rng.shuffle(block)
        kinds += block
    gap = duration / (count + 1)
    return [(gap * (i + 1) + rng.uniform(-0.3, 0.3) * gap, kinds[i]) for i in range(count)]
