"""What the commands of ``cli.py`` run. ``nsqd-supervisor`` / ``nsqd``: parse NSQ's flags
and run the node as a supervisor with ``--shards`` shard processes (``arbiter.py``), the
first ones forked by the zygote ``cli.py`` started; and ``nsqd-reclaim-shm``, which removes
the shared memory of stopped nodes whose data path is gone (``node/shmowner.py``)."""

from __future__ import annotations

import functools
import gc
import os
import sys

import uvloop

from pynsqd import NSQ_VERSION, __version__, logs
from pynsqd.node.boot import IMPORT_CHECK
from pynsqd.node.config import parse_args
from pynsqd.node.shmowner import reclaim
from pynsqd.node.zygote import Zygote
from pynsqd.options import Parser, UsageError, run_cli
from pynsqd.shm.cpu import this_host_refusal
from pynsqd.supervisor.arbiter import Supervisor
from pynsqd.supervisor.upgrade import Inherited


def _main(argv: list[str], zygote: Zygote | None) -> int:
    opts, version = parse_args(argv, prog="nsqd")
    if version:
        print(f"nsqd v{NSQ_VERSION} (pynsqd {__version__}, python {sys.version.split()[0]})")
        return 0
    why = this_host_refusal()
    if why:
        raise UsageError(why)
    if os.environ.get(IMPORT_CHECK):  # an upgrade's preflight: the installed code runs this far
        return 0
    logs.setup(opts.log_prefix, opts.log_level)
    inherited = Inherited.from_environment()  # then ``cli.main`` started no zygote
    supervisor = Supervisor(opts, opts.shards, inherited, zygote)
    supervisor.argv = list(argv)
    gc.freeze()  # the collector was off since ``cli.main``: what is here now stays
    gc.enable()
    return uvloop.run(supervisor.main())


def nsqd(zygote: Zygote | None) -> None:
    run_cli(functools.partial(_main, zygote=zygote), prog="nsqd")


RECLAIM = "nsqd-reclaim-shm"


def _reclaim(argv: list[str]) -> int:
    parser = Parser(prog=RECLAIM, description=(
        "Remove the shared memory (/dev/shm) left by pynsqd nodes that no longer run and whose "
        "--data-path was removed or replaced. A running node's, or a stopped one's whose data path "
        "is still there (a restart recovers it), is never touched. Every nsqd does this at start too."))
    parser.add_argument("--dry-run", action="store_true", help="only list what would be removed")
    dry_run = parser.parse_args(argv).dry_run
    gone = reclaim(dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    for g in gone:
        print(f"{RECLAIM}: {verb} {g.segments} segments ({g.size / (1 << 20):.1f} MiB) of the stopped node "
              f"on {g.data_path} ({g.reason})")
    if not gone:
        print(f"{RECLAIM}: nothing to remove")
    return 0


def reclaim_main() -> None:
    run_cli(_reclaim, prog=RECLAIM)
