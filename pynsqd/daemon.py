"""What the nsqlookupd and nsqadmin daemons share: their command, their logger, their stop.

Theory of operation
-------------------
``command(prog, parse_args, make_node)`` is a daemon's console-script entry point: it parses
the flags (a bad one is one line on stderr and exit status 1, ``pynsqd.options.run_cli``),
prints the version for ``--version``, and otherwise builds the node, whose constructor binds
its listeners (so a port that cannot be bound is a usage error too, and port 0 works), and
runs ``await node.main()`` on uvloop until it returns; then it exits 0.

``StopRequest`` is how ``main`` learns to stop. ``exit()`` sets it; it is safe to call more
than once and before ``main`` runs. While ``main`` runs inside ``armed()``, SIGTERM and
SIGINT only call ``exit()`` (signal handlers only enqueue); ``await wait()`` returns once
a stop was asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Iterator, Sequence
from typing import NoReturn, Protocol, TypeVar

import uvloop

from pynsqd import logs
from pynsqd.options import run_cli, version_string
from pynsqd.signals import signals_to

O = TypeVar("O")  # noqa: E741
SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Node(Protocol):
    async def main(self) -> None: ...


class Main(Protocol):
    """A console-script entry point: ``main()`` reads ``sys.argv``; it never returns."""

    def __call__(self, argv: list[str] | None = None) -> NoReturn: ...


def command(prog: str, parse_args: Callable[[Sequence[str]], tuple[O, bool]],
            make_node: Callable[[O], Node]) -> Main:
    """The daemon ``prog``'s console-script ``main(argv=None)``."""
    def run(argv: list[str]) -> int:
        options, show_version = parse_args(argv)
        if show_version:
            print(version_string(prog))
            return 0
        node = make_node(options)
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(node.main())
        return 0

    def main(argv: list[str] | None = None) -> NoReturn:
        run_cli(run, prog, argv)
    return main


def daemon_logger(name: str, prefix: str, level: str) -> logging.Logger:
    """Set up NSQ-style logging for the process and return the daemon's logger."""
    logs.setup(prefix, level)
    return logging.getLogger(name)


class StopRequest:
    """A daemon's request to stop: set by ``exit()``, and by SIGTERM/SIGINT while armed."""

    def __init__(self) -> None:
        self._event: asyncio.Event | None = None
        self._requested = False

    def exit(self) -> None:
        self._requested = True
        if self._event is not None:
            self._event.set()

    @contextlib.contextmanager
    def armed(self) -> Iterator[None]:
        """On the running loop: route SIGTERM and SIGINT to ``exit()`` until the block ends."""
        self._event = asyncio.Event()
        if self._requested:
            self._event.set()
        with signals_to(lambda _: self.exit(), SIGNALS):
            yield

    async def wait(self) -> None:
        """Return once a stop was asked for (inside ``armed()``)."""
        assert self._event is not None, "StopRequest.wait() outside armed()"
        await self._event.wait()
