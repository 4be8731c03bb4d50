"""Clients nobody here wrote — pynsq (PyPI) and nsqjs (npm) — run as processes against a
node (``tests/support/clients/pynsq_app.py``, ``tests/support/js/client.js``, same
arguments); consumers print one JSON line per finished message. ``clients`` is the fixture
that kills what a test started (``tests/conftest.py`` shares it)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from testbed.harness import Daemon, scaled

ROOT = Path(__file__).resolve().parents[2]
NSQJS = ROOT / "tests" / "support" / "js" / "node_modules" / "nsqjs"


def _command(kind: str) -> list[str]:
    if kind == "pynsq":
        return [sys.executable, str(ROOT / "tests" / "support" / "clients" / "pynsq_app.py")]
    node = shutil.which("node")
    if node is None or not NSQJS.exists():
        pytest.skip("node or nsqjs not installed (scripts/setup installs nsqjs)")
    return [node, str(ROOT / "tests" / "support" / "js" / "client.js")]


class ClientProc:
    """A client process; ``lines()`` parses what a consumer printed."""

    def __init__(self, kind: str, args: list[str]) -> None:
        self.kind = kind
        self.proc = subprocess.Popen([*_command(kind), *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True, cwd=ROOT)
        self.out = b""
        self.err = b""

    def finish(self, timeout: float = 30) -> int:
        out, err = self.proc.communicate(timeout=scaled(timeout))
        self.out += out
        self.err += err
        return self.proc.returncode

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.finish(10)
                return
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.finish(10)

    def messages(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.out.decode().splitlines() if line.startswith("{")]


@pytest.fixture
def clients() -> Iterator[list[ClientProc]]:
    started: list[ClientProc] = []
    yield started
    for c in started:
        if c.proc.poll() is None:
            os.killpg(c.proc.pid, signal.SIGKILL)
            c.proc.wait()
        for stream in (c.proc.stdout, c.proc.stderr):
            if stream is not None:
                stream.close()


def run(clients: list[ClientProc], kind: str, *args: str) -> ClientProc:
    proc = ClientProc(kind, list(args))
    clients.append(proc)
    return proc


def publish(clients: list[ClientProc], kind: str, nsqd: Daemon, topic: str, count: int,
            *extra: str) -> None:
    host, port = nsqd.tcp
    pub = run(clients, kind, "pub", "--nsqd", f"{host}:{port}", "--topic", topic,
              "--count", str(count), *extra)
    assert pub.finish() == 0, pub.err.decode()
    assert pub.out.decode().strip() == f"published {count}"


def consume(clients: list[ClientProc], kind: str, nsqd: Daemon, topic: str, channel: str,
            count: int, *extra: str) -> ClientProc:
    host, port = nsqd.tcp
    return run(clients, kind, "sub", "--nsqd", f"{host}:{port}", "--topic", topic,
               "--channel", channel, "--count", str(count), *extra)


def channel_stats(nsqd: Daemon, topic: str, channel: str) -> dict[str, Any]:
    data = httpx.get(f"{nsqd.http_url}/stats", params={"format": "json"}, timeout=5).json()
    topic_data = next(t for t in data["topics"] if t["topic_name"] == topic)
    return dict(next(c for c in topic_data["channels"] if c["channel_name"] == channel))


KINDS = ["pynsq", "nsqjs"]


def client_count(nsqd: Daemon, topic: str, channel: str) -> int:
    try:
        return int(channel_stats(nsqd, topic, channel)["client_count"])
    except StopIteration:
        return 0
