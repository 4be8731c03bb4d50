"""The ``nsqadmin`` command: parse flags, bind, serve on uvloop until SIGTERM/SIGINT.

Exit status: 0 after a clean shutdown (including on SIGTERM or SIGINT), 1 for a bad flag
or config file (one line on stderr) or a listener that cannot bind.
"""

from __future__ import annotations

import asyncio
import sys
from typing import NoReturn

import uvloop

from pynsqd import NSQ_VERSION, __version__
from pynsqd.admin.config import parse_args
from pynsqd.admin.node import AdminNode
from pynsqd.options import run_cli


def version_string() -> str:
    return f"nsqadmin v{NSQ_VERSION} (built w/pynsqd {__version__})"


def run(argv: list[str]) -> int:
    """Run nsqadmin with ``argv``; returns the exit status. Raises ``UsageError``."""
    options, show_version = parse_args(argv)
    if show_version:
        print(version_string())
        return 0
    node = AdminNode(options)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(node.main())
    return 0


def main(argv: list[str] | None = None) -> NoReturn:
    """Console-script entry point."""
    run_cli(run, "nsqadmin", argv if argv is not None else sys.argv[1:])
