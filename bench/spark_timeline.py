"""Where a micro-batch's time goes: the ``nsq`` source's trace files as a per-batch table.

    PYNSQD_SPARK_TRACE=/tmp/trace .venv/bin/python bench/bench_spark.py --only source --repeat 1
    .venv/bin/python bench/spark_timeline.py /tmp/trace [--runner PID] [--events]

Every process of the source (the driver-side runner, executor Python workers) appends
``monotonic-seconds event key=value ...`` lines to ``<dir>/<pid>.trace``
(``pynsqd.spark.trace``). This merges them and, for the runner with the most batches (or
``--runner``), prints one row per micro-batch, in milliseconds:

- ``take``: ``latestOffset`` — taking buffered messages and framing them into served parts (ours);
- ``offlog``: ``latestOffset`` returned → ``commit`` of the previous batch (Spark writes
  ``offsets/``);
- ``fin``: ``commit`` — the FINs of the previous batch handed to the connections (ours);
- ``plan``: ``commit`` returned → ``partitions`` (Spark plans the batch);
- ``sched``: ``partitions`` → the first executor ``read`` (task launch);
- ``read``: first ``read`` start → last ``read`` end (executors fetch the parts and parse them into Arrow, the
  JVM consumes it);
- ``done``: last ``read`` end → the next ``latestOffset`` (Spark commits the sink and
  ``commits/``, then triggers the next batch);

and the batch's rows, the messages received from nsqd during the cycle, and the cycle's length.
``--events`` prints the merged event list instead (runs of receipts folded into one line).
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections import defaultdict
from pathlib import Path

Event = tuple[float, int, str, dict[str, str]]
PHASES = ["take", "offlog", "fin", "plan", "sched", "read", "done"]


def load(directory: str) -> list[Event]:
    events: list[Event] = []
    for path in Path(directory).glob("*.trace"):
        pid = int(path.stem)
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) < 2:
                continue
            fields = dict(p.split("=", 1) for p in parts[2:] if "=" in p)
            events.append((float(parts[0]), pid, parts[1], fields))
    events.sort(key=lambda e: e[0])
    return events


def pick_runner(events: list[Event]) -> int:
    counts: dict[int, int] = defaultdict(int)
    for _, pid, name, _ in events:
        if name == "latest.in":
            counts[pid] += 1
    if not counts:
        raise SystemExit("no latestOffset in the trace: was PYNSQD_SPARK_TRACE set for the run?")
    return max(counts, key=lambda pid: counts[pid])


def cycles(events: list[Event], runner: int) -> list[dict[str, float]]:
    """One row per batch planned by ``runner``: phase lengths (ms), rows, messages received."""
    mine = [e for e in events if e[1] == runner]
    if not mine:
        return []
    # batch seq → read start/end times (other queries reuse the numbers: each read is matched
    # to the cycle it falls in below)
    reads: dict[str, list[float]] = defaultdict(list)
    for t, _, name, fields in events:
        if name in ("read.in", "read.out"):
            reads[fields["part"].split("-")[0].lstrip("0") or "0"].append(t)
    marks: list[tuple[float, str, dict[str, str]]] = [(t, n, f) for t, _, n, f in mine]
    starts = [i for i, (_, name, _) in enumerate(marks) if name == "latest.in"]
    rows: list[dict[str, float]] = []
    for k, i in enumerate(starts[:-1]):
        nxt = starts[k + 1]
        seg = marks[i:nxt]
        at = {name: t for t, name, _ in seg}
        took = next((f for _, name, f in seg if name == "latest.took"), {})
        out = next((f for _, name, f in seg if name == "latest.out"), {})
        seq = out.get("end", "")
        if not took.get("rows") or took["rows"] == "0" or "partitions" not in at:
            continue
        t_next = marks[nxt][0]
        span = [t for t in reads.get(seq, []) if at["partitions"] <= t <= t_next]
        received = sum(int(f.get("n", 0)) for t, _, n, f in events
                       if n == "recv" and at["latest.in"] <= t < t_next)
        row = {"seq": float(seq), "rows": float(took["rows"]), "received": float(received),
               "cycle": (t_next - at["latest.in"]) * 1e3,
               "take": (at["latest.out"] - at["latest.in"]) * 1e3}
        commit_in, commit_out = at.get("commit.in", at["latest.out"]), at.get("commit.out", at["latest.out"])
        row["offlog"] = (commit_in - at["latest.out"]) * 1e3
        row["fin"] = (commit_out - commit_in) * 1e3
        row["plan"] = (at["partitions"] - commit_out) * 1e3
        if span:
            row["sched"] = (min(span) - at["partitions"]) * 1e3
            row["read"] = (max(span) - min(span)) * 1e3
            row["done"] = (t_next - max(span)) * 1e3
        rows.append(row)
    return rows


def print_events(events: list[Event]) -> None:
    t0 = events[0][0]
    run: list[Event] = []

    def flush() -> None:
        if run:
            n = sum(int(e[3].get("n", 0)) for e in run)
            last = run[-1][3]
            print(f"{(run[0][0] - t0) * 1e3:9.1f} ..{(run[-1][0] - t0) * 1e3:9.1f}  recv {n} in {len(run)} runs "
                  f"(in flight {last.get('inflight')}, buffered {last.get('buffered')})")
            run.clear()

    for event in events:
        t, pid, name, fields = event
        if name == "recv":
            if run and t - run[-1][0] > 0.02:
                flush()
            run.append(event)
            continue
        flush()
        print(f"{(t - t0) * 1e3:9.1f}  {pid:>7} {name:12s} {' '.join(f'{k}={v}' for k, v in fields.items())}")
    flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("directory")
    parser.add_argument("--runner", type=int, help="the runner pid (default: the one with the most batches)")
    parser.add_argument("--events", action="store_true", help="print the merged events instead")
    args = parser.parse_args()
    if not os.path.isdir(args.directory):
        raise SystemExit(f"{args.directory}: not a directory")
    events = load(args.directory)
    if args.events:
        print_events(events)
        return
    rows = cycles(events, args.runner or pick_runner(events))
    cols = ["seq", "rows", "received", *PHASES, "cycle"]
    print(" ".join(f"{c:>8}" for c in cols))
    for row in rows:
        print(" ".join(f"{row[c]:8.0f}" if c in row else f"{'-':>8}" for c in cols))
    if rows:
        print(" ".join(f"{statistics.median(r[c] for r in rows if c in r):8.0f}" if c != "seq" else f"{'median':>8}"
                       for c in cols))


if __name__ == "__main__":
    main()
