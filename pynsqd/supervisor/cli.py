"""``nsqd-supervisor`` / ``nsqd``: parse NSQ's flags and run the node.

This build serves the node from a single shard in this process; the multi-shard process
tree (one worker per core) replaces ``_serve`` without changing the command line.
"""

from __future__ import annotations

import sys

import uvloop

from pynsqd import NSQ_VERSION, __version__, logs
from pynsqd.options import run_cli
from pynsqd.shard.config import parse_args
from pynsqd.shard.node import NsqdNode


def _main(argv: list[str]) -> int:
    opts, version = parse_args(argv, prog="nsqd")
    if version:
        print(f"nsqd v{NSQ_VERSION} (pynsqd {__version__}, python {sys.version.split()[0]})")
        return 0
    logs.setup(opts.log_prefix, opts.log_level)
    node = NsqdNode(opts)
    uvloop.run(node.main())
    return 0


def main() -> None:
    run_cli(_main, prog="nsqd")


if __name__ == "__main__":
    main()
