"""What every benchmark here shares: the node to measure (started on free ports from a given
tree or binary, stopped and its shared memory released), its CPU and RSS meter, a certificate
for TLS runs, collecting load processes' results, and the median report."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import IO, Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
_LISTEN = re.compile(rb"(TCP|HTTP): listening on \S+:(\d+)")

Figures = dict[str, dict[str, float]]


def start_node(data: str, *flags: str, tree: Path = ROOT,
               command: Sequence[str] = ()) -> tuple[subprocess.Popen[bytes], int, int]:
    """Start ``nsqd`` on free loopback ports; returns the process, its TCP and HTTP ports.

    The node is ``python -m pynsqd.supervisor`` of ``tree`` (this checkout unless told; the
    same interpreter, ``PYTHONPATH=tree``), or ``command`` (e.g. another nsqd binary) run with
    the same flags. Either runs in ``data`` (a scratch directory), never in the checkout."""
    env = None
    if not command:
        command = [sys.executable, "-m", "pynsqd.supervisor"]
        env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.Popen(
        [*command, "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", f"--data-path={data}", *flags],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=data, env=env)
    assert proc.stderr is not None
    ports: dict[bytes, int] = {}
    deadline = time.monotonic() + 30
    while len(ports) < 2 and time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            raise SystemExit("node exited before listening")
        m = _LISTEN.search(line)
        if m:
            ports[m.group(1)] = int(m.group(2))
    if len(ports) < 2:
        proc.kill()
        raise SystemExit("node did not start")
    threading.Thread(target=_drain, args=(proc.stderr,), daemon=True).start()
    return proc, ports[b"TCP"], ports[b"HTTP"]


def stop_node(proc: subprocess.Popen[bytes], data: str, timeout: float = 30) -> None:
    """SIGTERM the node and wait; if it is not gone in ``timeout`` s, SIGKILL it and whatever
    of its process tree is left (by pid); then unlink its shared memory."""
    try:
        tree = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)
    for child in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    remove_segments(data)


@contextlib.contextmanager
def running_node(data: str, *flags: str, stop_timeout: float = 30, tree: Path = ROOT,
                 command: Sequence[str] = ()) -> Iterator[tuple[subprocess.Popen[bytes], int, int]]:
    """``start_node`` for the block; then ``stop_node``."""
    proc, tcp_port, http_port = start_node(data, *flags, tree=tree, command=command)
    try:
        yield proc, tcp_port, http_port
    finally:
        stop_node(proc, data, stop_timeout)


class Meter:
    """Server CPU and RSS: the process ``pid`` and all its descendants (the supervisor and
    every shard process)."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.peak_rss = 0

    def _tree(self) -> list[psutil.Process]:
        return [self.proc, *self.proc.children(recursive=True)]

    def pids(self) -> set[int]:
        """The tree's processes now (if it changes during a measurement, a process that exited
        took its CPU seconds with it)."""
        return {p.pid for p in self._tree()}

    def cpu(self) -> float:
        """CPU seconds (user + system) the tree has used so far."""
        total = 0.0
        for p in self._tree():
            try:
                t = p.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += t.user + t.system
        return total

    def rss(self) -> int:
        """The tree's resident memory now, in bytes (and the peak so far in ``peak_rss``)."""
        rss = 0
        for p in self._tree():
            try:
                rss += int(p.memory_info().rss)
            except psutil.NoSuchProcess:
                continue
        self.peak_rss = max(self.peak_rss, rss)
        return rss


def write_certs(where: str, *hosts: str) -> dict[str, str]:
    """A throwaway CA and a server certificate for ``hosts`` (trustme, from the test extras),
    written as PEM files; returns their paths by name: ``ca``, ``cert``, ``key``."""
    import trustme

    ca = trustme.CA()
    server = ca.issue_cert(*hosts)
    paths = {name: os.path.join(where, f"{name}.pem") for name in ("ca", "cert", "key")}
    ca.cert_pem.write_to_path(paths["ca"])
    server.cert_chain_pems[0].write_to_path(paths["cert"])
    server.private_key_pem.write_to_path(paths["key"])
    return paths


def negotiate(addr: tuple[str, int], features: dict[str, Any], ca: str) -> tuple[Any, Any]:
    """A client connection that sent the magic and an IDENTIFY negotiating ``features``
    (``tls_v1``, ``snappy``, ``deflate``; TLS checked against the CA file ``ca``) and read
    every upgrade's ``OK``: (the socket, plain or TLS; the compression codec or None)."""
    import json
    import socket
    import ssl

    from pynsqd.wire.commands import encode_identify
    from pynsqd.wire.compression import make_codec

    sock: Any = socket.create_connection(addr)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(b"  V2" + encode_identify(json.dumps({"feature_negotiation": True, **features}).encode()))
    read_frame(sock)
    if features.get("tls_v1"):
        sock = ssl.create_default_context(cafile=ca).wrap_socket(sock, server_hostname="localhost")
        read_frame(sock)
    codec = None
    for name in ("snappy", "deflate"):
        if features.get(name):
            codec = make_codec(name)
            data = b""
            while not data.endswith(b"OK"):  # the upgrade's OK, compressed
                data += b"".join(codec.decode(sock.recv(65536)))
    return sock, codec


def read_frame(sock: Any) -> bytes:
    """Exactly one frame's data off ``sock`` (what follows may be an upgraded stream)."""
    def exact(n: int) -> bytes:
        out = b""
        while len(out) < n:
            data = sock.recv(n - len(out))
            if not data:
                raise SystemExit("connection closed by the node")
            out += data
        return out
    return exact(int.from_bytes(exact(4), "big"))[4:]


def gather_results(procs: Sequence[BaseProcess], q: Any, while_waiting: Callable[[], object]) -> list[Any]:
    """Start ``procs``, collect one result each from ``q`` (calling ``while_waiting`` every
    0.2 s meanwhile, e.g. to sample RSS), then join them."""
    for p in procs:
        p.start()
    results: list[Any] = []
    while len(results) < len(procs):
        try:
            results.append(q.get(timeout=0.2))
        except Exception:
            while_waiting()
    for p in procs:
        p.join()
    return results


def remove_segments(data: str) -> None:
    """Unlink the node's shared-memory segments (they outlive it by design)."""
    try:
        from pynsqd.shm.segment import list_segments, unlink_segment
    except ImportError:  # a tree from before shared memory (A/B runs)
        return
    for name in list_segments(data):
        unlink_segment(name)


def _drain(stream: IO[bytes]) -> None:
    """Keep reading the node's log so it never blocks on a full pipe; close it at its end."""
    with stream:
        for _ in stream:
            pass


def count_size_parser(doc: str | None, count: int, count_help: str) -> argparse.ArgumentParser:
    """A benchmark's parser with ``--count`` (messages), ``--size`` (bytes) and ``--repeat``."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=count, help=count_help)
    parser.add_argument("--size", type=int, default=200, help="message size in bytes")
    parser.add_argument("--repeat", type=int, default=1)
    return parser


def add_load_args(parser: argparse.ArgumentParser) -> None:
    """The flags every TCP load benchmark takes."""
    parser.add_argument("--size", type=int, default=200, help="message size in bytes")
    parser.add_argument("--batch", type=int, default=200, help="messages per MPUB")
    parser.add_argument("--workers", type=int, default=2, help="load processes per phase")
    parser.add_argument("--mem-queue-size", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=1)


def report(one_run: Callable[[argparse.Namespace], Figures], args: argparse.Namespace, title: str) -> None:
    """Run ``one_run`` ``args.repeat`` times; print each run, then the median of each figure."""
    runs: list[Figures] = []
    for i in range(args.repeat):
        runs.append(one_run(args))
        print(f"run {i + 1}: " + "  ".join(f"{ph}: " + ", ".join(f"{k}={v:,.1f}" for k, v in f.items())
                                          for ph, f in runs[-1].items()), flush=True)
    print(f"\nmedian of {len(runs)} run(s), {title}:")
    for phase in runs[0]:
        row = {k: statistics.median(r[phase][k] for r in runs) for k in runs[0][phase]}
        print(f"  {phase:8s} " + "  ".join(f"{k}={v:,.2f}" for k, v in row.items()))
