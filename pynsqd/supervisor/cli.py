"""``nsqd-supervisor`` / ``nsqd``: parse NSQ's flags and run the node as a supervisor with
``--shards`` shard processes (``arbiter.py``)."""

from __future__ import annotations

import os
import sys

import uvloop

from pynsqd import NSQ_VERSION, __version__, logs
from pynsqd.node.boot import IMPORT_CHECK
from pynsqd.node.config import parse_args
from pynsqd.options import UsageError, run_cli
from pynsqd.shm.cpu import this_host_refusal
from pynsqd.supervisor.arbiter import Supervisor
from pynsqd.supervisor.upgrade import Inherited


def _main(argv: list[str]) -> int:
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
    supervisor = Supervisor(opts, opts.shards, Inherited.from_environment())
    supervisor.argv = list(argv)
    return uvloop.run(supervisor.main())


def main() -> None:
    run_cli(_main, prog="nsqd")


if __name__ == "__main__":
    main()
