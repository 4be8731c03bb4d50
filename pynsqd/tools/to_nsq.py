"""``to_nsq``: read stdin, split it on ``--delimiter``, publish each part to ``--topic`` on
every ``--nsqd-tcp-address`` (as NSQ's does), optionally at most ``--rate`` messages/s.

Publishes are pipelined (up to ``WINDOW`` unanswered PUBs per nsqd; each is still one PUB
answered by its own OK). Empty parts are skipped (nsqd refuses empty messages). At EOF, or
on SIGINT/SIGTERM (stop reading), it waits for every outstanding answer and exits 0; a
publish error ends it with status 1. While it runs, progress goes to stderr every 10 s
(``N messages published so far``); the final count (``published N messages``) is printed
once, at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import stat
import sys
import time
from collections.abc import AsyncGenerator
from typing import cast

from pynsqd.client import NSQError
from pynsqd.options import UsageError, flag
from pynsqd.tools import common

log = logging.getLogger("pynsqd.tools")
PROG = "to_nsq"
WINDOW = 256
READ_SIZE = 1 << 16
REPORT_EVERY = 10.0  # seconds between progress lines


class Progress:
    """Progress lines at most every ``REPORT_EVERY`` seconds, only when the count moved; the
    final count is ``final``'s, once."""

    def __init__(self, now: float) -> None:
        self.last_time = now
        self.last_count = 0

    def line(self, now: float, count: int) -> str | None:
        if now - self.last_time < REPORT_EVERY or count == self.last_count:
            return None
        self.last_time, self.last_count = now, count
        return f"{count} messages published so far"

    @staticmethod
    def final(count: int) -> str:
        return f"published {count} messages"


@dataclasses.dataclass
class Options:
    topic: str = flag("topic", "", "NSQ topic to publish to")
    delimiter: str = flag("delimiter", "\n", "character to split input from stdin")
    nsqd_tcp_addresses: list[str] = flag("nsqd-tcp-address", [], "destination nsqd TCP address", kind="strlist")
    producer_opts: list[str] = common.producer_opt_flag()
    rate: int = flag("rate", 0, "Throttle messages to n/second. 0 to disable")


class _PipeReader(asyncio.Protocol):
    """stdin as a pipe: chunks into a queue, reading paused while the queue is long."""

    def __init__(self, queue: asyncio.Queue[bytes | None]) -> None:
        self.queue = queue
        self.transport: asyncio.ReadTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.ReadTransport, transport)

    def data_received(self, data: bytes) -> None:
        self.queue.put_nowait(data)
        if self.queue.qsize() >= 64 and self.transport is not None:
            self.transport.pause_reading()

    def eof_received(self) -> bool:
        self.queue.put_nowait(None)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.queue.put_nowait(None)


async def stdin_chunks() -> AsyncGenerator[bytes, None]:
    """stdin in chunks, without a thread: a regular file is read directly (reads of a file do
    not block), a pipe or terminal through the event loop (so a signal can end the wait)."""
    fd = sys.stdin.fileno()
    if stat.S_ISREG(os.fstat(fd).st_mode):
        while chunk := os.read(fd, READ_SIZE):
            yield chunk
            await asyncio.sleep(0)
        return
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()
    transport, _ = await asyncio.get_running_loop().connect_read_pipe(lambda: _PipeReader(queue), sys.stdin)
    try:
        while (item := await queue.get()) is not None:
            if queue.qsize() < 16:
                transport.resume_reading()
            yield item
    finally:
        transport.close()


class Pacer:
    """At most ``rate`` events per second (0: unlimited), in virtual or real time."""

    def __init__(self, rate: int, start: float) -> None:
        self.interval = 1.0 / rate if rate > 0 else 0.0
        self.next = start

    def delay(self, now: float) -> float:
        """Seconds to wait before the next event; books it."""
        if self.interval == 0.0:
            return 0.0
        wait = max(0.0, self.next - now)
        self.next = max(self.next, now) + self.interval
        return wait


async def main_async(opts: Options, stop: asyncio.Event) -> int:
    producers = list(common.producers_for(opts.nsqd_tcp_addresses, opts.producer_opts).values())
    try:
        for p in producers:
            await p.connect()
    except NSQError as exc:  # unreachable, TLS handshake or AUTH refused: one line, exit 1
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        for p in producers:
            await p.close()
        return 1
    window = asyncio.Semaphore(WINDOW)
    failed: list[BaseException] = []
    pending: set[asyncio.Task[None]] = set()
    published = 0

    async def publish(body: bytes) -> None:
        nonlocal published
        try:
            await asyncio.gather(*(p.publish(opts.topic, body) for p in producers))
            published += 1
        except NSQError as exc:
            failed.append(exc)
            stop.set()
        finally:
            window.release()

    loop = asyncio.get_running_loop()
    chunks = stdin_chunks()
    pacer = Pacer(opts.rate, loop.time())
    delimiter = opts.delimiter.encode()[:1]
    rest = b""
    progress = Progress(time.monotonic())
    eof = False
    while not eof and not stop.is_set():
        getter = asyncio.ensure_future(anext(chunks, None))
        stopper = asyncio.ensure_future(stop.wait())
        await asyncio.wait([getter, stopper], return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if not getter.done():
            getter.cancel()  # and let it finish cancelling, so the generator can be closed
            with contextlib.suppress(asyncio.CancelledError):
                await getter
            break
        chunk = getter.result()
        if chunk is None:
            eof = True
            parts = [rest] if rest else []
        else:
            parts = (rest + chunk).split(delimiter)
            rest = parts.pop()
        for body in parts:
            if stop.is_set():
                break
            if not body:
                continue
            wait = pacer.delay(loop.time())
            if wait:
                await asyncio.sleep(wait)
            await window.acquire()
            task = asyncio.ensure_future(publish(body))
            pending.add(task)
            task.add_done_callback(pending.discard)
        line = None if eof else progress.line(time.monotonic(), published)
        if line:
            log.info("%s", line)
    await asyncio.gather(*pending)
    await chunks.aclose()
    for p in producers:
        await p.close()
    log.info("%s", progress.final(published))
    if failed:
        print(f"{PROG}: error: {failed[0]}", file=sys.stderr)
        return 1
    return 0


def check(opts: Options) -> None:
    if not opts.topic:
        raise UsageError("--topic required")
    if not opts.nsqd_tcp_addresses:
        raise UsageError("--nsqd-tcp-address required")
    if len(opts.delimiter.encode()) != 1:
        raise UsageError("--delimiter must be a single character")
    if opts.rate < 0:
        raise UsageError("--rate must not be negative")


TOOL = common.Tool(PROG, Options, "publish lines from stdin to nsqd", check, main_async)
run, main = TOOL.run, TOOL.main


if __name__ == "__main__":
    main()
