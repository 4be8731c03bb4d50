"""Start-up and crash-recovery benchmark: how soon a node serves.

*Fresh start*: ``--starts`` nodes on an empty data path, one after the other; for each, the
seconds from spawning ``nsqd`` to the first ``/ping`` answered ``OK`` (polled every 2 ms on
a port chosen beforehand), and the CPU seconds the supervisor, the busiest shard, the
children the supervisor reaped by then (the zygote that forked the first shards) and all of
them together had used by then.

*Crash*: a node with ``--mem-queue-size`` above ``--count`` gets ``--count`` messages of
``--size`` bytes on one channel (all in shared memory), then its whole tree is killed with
SIGKILL and it is started again on the same data path: the seconds from that start to
``/ping``, to the first message delivered to a new consumer, and to the shard's log line
that the channel's log is recovered (``--crashes`` times; the shared memory is removed at
the end).

``--tree DIR`` (repeatable) measures other checkouts in the same run, alternating, each
with its own ``.venv`` if it has one:

  .venv/bin/python bench/bench_boot.py --starts 5 --count 5000000 --crashes 3 --tree ../main
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_backlog import publish_count  # noqa: E402
from bench.bench_tcp import _connect, _read_response, create_channels  # noqa: E402
from bench.common import remove_segments  # noqa: E402
from pynsqd.wire.commands import encode_rdy, encode_sub  # noqa: E402

_RECOVERED = re.compile(rb"CHANNEL\(backlog:ch\): recovered")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ping(port: int) -> bool:
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    except OSError:
        return False
    try:
        sock.sendall(b"GET /ping HTTP/1.1\r\nHost: bench\r\n\r\n")
        return sock.recv(1024).endswith(b"\r\n\r\nOK")
    except OSError:
        return False
    finally:
        sock.close()


class Node:
    """``nsqd`` of ``tree`` on ports chosen beforehand; notes when its log says the backlog
    channel is recovered."""

    def __init__(self, tree: Path, data: str, *flags: str) -> None:
        python = tree / ".venv" / "bin" / "python"
        self.tcp, self.http = _free_port(), _free_port()
        self.started = time.monotonic()
        self.recovered: float | None = None
        self.tail: list[bytes] = []  # the last lines of its log, for an exit before /ping
        self.proc = subprocess.Popen(
            [str(python if python.exists() else sys.executable), "-m", "pynsqd.supervisor",
             f"--tcp-address=127.0.0.1:{self.tcp}", f"--http-address=127.0.0.1:{self.http}", f"--data-path={data}",
             "--log-level=info", *flags],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)})
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.tail = [*self.tail[-9:], line]
            if self.recovered is None and _RECOVERED.search(line):
                self.recovered = time.monotonic() - self.started

    def wait_ping(self) -> float:
        while not _ping(self.http):
            if self.proc.poll() is not None:
                self.reader.join(5)  # its log to the end
                raise SystemExit("node exited:\n" + b"".join(self.tail).decode(errors="replace"))
            time.sleep(0.002)
        return time.monotonic() - self.started

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far: the supervisor's, the busiest shard's, those of the children
        the supervisor reaped (the zygote, which forked the first shards), and all of them."""
        proc = psutil.Process(self.proc.pid)
        times = proc.cpu_times()
        shards = [sum(c.cpu_times()[:2]) for c in proc.children()]
        supervisor, reaped = times.user + times.system, times.children_user + times.children_system
        return {"supervisor_cpu_s": supervisor, "shard_cpu_s": max(shards, default=0.0),
                "zygote_cpu_s": reaped, "total_cpu_s": supervisor + reaped + sum(shards)}

    def kill(self) -> None:
        """SIGKILL the whole tree (by pid)."""
        tree = psutil.Process(self.proc.pid).children(recursive=True)
        self.proc.kill()
        for child in tree:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        self.proc.wait()

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.kill()


def fresh_start(tree: Path) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as data:
        node = Node(tree, data)
        try:
            ping = node.wait_ping()
            cpu = node.cpu()
        finally:
            node.stop()
            remove_segments(data)
    return {"ping_s": ping, **cpu}


def crash(tree: Path, count: int, size: int) -> dict[str, float]:
    import multiprocessing as mp
    flags = (f"--mem-queue-size={count + 1_000_000}",)
    with tempfile.TemporaryDirectory() as data:
        node = Node(tree, data, *flags)
        try:
            node.wait_ping()
            addr = ("127.0.0.1", node.tcp)
            create_channels(addr, ["backlog"])
            ctx = mp.get_context("spawn")
            q = ctx.Queue()
            procs = [ctx.Process(target=publish_count, args=(addr, "backlog", size, 200, count // 2, q))
                     for _ in range(2)]
            for p in procs:
                p.start()
            for p in procs:
                q.get()
                p.join()
            node.kill()
            node = Node(tree, data, *flags)
            ping = node.wait_ping()
            sock = _connect(("127.0.0.1", node.tcp))
            sock.sendall(encode_sub("backlog", "ch"))
            _read_response(sock)
            sock.sendall(encode_rdy(1))
            head = sock.recv(8)
            first = time.monotonic() - node.started
            assert len(head) == 8
            sock.close()
            while node.recovered is None:
                time.sleep(0.01)
            return {"ping_s": ping, "first_delivery_s": first, "recovered_s": node.recovered}
        finally:
            node.stop()
            remove_segments(data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--starts", type=int, default=5, help="fresh starts per tree")
    parser.add_argument("--count", type=int, default=5_000_000, help="messages held when the tree is killed")
    parser.add_argument("--size", type=int, default=200, help="message size in bytes")
    parser.add_argument("--crashes", type=int, default=1, help="kill -9 and restart runs per tree (0: none)")
    parser.add_argument("--tree", type=Path, action="append", default=[], help="another checkout to measure")
    args = parser.parse_args()
    trees = [ROOT, *[t.resolve() for t in args.tree]]
    runs: dict[str, dict[Path, list[dict[str, float]]]] = {"fresh start": {t: [] for t in trees},
                                                          "kill -9 and restart": {t: [] for t in trees}}
    for _ in range(args.starts):
        for tree in trees:
            runs["fresh start"][tree].append(fresh_start(tree))
    for _ in range(args.crashes):
        for tree in trees:
            runs["kill -9 and restart"][tree].append(crash(tree, args.count, args.size))
    for what, by_tree in runs.items():
        for tree, figures in by_tree.items():
            if not figures:
                continue
            medians = {k: statistics.median(f[k] for f in figures) for k in figures[0]}
            print(f"{what}, {tree.name}: median of {len(figures)}: "
                  + ", ".join(f"{k}={v:.3f}" for k, v in medians.items()), flush=True)


if __name__ == "__main__":
    main()
