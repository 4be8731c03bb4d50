"""Three rolling reloads and an upgrade of the supervisor under mixed load, judged whole.

The load (``bench/chaos/reloadrun.py``, the chaos soak's clients): TCP producers (PUB, MPUB,
DPUB) and HTTP producers (/pub, /mpub, deferred /pub); plain consumers that FIN, REQ (at
once, with a delay) and hold with TOUCH; one TLS consumer and one snappy consumer; and a
connector opening a new TCP connection for each publish. Asserted: no connection attempt
refused or failed, no publish error, nothing acknowledged lost, nothing deferred delivered
early, nothing delivered again to a plain consumer or after a FIN, no plain consumer
disconnected; the TLS and snappy consumers, whose connections cannot move, reconnect and
get everything. The publish stall (sent during a restart → acknowledged) is reported; its
figures over several runs are bench/bench_reload.py's (docs/benchmarks.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
# The load runs in a process of its own, as a node's clients would: the test judges the node,
# and the garbage of the suite's earlier tests is not collected in the middle of the load.
LOAD = """
import json, sys
from bench.chaos.reloadrun import ReloadConfig, run
print(json.dumps(run(ReloadConfig(**json.loads(sys.argv[1])))))
"""


def test_three_reloads_and_an_upgrade_under_mixed_load_lose_refuse_and_repeat_nothing(tmp_path: Path) -> None:
    log = tmp_path / "node.log"
    config = {"plan": ["reload", "reload", "upgrade", "reload"], "warmup": 4, "gap": 3, "rate": 200,
              "node_log": str(log), "workdir": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", LOAD, json.dumps(config)], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    if done.returncode != 0:
        pytest.fail(f"the load exited with {done.returncode}:\n{done.stderr[-4000:]}")
    report = json.loads(done.stdout.splitlines()[-1])
    stall = report["stall"]
    print("publish stall during restarts:", json.dumps(stall["all_protocols_during_restarts"]),
          "tcp:", json.dumps(stall["tcp"]["during_restarts"]), "http:", json.dumps(stall["http"]["during_restarts"]),
          "new connections, longest wait:", report["connector"]["longest_wait_in_restarts_ms"], "ms")
    assert report["missed"] == [], f"{report['missed']} (the node's output: {log})"
    assert report["connector"]["refused_or_failed"] == 0 and report["connector"]["answered"] > 50
    assert report["publish_errors"] == 0 and report["producer_errors"] == 0
    assert report["lost"] == 0 and report["early"] == 0
    assert report["duplicates"] == report["duplicates_explained"]  # only the TLS and snappy consumers' repeats
    assert report["disconnected"] == 0
    assert report["upgraded_connections"] >= 2 * (1 + 4)  # closed at each restart, and reconnected
    assert [r["kind"] for r in report["restarts_done"]] == ["reload", "reload", "upgrade", "reload"]
    assert len(report["handovers"]) == 2 * 4  # every shard handed over at every restart
    assert report["acknowledged"] > 1000 and report["expected_deliveries"] > report["acknowledged"]
