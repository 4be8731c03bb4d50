"""``nsq_tail``: consume topics and print the messages to stdout, in the spirit of tail(1).

Each message is written (and stdout flushed) before it is FINed. ``-n N`` exits after N
messages; the ones nsqd had already sent beyond N are requeued at once, not lost. The default
channel is a fresh ``tail<random>#ephemeral``, as NSQ's, so tailing never leaves a channel
behind. SIGINT/SIGTERM: stop, answer everything, exit 0.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import sys
from typing import BinaryIO

from pynsqd.client import Message
from pynsqd.options import UsageError, flag
from pynsqd.tools import common

PROG = "nsq_tail"


@dataclasses.dataclass
class Options(common.ConsumerFlags):
    topics: list[str] = flag("topic", [], "NSQ topic", kind="strlist")
    total: int = flag("n", 0, "total messages to show (will wait if starved)")
    print_topic: bool = flag("print-topic", False, "print topic name where message was received")


class Tail:
    def __init__(self, opts: Options, out: BinaryIO, done: asyncio.Event) -> None:
        self.opts = opts
        self.out = out
        self.done = done
        self.shown = 0

    def handler(self, topic: str) -> common.HandlerFn:
        prefix = f"{topic} | ".encode() if self.opts.print_topic else b""

        def handle(msg: Message) -> None:
            if self.opts.total and self.shown >= self.opts.total:
                msg.requeue(0, backoff=False)  # beyond -n: give it back
                return
            self.out.write(prefix + msg.body + b"\n")
            self.out.flush()
            self.shown += 1
            if self.opts.total and self.shown >= self.opts.total:
                self.done.set()
        return handle


async def main_async(opts: Options, stop: asyncio.Event, out: BinaryIO) -> int:
    kwargs = common.consumer_options(opts.consumer_opts)
    max_in_flight = opts.max_in_flight
    if opts.total and opts.total < max_in_flight:
        max_in_flight = opts.total
    kwargs.setdefault("max_in_flight", max_in_flight)
    tail = Tail(opts, out, stop)
    await common.consume_until(stop, common.consumers_for(opts.topics, opts, tail.handler, kwargs))
    return 0


def check(opts: Options) -> None:
    opts.check_sources()
    if not opts.topics:
        raise UsageError("--topic required")
    if opts.total < 0:
        raise UsageError("-n must not be negative")
    if not opts.channel:
        opts.channel = f"tail{random.randrange(1000000):06d}#ephemeral"


TOOL = common.Tool(PROG, Options, "consume topics and print the messages to stdout", check,
                   lambda opts, stop: main_async(opts, stop, sys.stdout.buffer), log_level="warn")
run, main = TOOL.run, TOOL.main


if __name__ == "__main__":
    main()
