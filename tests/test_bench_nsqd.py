"""bench/bench_nsqd.py end to end, with very short phases: a node it starts from this tree
against a running one, the figures of each scenario, the comparison table, and nothing left
behind (its node stopped, the running node's bench topics deleted). Figures are not checked:
only that they are there."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from testbed.harness import Daemon, scaled, wait_for

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent
FIGURES = {
    "pub": ("msgs_s", "cpu_us_msg", "peak_rss_mb", "p50_ms", "p99_ms", "p99.9_ms"),
    "topics": ("create_s", "cpu_ms_topic", "metrics_ms", "stats_ms", "rss_mb", "peak_rss_mb"),
}
NUMBER = r"[0-9][0-9,.e+-]*"


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def test_compares_a_started_node_with_a_running_one(nsqd_factory: Callable[..., Daemon]) -> None:
    running = nsqd_factory()
    host, port = running.http
    bench = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "bench_nsqd.py"), "--runfor", "0.5", "--scenarios", "pub,topics",
         "--topics", "10", "--compare-nsqd-tcp-address", "{}:{}".format(*running.tcp),
         "--compare-nsqd-http-address", f"{host}:{port}", "--compare-nsqd-pid", str(running.pid)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = bench.communicate(timeout=scaled(240))
        assert bench.returncode == 0, out
        wait_for(lambda: _group_gone(bench.pid), timeout=30, what="the bench's node and load processes to exit")
    finally:
        with contextlib.suppress(ProcessLookupError):  # whatever of the bench's process group is left
            os.killpg(bench.pid, signal.SIGKILL)

    assert re.search(r"^A: tree .*\(", out, re.M) and re.search(r"^B: running node tcp ", out, re.M), out
    for name, figures in FIGURES.items():
        for side in "AB":
            line = re.search(rf"^run 1 {side} {name} +(.*)$", out, re.M)
            assert line, out
            assert [f.split("=")[0] for f in line.group(1).split()] == list(figures), line.group(0)
    table = out[out.index("median of 1 run(s):"):].splitlines()[1:]
    assert re.fullmatch(r"figure *\| *A \| *B \| *B/A", table[0]), table
    rows = [r for r in table[2:] if r.strip()]
    assert [r.split("|")[0].strip() for r in rows] == [f"{n} {f}" for n, fs in FIGURES.items() for f in fs], rows
    for row in rows:
        _, a, b, ratio = (c.strip() for c in row.split("|"))
        assert re.fullmatch(NUMBER, a) and re.fullmatch(NUMBER, b), row
        # CPU is counted in clock ticks: a few topics' worth may round to 0, and x/0 has no ratio
        assert re.fullmatch(NUMBER, ratio) or (ratio == "-" and float(a) == 0), row

    with urllib.request.urlopen(f"http://{host}:{port}/stats?format=json", timeout=30) as r:
        assert json.load(r)["topics"] == [], "the bench topics are left on the running node"


def test_a_started_node_runs_in_its_scratch_directory(tmp_path: Path) -> None:
    from bench.common import running_node

    with running_node(str(tmp_path)) as (proc, _, _):
        assert os.readlink(f"/proc/{proc.pid}/cwd") == str(tmp_path)


def test_nsq_tools_must_be_there(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_nsqd.py"), "--nsq-tools", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert out.stderr.strip() == (f"bench_nsqd.py: no bench_writer or bench_reader in {tmp_path} "
                                  "(build them from NSQ's bench/bench_writer and bench/bench_reader)")


NSQ_TOOLS = os.environ.get("PYNSQD_NSQ_TOOLS", "")


@pytest.mark.skipif(not NSQ_TOOLS, reason="PYNSQD_NSQ_TOOLS names no directory with NSQ's bench_writer/bench_reader")
def test_nsq_tools_load_the_tcp_scenarios() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_nsqd.py"), "--runfor", "1", "--scenarios",
                          "mpub,sub,pub", "--nsq-tools", NSQ_TOOLS],
                         capture_output=True, text=True, timeout=scaled(240))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"TCP load from NSQ's bench_writer/bench_reader in {Path(NSQ_TOOLS).resolve()}" in out.stdout
    for name in ("mpub", "sub", "pub"):
        line = re.search(rf"^run 1 A {name} +msgs_s=({NUMBER}) +cpu_us_msg=({NUMBER}) +peak_rss_mb={NUMBER}$",
                         out.stdout, re.M)
        assert line and float(line.group(1).replace(",", "")) > 0, out.stdout
