"""``nsq_to_file``: consume topics and write them to newline-delimited files, rotated, gzipped.

A message is FINed only after the line it became was written and ``fsync``ed (in batches:
when ``max-in-flight`` lines are pending, when the consumer is starved, a quarter second
after the last batch, every ``--sync-interval``, at rotation, and at exit). On SIGINT/SIGTERM it stops taking messages
(CLS), syncs and FINs what it wrote, completes the open files (moved into ``--output-dir``),
and exits 0. Topics come from ``--topic`` or, with lookupd, from ``/topics`` (optionally
filtered by ``--topic-pattern``, refreshed every ``--topic-refresh``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import time

import orjson

from pynsqd.client import Message, NSQError
from pynsqd.client import http as nsq_http
from pynsqd.options import MINUTE, SECOND, UsageError, flag
from pynsqd.shared_flags import http_connect_timeout_flag, http_request_timeout_flag, log_level_flag, log_prefix_flag
from pynsqd.tools import common
from pynsqd.tools.filelog import FileLog, FileLogConfig

log = logging.getLogger("pynsqd.tools")
PROG = "nsq_to_file"


def _gzip_level(value: int) -> str | None:
    return None if 1 <= value <= 9 else "must be between 1 and 9"


@dataclasses.dataclass
class Options(common.ConsumerFlags):
    channel: str = flag("channel", "nsq_to_file", "nsq channel")
    topics: list[str] = flag("topic", [], "nsq topic", kind="strlist")
    topic_pattern: str = flag("topic-pattern", "", "only log topics matching the following pattern")
    topic_refresh: int = flag("topic-refresh", MINUTE, "how frequently the topic list should be refreshed",
                              kind="duration")
    output_dir: str = flag("output-dir", "/tmp", "directory to write output files to")
    work_dir: str = flag("work-dir", "", "directory for in-progress files before moving to output-dir")
    datetime_format: str = flag("datetime-format", "%Y-%m-%d_%H",
                                "strftime compatible format for <DATETIME> in filename format")
    filename_format: str = flag("filename-format", "<TOPIC>.<HOST><REV>.<DATETIME>.log",
                                "output filename format (<TOPIC>, <HOST>, <PID>, <DATETIME>, <REV> are "
                                "replaced. <REV> is increased when file already exists)")
    host_identifier: str = flag("host-identifier", "", "value to output in log filename in place of "
                                "hostname. <SHORT_HOST> and <HOSTNAME> are valid replacement tokens")
    gzip: bool = flag("gzip", False, "gzip output files.")
    gzip_level: int = flag("gzip-level", 6, "gzip compression level (1-9, 1=BestSpeed, 9=BestCompression)",
                           validate=_gzip_level)
    skip_empty_files: bool = flag("skip-empty-files", False, "skip writing empty files")
    rotate_size: int = flag("rotate-size", 0, "rotate the file when it grows bigger than rotate-size bytes")
    rotate_interval: int = flag("rotate-interval", 0, "rotate the file every duration", kind="duration")
    sync_interval: int = flag("sync-interval", 30 * SECOND, "sync file to disk every duration",
                              kind="duration")
    http_client_connect_timeout: int = http_connect_timeout_flag()
    http_client_request_timeout: int = http_request_timeout_flag()
    log_level: str = log_level_flag(checked=False)  # checked at start, as nsq_to_file words it
    log_prefix: str = log_prefix_flag(PROG)

    def file_config(self) -> FileLogConfig:
        return FileLogConfig(
            output_dir=self.output_dir, work_dir=self.work_dir, filename_format=self.filename_format,
            datetime_format=self.datetime_format, host_identifier=self.host_identifier, gzip=self.gzip,
            gzip_level=self.gzip_level, rotate_size=self.rotate_size,
            rotate_interval=self.rotate_interval / SECOND, skip_empty_files=self.skip_empty_files)


class TopicWriter:
    """One topic: its consumer, its file, and the messages written but not yet FINed."""

    def __init__(self, topic: str, opts: Options, consumer_kwargs: dict[str, object]) -> None:
        self.topic = topic
        self.file = FileLog(topic, opts.file_config())
        self.pending: list[Message] = []
        self.batch = opts.max_in_flight
        self.stopping = False
        self.written = 0
        self.consumer = common.consumers_for([topic], opts, lambda _: self.on_message, consumer_kwargs)[0]
        if not opts.skip_empty_files:
            self.file.open(time.time())

    def on_message(self, msg: Message) -> None:
        msg.disable_auto_response()
        now = time.time()
        if self.file.needs_rotation(now):
            self.rotate(now)
        self.file.write(msg.body, now)
        self.pending.append(msg)
        self.written += 1
        if self.stopping or len(self.pending) >= self.batch or self.consumer.is_starved():
            self.sync()
        if self.file.needs_rotation(now):
            self.rotate(now)

    def sync(self) -> None:
        """fsync what was written, then FIN it."""
        if not self.pending:
            return
        self.file.sync()
        pending, self.pending = self.pending, []
        for msg in pending:
            msg.finish()

    def rotate(self, now: float) -> None:
        pending, self.pending = self.pending, []
        final = self.file.close(now)  # fsyncs before the FINs below
        for msg in pending:
            msg.finish()
        if final:
            log.info("%s: completed %s", self.topic, final)
        if not self.file.config.skip_empty_files:
            self.file.open(now)

    def tick(self, now: float) -> None:
        """Every quarter second: rotate when due, and sync + FIN a partial batch, so a
        slow stream's messages are answered promptly (NSQ waits for --sync-interval)."""
        if self.file.needs_rotation(now):
            self.rotate(now)
        elif self.pending:
            self.sync()

    async def stop(self) -> None:
        self.stopping = True
        self.sync()
        await self.consumer.stop()
        self.sync()
        final = self.file.close(time.time())
        if final:
            log.info("%s: completed %s", self.topic, final)


async def _discover_topics(opts: Options) -> list[str]:
    pattern = re.compile(opts.topic_pattern) if opts.topic_pattern else None
    topics: set[str] = set()
    async with nsq_http.make_client(opts.http_client_connect_timeout / SECOND,
                                    opts.http_client_request_timeout / SECOND) as client:
        for address in opts.lookupd_http_addresses:
            try:
                resp = await nsq_http.request(client, "GET", f"{nsq_http.base_url(address)}/topics")
                data = orjson.loads(resp.content)
            except (NSQError, orjson.JSONDecodeError) as exc:
                log.warning("lookupd %s: %s", address, exc)
                continue
            if isinstance(data, dict) and "topics" not in data:
                data = data.get("data", {})
            topics.update(t for t in data.get("topics", []) if isinstance(t, str))
    return sorted(t for t in topics if pattern is None or pattern.search(t))


async def main_async(opts: Options, stop: asyncio.Event) -> int:
    kwargs = common.consumer_options(opts.consumer_opts)
    writers: dict[str, TopicWriter] = {}

    async def add(topic: str) -> None:
        if topic not in writers:
            writers[topic] = TopicWriter(topic, opts, kwargs)
            await writers[topic].consumer.start()
            log.info("consuming %s/%s", topic, opts.channel)

    for topic in opts.topics:
        await add(topic)
    discover = not opts.topics
    next_refresh = 0.0
    sync_every = opts.sync_interval / SECOND
    next_sync = time.monotonic() + sync_every
    last_report = time.monotonic()
    while not stop.is_set():
        now = time.monotonic()
        if discover and now >= next_refresh:
            for topic in await _discover_topics(opts):
                await add(topic)
            next_refresh = now + opts.topic_refresh / SECOND
        wall = time.time()
        for w in writers.values():
            w.tick(wall)
        if now >= next_sync:
            for w in writers.values():
                w.sync()
            next_sync = now + sync_every
        if now - last_report >= 10:
            last_report = now
            log.info("written: %s", ", ".join(f"{t}={w.written}" for t, w in writers.items()) or "nothing yet")
        try:
            await asyncio.wait_for(stop.wait(), 0.25)
        except TimeoutError:
            pass
    await asyncio.gather(*(w.stop() for w in writers.values()))
    log.info("stopped; written: %s", ", ".join(f"{t}={w.written}" for t, w in writers.items()))
    return 0


def check(opts: Options) -> None:
    opts.check_sources()
    if not opts.topics and not opts.lookupd_http_addresses:
        raise UsageError("--topic is required (or --lookupd-http-address to discover topics)")
    if opts.topics and opts.topic_pattern:
        raise UsageError("use --topic to list topics or --topic-pattern to match them, not both")
    if (opts.rotate_size > 0 or opts.rotate_interval > 0) and "<REV>" not in opts.filename_format:
        raise UsageError("missing <REV> in --filename-format when --rotate-size or --rotate-interval is set")
    if opts.topic_pattern:
        try:
            re.compile(opts.topic_pattern)
        except re.error as exc:
            raise UsageError(f"invalid --topic-pattern: {exc}") from None


TOOL = common.Tool(PROG, Options, "consume topics and write them to newline-delimited files", check, main_async,
                   setup_logs=lambda opts: common.setup_logging_prefix(opts.log_prefix, opts.log_level))
run, main = TOOL.run, TOOL.main


if __name__ == "__main__":
    main()
