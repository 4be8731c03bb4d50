"""Mixed load through rolling restarts and upgrades of the supervisor, judged as the chaos
soak judges, with the figures a restart is measured by.

The load is the soak's (``load.py``): TCP producers (PUB, MPUB, DPUB), HTTP producers (``/pub``,
``/mpub``, ``/pub?defer=``), plain consumers that FIN, REQ (at once, with a delay) and hold
with TOUCH, two per channel, plus one consumer over TLS and one over snappy, each alone on a
topic of its own (their connections cannot move: they are closed at each restart, and what
they held is delivered again). A *connector* opens a new TCP connection and publishes on it,
again and again, to see whether a connection attempt is ever refused or kept waiting.

Every restart is a fault of the soak's ``Faults`` (``reload``: SIGHUP; ``upgrade``: SIGUSR2),
recorded in the ledger; each shard's hand-over (when its process closed what cannot move, as
the node logs it) is recorded as a crash of the TLS and snappy topics, so what their consumers
get again counts as explained. The verdict is ``ledger.verdict``'s (lost,
early, duplicates not explained) and ``restarts``' (plain consumers disconnected, publish
errors), with the connector's refusals; the figures are the publish stall in the restarts
(send to acknowledgement), the connector's longest wait, and each shard's hand-over time as
the node logs it.
"""

from __future__ import annotations

import asyncio
import datetime
import random
import re
import resource
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import uvloop

from bench.chaos import restarts
from bench.chaos.faults import RESTARTS, Faults
from bench.chaos.ledger import Ledger, Rules, verdict
from bench.chaos.load import Consumer, HttpProducer, Mix, Producer, TcpProducer, UpgradedConsumer
from bench.chaos.node import Node, raise_own_nofile
from pynsqd.wire import MAGIC_V2
from pynsqd.wire.commands import encode_pub
from pynsqd.wire.frames import FRAME_RESPONSE, FrameParser
from testbed.certs import Certs

PROBE_TOPIC = "reload_probe#ephemeral"
UPGRADED = {"tls_t": "tls", "snappy_t": "snappy"}  # topic → its one channel, for an upgraded consumer
_HANDED = re.compile(r"shard (\d+): replaced \(pid \d+ -> \d+\): drained in ([\d.]+)s, handed over in ([\d.]+)s")


@dataclass
class ReloadConfig:
    plan: list[str] = field(default_factory=lambda: ["reload", "reload", "upgrade", "reload"])
    warmup: float = 5.0  # seconds of load before the first restart
    gap: float = 4.0  # seconds of load between two restarts, and after the last
    rate: float = 300.0  # messages/s over all producers
    topics: int = 4
    shards: int = 2
    seed: int = 1
    drain_timeout: float = 60.0
    flags: list[str] = field(default_factory=lambda: ["--mem-queue-size=1000", "--msg-timeout=30s"])
    node_log: str | None = None
    workdir: str | None = None
    mix: Mix = field(default_factory=lambda: Mix(defer_ms=(200, 5_000), req_delay_ms=(200, 5_000)))


class Connector:
    """New TCP connections, one PUB each, one after another."""

    def __init__(self, address: Any) -> None:
        self.address = address
        self.answered = 0
        self.failed: list[tuple[float, str]] = []
        self.waits: list[tuple[float, float]] = []  # (started, seconds to the OK)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            started = time.monotonic()
            try:
                await asyncio.wait_for(self._once(), 30)
            except (OSError, TimeoutError, ConnectionError) as exc:
                self.failed.append((started, repr(exc)))
                await asyncio.sleep(0.05)
                continue
            self.answered += 1
            self.waits.append((started, time.monotonic() - started))

    async def _once(self) -> None:
        reader, writer = await asyncio.open_connection(*self.address()[0])
        try:
            writer.write(MAGIC_V2 + encode_pub(PROBE_TOPIC, b"probe"))
            parser = FrameParser()
            while True:
                data = await reader.read(1 << 16)
                if not data:
                    raise ConnectionError("closed before OK")
                for frame in parser.feed(data):
                    if frame == (FRAME_RESPONSE, b"OK"):
                        return
                    if frame != (FRAME_RESPONSE, b"_heartbeat_"):
                        raise ConnectionError(f"answered {frame!r}")
        finally:
            writer.close()


def run(cfg: ReloadConfig) -> dict[str, Any]:
    raise_own_nofile()
    with tempfile.TemporaryDirectory(dir=cfg.workdir, prefix="reload-") as work:
        certs = Certs.make(Path(work))
        data = Path(work) / "data"
        data.mkdir()
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        node = Node(data, cfg.shards, nofile, 10.0, [*cfg.flags, "--log-level=info", *certs.server_args()])
        try:
            node.start()
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                report = runner.run(_run(cfg, node, certs))
        finally:
            node.stop()
            if cfg.node_log:
                Path(cfg.node_log).write_text("\n".join(node.log) + "\n")
    report["handovers"] = [{"shard": int(m.group(1)), "drained_s": float(m.group(2)),
                            "handed_over_s": float(m.group(3))}
                           for line in node.log if (m := _HANDED.search(line))]
    report["missed"] = missed(report, cfg)
    return report


async def _run(cfg: ReloadConfig, node: Node, certs: Certs) -> dict[str, Any]:
    rng = random.Random(cfg.seed)
    topics = [f"reload{i:02d}" for i in range(cfg.topics)]
    channels = {**{t: ["a", "b"] for t in topics}, **{t: [ch] for t, ch in UPGRADED.items()}}
    for topic, names in channels.items():
        await asyncio.to_thread(node.create, topic, names)
    ledger = Ledger(channels)
    stop_load, stop_consumers = asyncio.Event(), asyncio.Event()
    consumers: list[Consumer] = [Consumer(ledger, node.address, t, ch, rng.choice((5, 20, 50)),
                                          random.Random(rng.random()), cfg.mix)
                                 for t in topics for ch in channels[t] for _ in range(2)]
    consumers.append(UpgradedConsumer(ledger, node.address, "tls_t", "tls", 20, random.Random(rng.random()),
                                      cfg.mix, tls=certs.client_context()))
    consumers.append(UpgradedConsumer(ledger, node.address, "snappy_t", "snappy", 20, random.Random(rng.random()),
                                      cfg.mix, compression="snappy"))
    every = [*topics, *UPGRADED]
    producers: list[Producer] = [
        *(TcpProducer(ledger, node.address, every, cfg.rate * 0.7 / 3, random.Random(rng.random()), cfg.mix)
          for _ in range(3)),
        *(HttpProducer(ledger, node.address, every, cfg.rate * 0.3 / 2, random.Random(rng.random()), cfg.mix)
          for _ in range(2))]
    connector = Connector(node.address)
    tasks = [asyncio.create_task(c.run(stop_consumers)) for c in consumers]
    tasks += [asyncio.create_task(p.run(stop_load)) for p in [*producers, connector]]
    faults = Faults(node, ledger, random.Random(rng.random()), 0.0, 0.0, 0)
    await asyncio.sleep(cfg.warmup)
    done = []
    for kind in cfg.plan:
        outcome = await asyncio.to_thread(faults.inject, kind)
        done.append({"kind": kind, **outcome})
        print(f"  {kind}: {outcome['completed_after_s']} s", flush=True)
        await asyncio.sleep(cfg.gap)
    stop_load.set()
    for c in consumers:
        c.finish_all = True
    drain_start = time.monotonic()
    while time.monotonic() - drain_start < cfg.drain_timeout and ledger.unsettled():  # noqa: ASYNC110
        await asyncio.sleep(0.5)  # a condition over the whole ledger: polled
    await asyncio.sleep(2)  # late repeats still count
    stop_consumers.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    for at in handed_over(node.new_lines()):  # the moments TLS and compressed connections were closed
        ledger.crash(at, "a shard's hand-over closes TLS and compressed connections", frozenset(UPGRADED))
    spans = restarts.windows(ledger, RESTARTS)
    report = verdict(ledger, Rules(msg_timeout=30.0))
    report.update({
        "restarts_done": done,
        "disconnected": restarts.disconnected(ledger, spans, frozenset(UPGRADED)),
        "upgraded_connections": sum(c.connected for c in consumers if isinstance(c, UpgradedConsumer)),
        "publish_errors": restarts.publish_errors(producers, spans),
        "producer_errors": sum(p.errors for p in producers),
        "stall": restarts.stalls(producers, spans),
        "connector": {"answered": connector.answered, "refused_or_failed": len(connector.failed),
                      "failures": [why for _, why in connector.failed[:5]],
                      "longest_wait_ms": round(max((w for _, w in connector.waits), default=0) * 1000, 1),
                      "longest_wait_in_restarts_ms": round(max(
                          (w for s, w in connector.waits if any(a <= s <= b for a, b in spans)), default=0) * 1000, 1)},
        "config": {k: v for k, v in asdict(cfg).items() if k != "mix"}})
    return report


_HANDING = re.compile(r"^\[nsqd\] \[shard \d+\] (\S+ \S+) INFO: handing \d+ connection.* captured in ([\d.]+) ms")
LOG_SLACK = 0.05  # seconds between a moment and the timestamp of the line logging it


def handed_over(lines: list[str]) -> list[float]:
    """When (``time.monotonic()``) each shard's process stopped reading to capture its state
    for its replacement, closing what cannot move: the time its log line gives, less the
    capture it reports and ``LOG_SLACK`` (a client may see the close before the line is
    written)."""
    offset = time.monotonic() - time.time()
    return [datetime.datetime.strptime(m.group(1), "%Y/%m/%d %H:%M:%S.%f").timestamp() + offset
            - float(m.group(2)) / 1000 - LOG_SLACK for line in lines if (m := _HANDING.match(line))]


def missed(report: dict[str, Any], cfg: ReloadConfig) -> list[str]:
    """What this run did wrong (empty: nothing)."""
    out = []
    for key, what in (("lost", "acknowledged messages lost"), ("early", "deferred messages delivered early"),
                      ("unknown_bodies", "deliveries of bodies never published"),
                      ("disconnected", "plain consumer connections ended by a restart"),
                      ("publish_errors", "publish errors during a restart")):
        if report[key]:
            out.append(f"{report[key]} {what}")
    unexplained = report["duplicates"] - report["duplicates_explained"]
    if unexplained:
        out.append(f"{unexplained} duplicates (redelivered to a plain consumer, or after a FIN)")
    if report["connector"]["refused_or_failed"]:
        out.append(f"{report['connector']['refused_or_failed']} new connections refused or failed")
    for f in report["restarts_done"]:
        if f["completed_after_s"] is None:
            out.append(f"a {f['kind']} did not complete")
    if len(report["handovers"]) < cfg.shards * len(cfg.plan):
        out.append(f"{len(report['handovers'])} shard hand-overs logged, {cfg.shards * len(cfg.plan)} expected")
    return out
