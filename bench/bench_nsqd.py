"""One benchmark for the node, in the shape of NSQ's bench/bench.sh, comparing two nodes in one run.

Scenarios (``--scenarios``, default all; 200-byte messages, ``--runfor`` seconds a phase):

  mpub    one topic, MPUB of 200, 2 connections
  sub     one topic, consume (RDY 2500, FIN each), 2 connections: drains what mpub left
  pub     one topic, PUB one message a round trip, 2 connections
  mpub32  32 topics, MPUB of 200, one connection each
  sub32   32 topics, consume, one connection each
  http    HTTP POST /pub, one message a request, 50 keep-alive connections from 2 wrk threads
          (``bench/wrk.py``, when wrk is installed) or 2 Python load processes
  topics  create ``--topics`` topics, each by its first /mpub of 10 messages and then
          /channel/create; the seconds that took, how long /metrics and /stats?format=json
          take to answer (median of 5), and RSS

and beyond it (``bench/nsqd_beyond.py``: each scenario its own group of fresh nodes):

  tls       MPUB over TLS, then TLS consumers         snappy, deflate  compressed consumers
  idle      10,000 idle connections: accept time, RSS, CPU
  mib       1 MiB messages, MB/s in and out           deferred  1,000,000 DPUB of 60 s waiting
  backlog   draining 5,000,000 messages from disk     latency   publish-to-deliver percentiles
                                                                at half of the peak rate

``--nsq-tools DIR`` loads the TCP scenarios (mpub, sub, pub, mpub32, sub32) with NSQ's own
``bench_writer`` and ``bench_reader`` from DIR instead of the Python load processes
(``bench/nsq_tools.py``: built from NSQ's source; pub is then an MPUB of one message a round
trip, as ``bench_writer --batch-size=1`` sends it, and has no round-trip percentiles).

Each scenario prints its throughput (msgs/s), the server's CPU µs a message (the process and
all its descendants: supervisor and shards), the peak RSS of that tree, and round-trip p50,
p99, p99.9 where a request carries one message (pub, http).

Node A is started from ``--tree`` (default this checkout: its ``python -m pynsqd.supervisor``
with this interpreter and ``PYTHONPATH=tree``), or from ``--nsqd-bin`` (another nsqd binary,
same flags), or is a running node (``--nsqd-tcp-address``, ``--nsqd-http-address`` and
``--nsqd-pid`` to meter). Started nodes are fresh for each group of scenarios (mpub,sub,pub /
mpub32,sub32 / http / topics / each of the others), with a fresh data path that is also their working directory
(never the checkout), free ports, ``--mem-queue-size=1000000`` (backlog: 0; tls adds its
certificate) and defaults otherwise (one shard a CPU), and stopped by pid after it. Node B, from the
``--compare-*`` flags, is optional; with it both nodes run the same scenario one after the
other (A B, then B A on the next repeat), and the output ends with ``figure | A | B | B/A``.
Before each scenario both nodes are let go idle (under 6% of a CPU) and the page cache's dirty
pages are written back (``os.sync``), so that neither's leftover work, nor the kernel writing
back the other's spilled messages, counts against it. ``--repeat N`` prints medians of N runs.

  .venv/bin/python bench/bench_nsqd.py --tree /path/to/base --compare-tree . --repeat 3
  .venv/bin/python bench/bench_nsqd.py --nsqd-bin /path/to/go/nsqd --compare-tree . \
      --nsq-tools /path/to/nsq/bench/bin --repeat 4
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import subprocess
import sys
import tempfile
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import nsq_tools, wrk  # noqa: E402
from bench import nsqd_beyond as beyond  # noqa: E402
from bench import nsqd_scenarios as bench_sh  # noqa: E402
from bench.common import Meter, running_node, write_certs  # noqa: E402
from bench.nsqd_scenarios import Figures, Target  # noqa: E402

SCENARIOS = {**bench_sh.SCENARIOS, **beyond.SCENARIOS}
GROUPS = [*bench_sh.GROUPS, *((name,) for name in beyond.SCENARIOS)]


@dataclass
class Side:
    """How to get node A or B: started from a tree or a binary, or one already running."""

    label: str
    tree: Path | None = None
    binary: str = ""
    tcp: tuple[str, int] | None = None
    http: tuple[str, int] | None = None
    pid: int = 0

    def describe(self) -> str:
        if self.tcp:
            return f"running node tcp {self.tcp[0]}:{self.tcp[1]}, pid {self.pid}"
        if self.binary:
            return f"binary {self.binary}"
        assert self.tree is not None
        commit = subprocess.run(["git", "-C", str(self.tree), "describe", "--always", "--dirty"],
                                capture_output=True, text=True).stdout.strip()
        return f"tree {self.tree} ({commit or 'not a git checkout'})"

    @contextlib.contextmanager
    def node(self, flags: list[str]) -> Iterator[Target]:
        """A fresh node for one group of scenarios (or the running one; the topics the group
        made on it are deleted afterwards)."""
        prefix = f"b{uuid.uuid4().hex[:6]}"
        if self.tcp and self.http:
            target = Target(self.tcp, self.http, Meter(self.pid), prefix)
            try:
                yield target
            finally:
                for topic in target.created:
                    urllib.request.urlopen(urllib.request.Request(
                        f"http://{self.http[0]}:{self.http[1]}/topic/delete?topic={topic}", method="POST"),
                        timeout=60).close()
            return
        command = [self.binary] if self.binary else []
        with tempfile.TemporaryDirectory() as data, running_node(
                data, *flags, "--log-level=info", stop_timeout=120,
                tree=self.tree or ROOT, command=command) as (proc, tcp_port, http_port):
            yield Target(("127.0.0.1", tcp_port), ("127.0.0.1", http_port), Meter(proc.pid), prefix)


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"want host:port, got {text!r}")
    return host, int(port)


def _side(label: str, args: argparse.Namespace, prefix: str) -> Side | None:
    tree, binary = getattr(args, f"{prefix}tree"), getattr(args, f"{prefix}nsqd_bin")
    tcp, http, pid = (getattr(args, f"{prefix}nsqd_{k}") for k in ("tcp_address", "http_address", "pid"))
    flag = f"--{prefix.replace('_', '-')}"
    if sum(map(bool, (tree, binary, tcp or http or pid))) > 1:
        raise SystemExit(f"bench_nsqd.py: node {label}: give a tree, a binary or a running node, not several")
    if tcp or http or pid:
        if not (tcp and http and pid):
            raise SystemExit(f"bench_nsqd.py: node {label}: a running node needs {flag}nsqd-tcp-address, "
                             f"{flag}nsqd-http-address and {flag}nsqd-pid")
        return Side(label, tcp=tcp, http=http, pid=pid)
    if binary:
        return Side(label, binary=os.path.abspath(binary))
    if tree:
        return Side(label, tree=Path(tree).resolve())
    return Side(label, tree=ROOT) if label == "A" else None


def _fmt(value: float) -> str:
    if math.isnan(value):
        return "-"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def run(args: argparse.Namespace, sides: list[Side]) -> dict[str, list[dict[str, Figures]]]:
    """Every selected scenario on every side, interleaved, ``args.repeat`` times; per side the
    list of runs, each scenario → figures."""
    runs: dict[str, list[dict[str, Figures]]] = {s.label: [] for s in sides}
    for rep in range(args.repeat):
        for s in sides:
            runs[s.label].append({})
        order = sides if rep % 2 == 0 else sides[::-1]
        for group in GROUPS:
            names = [n for n in group if n in args.scenarios]
            if not names:
                continue
            flags = beyond.flags(group[0], args.certs, args.mem_queue_size)
            with contextlib.ExitStack() as stack:
                targets = {s.label: stack.enter_context(s.node(flags)) for s in order}
                for name in names:
                    for s in order:
                        for target in targets.values():
                            target.settle()
                        os.sync()  # the other node's spilled writes are not this one's to pay for
                        before = targets[s.label].meter.pids()
                        fig = SCENARIOS[name][1](targets[s.label], args)
                        if targets[s.label].meter.pids() != before:
                            print(f"note: {s.label}'s process tree changed during {name}: its CPU figure is short")
                        runs[s.label][-1][name] = fig
                        print(f"run {rep + 1} {s.label} {name:7s} "
                              + "  ".join(f"{k}={_fmt(v)}" for k, v in fig.items()), flush=True)
    return runs


def table(runs: dict[str, list[dict[str, Figures]]], scenarios: list[str]) -> list[str]:
    """``figure | A [| B | B/A]`` rows of the medians over the runs."""
    labels = list(runs)
    medians = {label: {f"{name} {k}": statistics.median(r[name][k] for r in side_runs)
                       for name in scenarios for k in side_runs[0][name]}
               for label, side_runs in runs.items()}
    head = ["figure", *labels, *(["B/A"] if len(labels) == 2 else [])]
    rows = [head, ["---"] * len(head)]
    for fig, a in medians[labels[0]].items():
        row = [fig, _fmt(a)]
        if len(labels) == 2:
            b = medians[labels[1]].get(fig, math.nan)
            row += [_fmt(b), f"{b / a:.2f}" if a and not math.isnan(a + b) else "-"]
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return [" | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
            for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runfor", type=float, default=8.0, help="seconds of each load phase")
    parser.add_argument("--repeat", type=int, default=1, help="runs; the table shows medians")
    parser.add_argument("--scenarios", type=lambda s: s.split(","), default=list(SCENARIOS),
                        help=f"comma-separated, of {','.join(SCENARIOS)} (default all)")
    parser.add_argument("--topics", type=int, default=2000, help="topics the topics scenario creates")
    parser.add_argument("--size", type=int, default=200, help="message size in bytes")
    parser.add_argument("--mem-queue-size", type=int, default=1_000_000, help="flag of the started nodes")
    parser.add_argument("--loadgen", choices=("wrk", "python"), default="wrk" if wrk.available() else "python",
                        help="HTTP load generator (default: wrk when installed)")
    parser.add_argument("--nsq-tools", type=nsq_tools.check, metavar="DIR",
                        help="load the TCP scenarios with NSQ's bench_writer and bench_reader from DIR")
    for prefix, which in (("", "A"), ("compare-", "B")):
        parser.add_argument(f"--{prefix}tree", help=f"start node {which} from this checkout"
                                                    + (" (default: this one)" if which == "A" else ""))
        parser.add_argument(f"--{prefix}nsqd-bin", help=f"start node {which} from this nsqd binary")
        parser.add_argument(f"--{prefix}nsqd-tcp-address", type=_address, help=f"running node {which}: TCP")
        parser.add_argument(f"--{prefix}nsqd-http-address", type=_address, help=f"running node {which}: HTTP")
        parser.add_argument(f"--{prefix}nsqd-pid", type=int, default=0,
                            help=f"running node {which}: the pid whose process tree to meter")
    args = parser.parse_args()
    unknown = [s for s in args.scenarios if s not in SCENARIOS]
    if unknown:
        raise SystemExit(f"bench_nsqd.py: no scenario {','.join(unknown)} (have {','.join(SCENARIOS)})")
    sides = [s for s in (_side("A", args, ""), _side("B", args, "compare_")) if s]
    for s in sides:
        print(f"{s.label}: {s.describe()}")
    with tempfile.TemporaryDirectory() as certs:
        args.certs = write_certs(certs, "localhost", "127.0.0.1") if "tls" in args.scenarios else {"ca": ""}
        _report(args, sides)


def _report(args: argparse.Namespace, sides: list[Side]) -> None:
    tcp_load = f"NSQ's bench_writer/bench_reader in {args.nsq_tools}" if args.nsq_tools else "Python processes"
    print(f"{args.size}-byte messages, {args.runfor:g} s phases, TCP load from {tcp_load}, "
          f"HTTP load from {args.loadgen}", flush=True)
    runs = run(args, sides)
    print(f"\nmedian of {args.repeat} run(s):")
    print("\n".join(table(runs, [n for n in SCENARIOS if n in args.scenarios])))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
