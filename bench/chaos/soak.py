"""One soak: mount the data path, start the node, create the topics, run the clients, inject
the scheduled faults, stop publishing, drain, check every shard serves, and judge."""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import uvloop

from bench.chaos import restarts
from bench.chaos.faults import RESTARTS, Faults, schedule, served
from bench.chaos.ledger import Ledger, Rules, verdict
from bench.chaos.load import Consumer, HttpProducer, Mix, Producer, TcpProducer
from bench.chaos.node import PROBE_CHANNEL, Node, death, raise_own_nofile, tmpfs

MB = 1 << 20
MIN_GAP = 2.0  # seconds of plain load between two faults


@dataclass
class SoakConfig:
    duration: float = 600.0  # seconds of load and faults (the drain comes after)
    faults: int = 24
    seed: int = 0
    rate: float = 300.0  # messages/s over all producers
    topics: int = 12
    shards: int = 2
    nofile: int = 1024  # the node's descriptor limit (prlimit)
    shard_timeout: float = 3.0  # PYNSQD_SHARD_TIMEOUT: the heartbeat deadline
    tmpfs_size: str = "64m"
    mem_queue_size: int = 50
    node_log: str | None = None  # write the node's output here at the end
    drain_timeout: float = 120.0
    hold: float = 4.0  # seconds a full disk or exhausted descriptors are held
    rss_growth: float = 1.5  # last window's median RSS within this factor of the first's ...
    rss_slack_mb: float = 64.0  # ... plus this much
    rss_max_mb: float = 2048.0
    workdir: str | None = None
    mix: Mix = field(default_factory=Mix)


def channels_of(index: int) -> list[str]:
    """Two channels per topic, a third ("slow", with pausing consumers) on every third."""
    return ["a", "b", "slow"] if index % 3 == 0 else ["a", "b"]


def run(cfg: SoakConfig) -> dict[str, Any]:
    raise_own_nofile()
    with tempfile.TemporaryDirectory(dir=cfg.workdir, prefix="chaos-") as work, \
            tmpfs(Path(work) / "data", cfg.tmpfs_size) as data:
        node = Node(data, cfg.shards, cfg.nofile, cfg.shard_timeout, [
            f"--mem-queue-size={cfg.mem_queue_size}", "--max-bytes-per-file=1048576", "--log-level=info"])
        try:
            node.start()
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                return runner.run(_soak(cfg, node))
        finally:
            node.stop()
            if cfg.node_log:
                Path(cfg.node_log).write_text("\n".join(node.log) + "\n")


async def _soak(cfg: SoakConfig, node: Node) -> dict[str, Any]:
    rng = random.Random(cfg.seed)
    topics = [f"chaos{i:02d}" for i in range(cfg.topics)]
    probes = [f"chaos_probe{i}" for i in range(cfg.shards)]
    for name in probes:  # first, so each shard owns one (placement takes the least loaded)
        await asyncio.to_thread(node.create, name, [PROBE_CHANNEL])
    for i, topic in enumerate(topics):
        await asyncio.to_thread(node.create, topic, channels_of(i))
    ledger = Ledger({t: channels_of(i) for i, t in enumerate(topics)})
    stop_load, stop_consumers = asyncio.Event(), asyncio.Event()
    consumers = [Consumer(ledger, node.address, t, ch, rng.choice((5, 20, 50)), random.Random(rng.random()),
                          cfg.mix, pauses=ch == "slow")
                 for t in topics for ch in ledger.channels[t] for _ in range(1 if ch == "slow" else 2)]
    tcp_share, http_share = cfg.rate * 0.7 / 3, cfg.rate * 0.3 / 2
    producers: list[Producer] = [
        *(TcpProducer(ledger, node.address, topics, tcp_share, random.Random(rng.random()), cfg.mix) for _ in range(3)),
        *(HttpProducer(ledger, node.address, topics, http_share, random.Random(rng.random()), cfg.mix)
          for _ in range(2))]
    rss: list[tuple[float, int]] = []
    tasks = [asyncio.create_task(c.run(stop_consumers)) for c in consumers]
    tasks += [asyncio.create_task(p.run(stop_load)) for p in producers]
    started = time.monotonic()
    faults = Faults(node, ledger, random.Random(rng.random()), cfg.hold, cfg.shard_timeout + 3.0,
                    cfg.nofile)
    unplanned: list[str] = []
    sampler = asyncio.create_task(_watch(node, faults, rss, unplanned, started))
    plan = schedule(random.Random(rng.random()), cfg.duration, cfg.faults)
    injected = await _inject(faults, plan, started, cfg.duration)
    await asyncio.sleep(max(0.0, started + cfg.duration - time.monotonic()))
    stop_load.set()
    drain_start = time.monotonic()
    for c in consumers:
        c.finish_all = True
    while time.monotonic() - drain_start < cfg.drain_timeout and ledger.unsettled():  # noqa: ASYNC110
        await asyncio.sleep(2)  # a condition over the whole ledger: polled
    drained_s = time.monotonic() - drain_start
    await asyncio.sleep(3)  # late repeats still count
    stuck: dict[str, str] = {}
    if not await asyncio.to_thread(served, node.address()[0], 10.0):
        stuck["supervisor"] = "a new TCP connection is not served"
    for name in probes:
        why = await asyncio.to_thread(node.serves, name)
        if why is not None:
            stuck[f"shard {node.owners().get(name, -1)}"] = why
    stop_consumers.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    sampler.cancel()
    report = verdict(ledger, Rules(msg_timeout=60.0))
    spans = restarts.windows(ledger, RESTARTS)
    report["restarts"] = {"disconnected": restarts.disconnected(ledger, spans),
                          "publish_errors": restarts.publish_errors(producers, spans),
                          "stall": restarts.stalls(producers, spans)}
    report.update({
        "seed": cfg.seed, "duration_s": cfg.duration, "drain_s": round(drained_s, 1),
        "faults_injected": len(injected), "faults": injected, "node_starts": node.starts,
        "stuck_shards": stuck, "unplanned_crashes": unplanned, "producer_errors": sum(p.errors for p in producers),
        "consumer_connections": sum(c.connected for c in consumers),
        "consumer_connections_ended_by": dict(sum((c.closed_by for c in consumers), Counter())),
        "rss": _rss_summary(cfg, rss),
        "config": {k: v for k, v in asdict(cfg).items() if k != "mix"}})
    report["missed"] = missed(report, cfg)
    return report


async def _inject(faults: Faults, plan: list[tuple[float, str]], started: float,
                  duration: float) -> list[dict[str, Any]]:
    """Run the plan in order; a fault starts at its moment, and ``MIN_GAP`` after the one
    before it ended at the earliest."""
    done: list[dict[str, Any]] = []
    free_at = started
    for at, kind in plan:
        await asyncio.sleep(max(0.0, started + at - time.monotonic(), free_at + MIN_GAP - time.monotonic()))
        if time.monotonic() - started > duration:
            break
        began = time.monotonic()
        try:
            outcome = await asyncio.to_thread(faults.inject, kind)
        except Exception as exc:  # the fault could not be injected: say so in the report
            outcome = {"error": repr(exc)}
        outcome = {"kind": kind, "at_s": round(began - started, 1), "took_s": round(time.monotonic() - began, 1),
                   **outcome}
        free_at = time.monotonic()
        print(f"  fault {len(done) + 1}: {outcome}", flush=True)
        done.append(outcome)
    return done


async def _watch(node: Node, faults: Faults, rss: list[tuple[float, int]], unplanned: list[str],
                 started: float) -> None:
    """Every second: the node's RSS, and shard deaths this soak did not cause (the
    supervisor killing a shard whose loop went silent, a crash), which are crashes too."""
    seen: set[int] = set()
    while True:
        value = await asyncio.to_thread(node.rss)
        if value:
            rss.append((time.monotonic() - started, value))
        for line in node.new_lines():
            found = death(line)
            if found is None or found[2] in faults.victims or found[2] in seen:
                continue
            wall, index, pid = found
            seen.add(pid)
            at = max(wall - time.time() + time.monotonic(), node.started_at)
            faults.ledger.crash(at, "unplanned shard death", node.topics_of(index))
            unplanned.append(line)
        await asyncio.sleep(1)


def _rss_summary(cfg: SoakConfig, samples: list[tuple[float, int]]) -> dict[str, Any]:
    if not samples:
        return {"samples": 0}
    end = samples[-1][0]
    window = min(60.0, end / 4)
    first = [v for t, v in samples if t <= window]
    last = [v for t, v in samples if t >= end - window]
    by_minute: dict[int, int] = {}
    for t, v in samples:
        by_minute[int(t // 60)] = max(by_minute.get(int(t // 60), 0), v)
    return {"samples": len(samples), "window_s": round(window, 1), "max_mb": round(max(v for _, v in samples) / MB, 1),
            "first_window_median_mb": round(statistics.median(first) / MB, 1),
            "last_window_median_mb": round(statistics.median(last) / MB, 1),
            "max_mb_by_minute": [round(by_minute[m] / MB, 1) for m in sorted(by_minute)]}


def missed(report: dict[str, Any], cfg: SoakConfig) -> list[str]:
    """The targets this run missed (empty: it met them all)."""
    out = []
    if report["lost"]:
        out.append(f"{report['lost']} acknowledged messages lost")
    if report["early"]:
        out.append(f"{report['early']} deferred messages delivered early")
    unexplained = report["duplicates"] - report["duplicates_explained"]
    if unexplained:
        out.append(f"{unexplained} duplicates not explained by a crash")
    if report["unknown_bodies"]:
        out.append(f"{report['unknown_bodies']} deliveries of bodies never published")
    if report["stuck_shards"]:
        out.append(f"shards not serving at the end: {report['stuck_shards']}")
    if report["faults_injected"] < cfg.faults:
        out.append(f"{report['faults_injected']} of {cfg.faults} faults injected")
    for i, f in enumerate(report["faults"], 1):
        if "error" in f:
            out.append(f"fault {i} ({f['kind']}) could not be injected: {f['error']}")
        elif f["kind"] in ("shard-kill", "shard-stop") and f["back_after_s"] is None:
            out.append(f"fault {i} ({f['kind']}): shard {f['shard']} not serving again within 60 s")
        elif f["kind"] == "fd-exhaustion" and not f["exhausted"]:
            out.append(f"fault {i} (fd-exhaustion): {f['connections_opened']} connections did not exhaust the node")
        elif f["kind"] == "fd-exhaustion" and f["tcp_served_again_after_s"] is None:
            out.append(f"fault {i} (fd-exhaustion): TCP not served within 30 s of the descriptors' release")
        elif f["kind"] in RESTARTS and f["completed_after_s"] is None:
            out.append(f"fault {i} ({f['kind']}): not completed in time")
    during = report.get("restarts", {})
    if during.get("disconnected"):
        out.append(f"{during['disconnected']} consumer connection(s) ended by a reload or an upgrade")
    if during.get("publish_errors"):
        out.append(f"{during['publish_errors']} publish error(s) during a reload or an upgrade")
    rss = report["rss"]
    if rss.get("samples"):
        bound = rss["first_window_median_mb"] * cfg.rss_growth + cfg.rss_slack_mb
        if rss["last_window_median_mb"] > bound or rss["max_mb"] > cfg.rss_max_mb:
            out.append(f"RSS not bounded: last {rss['last_window_median_mb']} MB (bound {bound:.0f}), "
                       f"max {rss['max_mb']} MB (bound {cfg.rss_max_mb:.0f})")
    return out


def summary(r: dict[str, Any]) -> str:
    rss = r["rss"]
    rows = [
        ("seed", r["seed"]), ("faults injected", f"{r['faults_injected']} "
                                                 f"({', '.join(sorted({f['kind'] for f in r['faults']}))})"),
        ("acknowledged", r["acknowledged"]), ("expected deliveries (x channels)", r["expected_deliveries"]),
        ("delivered", r["delivered"]), ("lost", f"{r['lost']} (never delivered {r['lost_never_delivered']}, "
                                                f"not finished {r['lost_not_finished']})"),
        ("delivered early", r["early"]),
        ("duplicates", f"{r['duplicates']} (explained {r['duplicates_explained']})"),
        ("duplicates by cause", json.dumps(r["duplicates_by_cause"])),
        ("stuck shards", json.dumps(r["stuck_shards"]) if r["stuck_shards"] else "none"),
        ("unplanned crashes", len(r["unplanned_crashes"])),
        ("RSS max / first / last (MB)", f"{rss.get('max_mb')} / {rss.get('first_window_median_mb')} / "
                                        f"{rss.get('last_window_median_mb')}"),
        ("drain", f"{r['drain_s']} s"),
        ("reloads/upgrades: disconnected, publish errors", f"{r['restarts']['disconnected']}, "
                                                            f"{r['restarts']['publish_errors']}"),
        ("publish stall in reloads/upgrades", json.dumps(r["restarts"]["stall"]["all_protocols_during_restarts"])),
        ("verdict", "target met" if not r["missed"] else "MISSED: " + "; ".join(r["missed"])),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
