"""A first run, as the README tells it: ``scripts/run`` on ports of its own
(``PYNSQD_RUN_PORTS``), and the README's first client example against what it started."""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from testbed.harness import scaled, wait_for
from tests.support.admin_helpers import free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


class Run:
    """``scripts/run ARGS`` in its own session, its output collected; ``stop`` is Ctrl-C."""

    def __init__(self, data: Path, *args: str, ports: list[int] | None = None) -> None:
        # lookupd TCP, HTTP; nsqd TCP, HTTP; nsqadmin HTTP
        self.ports = ports or [free_port() for _ in range(5)]
        env = {**os.environ, "PYNSQD_RUN_PORTS": " ".join(map(str, self.ports)), "PYNSQD_RUN_DATA": str(data)}
        self.proc = subprocess.Popen([str(ROOT / "scripts" / "run"), *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                     start_new_session=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.decode(errors="replace").rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def url(self, index: int, path: str) -> str:
        return f"http://127.0.0.1:{self.ports[index]}{path}"

    def finished(self, timeout: float = 60) -> int:
        code = self.proc.wait(scaled(timeout))
        self._reader.join(scaled(10))
        return code

    def stop(self) -> None:
        """SIGINT to the script (it stops its daemons); SIGKILL to what is left of its session."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(scaled(30))
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(scaled(10))
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def run(tmp_path: Path) -> Iterator[list[Run]]:
    runs: list[Run] = []
    yield runs
    for r in runs:
        r.stop()
    from pynsqd.shm.segment import list_segments, unlink_segment
    for name in list_segments(str(tmp_path / "data" / "nsqd")):
        unlink_segment(name)


def _session_pids(run: Run) -> set[int]:
    """The processes left in the script's session (its daemons and their shards)."""
    out = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == run.proc.pid:
                    out.add(int(entry))
            except OSError:
                continue
    return out


def test_scripts_run_starts_the_three_daemons_in_order_and_stops_them(run: list[Run], tmp_path: Path) -> None:
    r = Run(tmp_path / "data")
    run.append(r)
    wait_for(lambda: "pynsqd is running" in r.output or r.proc.poll() is not None, 60, 0.05, "the banner")
    assert "pynsqd is running" in r.output, r.output
    for index in (1, 3, 4):
        assert httpx.get(r.url(index, "/ping"), timeout=scaled(5)).status_code == 200
    assert f"nsqd        TCP 127.0.0.1:{r.ports[2]}" in r.output
    # nsqadmin and nsqd started once nsqlookupd answered: nobody was refused
    assert not re.search(r"refused|Errno 111", r.output, re.I), r.output
    r.proc.send_signal(signal.SIGINT)  # Ctrl-C
    r.finished()
    wait_for(lambda: not _session_pids(r), 30, what="every daemon gone")
    assert "Traceback" not in r.output, r.output


def test_scripts_run_fails_without_a_banner_when_a_daemon_dies_at_start(run: list[Run], tmp_path: Path) -> None:
    r = Run(tmp_path / "data", "--no-such-flag")
    run.append(r)
    assert r.finished() == 1, r.output
    assert "run: nsqd failed to start (exit status 1)" in r.output and "pynsqd is running" not in r.output
    wait_for(lambda: not _session_pids(r), 30, what="the other daemons stopped")


def test_scripts_run_refuses_a_port_another_process_answers(run: list[Run], tmp_path: Path) -> None:
    """The nsqd HTTP port is answered by another process: a ping there would pass for ours."""
    with socket.create_server(("127.0.0.1", 0)) as other:
        ports = [free_port() for _ in range(5)]
        ports[3] = other.getsockname()[1]
        r = Run(tmp_path / "data", ports=ports)
        run.append(r)
        assert r.finished() == 1, r.output
    assert r.lines[-1] == f"run: 127.0.0.1:{ports[3]} is in use by another process (stop it, or set PYNSQD_RUN_PORTS)"
    assert "pynsqd is running" not in r.output and not _session_pids(r)


def _first_example() -> str:
    """The first Python block of the README's "Publish and consume" section."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("Publish and consume"):]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "no Python example after 'Publish and consume'"
    return match.group(1)


def test_the_readmes_first_client_example_needs_only_what_scripts_run_installs() -> None:
    """scripts/run installs pynsqd and its dependencies, no extra: every module the first
    example imports is the standard library's, pynsqd's or one of its requirements'."""
    base = {re.split(r"[ ;<>=!\[]", r)[0].lower().replace("_", "-")
            for r in importlib.metadata.requires("pynsqd") or [] if "extra ==" not in r}
    owners = importlib.metadata.packages_distributions()
    for node in ast.walk(ast.parse(_first_example())):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        for name in names:
            top = name.split(".")[0]
            dists = {d.lower().replace("_", "-") for d in owners.get(top, [])}
            assert top in sys.stdlib_module_names or top == "pynsqd" or dists & base, \
                f"the first example imports {top!r}, which scripts/run does not install"


def test_the_readmes_first_client_example_runs_against_a_scripts_run_cluster(run: list[Run], tmp_path: Path) -> None:
    r = Run(tmp_path / "data")
    run.append(r)
    wait_for(lambda: "pynsqd is running" in r.output or r.proc.poll() is not None, 60, 0.05, "the banner")
    assert "pynsqd is running" in r.output, r.output
    code = (_first_example().replace("127.0.0.1:4150", f"127.0.0.1:{r.ports[2]}")
            .replace("127.0.0.1:4161", f"127.0.0.1:{r.ports[1]}"))
    started = time.monotonic()
    proc = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-c", code], capture_output=True, text=True,
                          timeout=scaled(60))
    assert proc.returncode == 0, proc.stderr
    assert "b'hello'" in proc.stdout, (proc.stdout, proc.stderr, time.monotonic() - started)
