"""Rolling restarts and supervisor upgrades under mixed load: what clients see, and how long
publishers wait.

Each run starts a node (``--shards``, TLS on), runs the chaos soak's load over ``--topics``
topics — TCP PUB/MPUB/DPUB and HTTP /pub, /mpub, deferred /pub producers; plain consumers
that FIN, REQ and hold, plus one TLS and one snappy consumer — and a connector that opens a
new TCP connection and publishes on it over and over, then applies ``--plan`` (reloads
and upgrades, ``--gap`` seconds apart) and drains (``bench/chaos/reloadrun.py``).

It prints, per run and as medians over ``--runs``: the verdict (lost, early, duplicates,
plain consumers disconnected, publish errors, connections refused), the publish stall of
publishes sent during a restart (send to acknowledgement: p50, p99, longest; TCP and HTTP),
the connector's longest wait during a restart (an upgrade's gap between supervisor images),
and each shard hand-over as the node logs it (release to the replacement serving); beside
them the same run's baseline, publishes sent outside the restarts. The exit status is 1 when
a run missed a target.

  .venv/bin/python bench/bench_reload.py --runs 3 --plan reload,reload,upgrade,reload
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.chaos.reloadrun import ReloadConfig, run  # noqa: E402


def figures(r: dict[str, Any]) -> dict[str, Any]:
    during = r["stall"]["all_protocols_during_restarts"]
    handed = [h["handed_over_s"] * 1000 for h in r["handovers"]]
    return {
        "acknowledged": r["acknowledged"], "lost": r["lost"], "early": r["early"],
        "duplicates_unexplained": r["duplicates"] - r["duplicates_explained"],
        "plain_disconnected": r["disconnected"], "publish_errors": r["publish_errors"],
        "refused": r["connector"]["refused_or_failed"],
        "stall_p50_ms": during.get("p50_ms"), "stall_p99_ms": during.get("p99_ms"),
        "stall_max_ms": during.get("max_ms"),
        "baseline_p50_ms": r["stall"]["all_protocols_outside_restarts"].get("p50_ms"),
        "baseline_p99_ms": r["stall"]["all_protocols_outside_restarts"].get("p99_ms"),
        "baseline_max_ms": r["stall"]["all_protocols_outside_restarts"].get("max_ms"),
        "tcp_stall_p99_ms": r["stall"]["tcp"]["during_restarts"].get("p99_ms"),
        "http_stall_p99_ms": r["stall"]["http"]["during_restarts"].get("p99_ms"),
        "new_connection_max_wait_ms": r["connector"]["longest_wait_in_restarts_ms"],
        "handover_median_ms": round(statistics.median(handed), 1) if handed else None,
        "handover_max_ms": round(max(handed), 1) if handed else None,
    }


def main() -> int:
    d = ReloadConfig()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--plan", default=",".join(d.plan), help="reload and upgrade, comma-separated")
    parser.add_argument("--gap", type=float, default=d.gap)
    parser.add_argument("--rate", type=float, default=d.rate)
    parser.add_argument("--topics", type=int, default=d.topics)
    parser.add_argument("--shards", type=int, default=d.shards)
    parser.add_argument("--json", type=Path, default=None, help="write every run's report here")
    args = parser.parse_args()
    rows = []
    reports = []
    for i in range(args.runs):
        print(f"run {i + 1} of {args.runs}", flush=True)
        report = run(ReloadConfig(plan=args.plan.split(","), gap=args.gap, rate=args.rate, topics=args.topics,
                                  shards=args.shards, seed=i + 1))
        reports.append(report)
        row = figures(report)
        rows.append(row)
        print(json.dumps({**row, "missed": report["missed"]}), flush=True)
    if args.json:
        args.json.write_text(json.dumps(reports, indent=2, default=str))
    print("medians over", args.runs, "runs:")
    for key in rows[0]:
        values = [r[key] for r in rows if r[key] is not None]
        print(f"  {key:<28} {statistics.median(values) if values else None}")
    return 1 if any(r["missed"] for r in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
