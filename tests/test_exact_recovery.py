"""Exact recovery of a channel after kill -9 of the whole process tree, kill -9 of the shard
that owns the topic, and SIGTERM: every message not FINed comes back exactly once (those in
flight with their attempts counted), deferred ones (REQ with a delay, DPUB) no earlier than
their due time, no id is ever in flight twice, nothing FINed comes back, nothing is lost.

The node spills most messages to its disk queue and never syncs it on its own during the
test (``--sync-every``, ``--sync-timeout``), so the disk queue's metadata on disk is stale at
the crash, as it is for up to 2 s with nsqd's defaults under load."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pynsqd.wire.commands import encode_dpub, encode_fin, encode_mpub, encode_pub, encode_req
from pynsqd.wire.frames import FRAME_ERROR, FRAME_MESSAGE
from pynsqd.wire.message import decode_message
from testbed.harness import Daemon, scaled, wait_for
from tests.support.rawclient import RawClient

pytestmark = pytest.mark.slow

TOPIC, CHANNEL = "exact", "ch"
PUBLISHED = 2000
MEM_QUEUE = 500  # the rest spills to the disk queue
FINED, REQUEUED, HELD = 600, 100, 300  # of the first 1000 delivered, in that order
DPUBS = 20
DELAY_MS = 5000  # REQ and DPUB delay: outlasts a restart, short enough for the suite
ARGS = (f"--mem-queue-size={MEM_QUEUE}", "--shards=2", "--sync-every=1000000", "--sync-timeout=1h",
        "--msg-timeout=60s")


def get_json(nsqd: Daemon, path: str) -> Any:
    with urllib.request.urlopen(nsqd.http_url + path, timeout=scaled(10)) as resp:
        return json.loads(resp.read())


def sync(c: RawClient) -> None:
    """Every command sent on ``c`` before this has been processed (PUB answers in order)."""
    c.send(encode_pub("sync#ephemeral", b"."))
    c.expect_ok()


def owner_pid(nsqd: Daemon, data_path: Path) -> int:
    """The pid of the shard that owns ``TOPIC``."""
    table = dict(reversed(line.split(" ", 1)) for line in
                 (data_path / "pynsqd.placement").read_text().splitlines())
    shards = get_json(nsqd, "/stats?format=json&include_shards=true")["supervisor"]["shard_status"]
    return int(shards[int(table[TOPIC])]["pid"])


class Before:
    """What was published and what a consumer did with it before the node went down."""

    def __init__(self, nsqd: Daemon) -> None:
        self.consumer = RawClient(nsqd.tcp)
        self.consumer.subscribe(TOPIC, CHANNEL, rdy=0)
        with RawClient(nsqd.tcp) as p:
            for start in range(0, PUBLISHED, 200):
                p.send(encode_mpub(TOPIC, [b"m%05d" % i for i in range(start, start + 200)]))
                p.expect_ok()
            self.dpub_due = time.time() + DELAY_MS / 1000
            for i in range(DPUBS):
                p.send(encode_dpub(TOPIC, DELAY_MS, b"d%05d" % i))
                p.expect_ok()
        c = self.consumer
        c.send(b"RDY %d\n" % (FINED + REQUEUED + HELD))
        msgs = c.read_messages(FINED + REQUEUED + HELD)
        c.send(b"RDY 0\n")
        assert all(m.attempts == 1 for m in msgs)
        self.ids = {m.body: m.id for m in msgs}
        self.finished = {m.body for m in msgs[:FINED]}
        c.send(b"".join(encode_fin(m.id) for m in msgs[:FINED]))
        self.req_due = time.time() + DELAY_MS / 1000
        c.send(b"".join(encode_req(m.id, DELAY_MS) for m in msgs[FINED:FINED + REQUEUED]))
        self.requeued = {m.body for m in msgs[FINED:FINED + REQUEUED]}
        self.held = {m.body for m in msgs[FINED + REQUEUED:]}
        sync(c)
        self.dpubs = {b"d%05d" % i for i in range(DPUBS)}
        self.expected = ({b"m%05d" % i for i in range(PUBLISHED)} - self.finished) | self.dpubs
        stats = get_json(nsqd, f"/stats?format=json&topic={TOPIC}&channel={CHANNEL}")
        channel = stats["topics"][0]["channels"][0]
        assert (channel["in_flight_count"], channel["deferred_count"]) == (HELD, REQUEUED + DPUBS)
        assert channel["backend_depth"] > 0  # some of what is left is on disk

    def consume_after(self, again: Daemon, check_early: bool) -> None:
        """A new consumer FINs everything it gets; check it got each expected message once."""
        got: dict[bytes, list[tuple[int, bytes, float]]] = {}
        errors: list[bytes] = []
        with RawClient(again.tcp) as c:
            c.subscribe(TOPIC, CHANNEL, rdy=PUBLISHED)
            if check_early:  # else the deferred ones may be due already: the test would prove less
                assert time.time() < min(self.dpub_due, self.req_due) - 0.5, "the restart took too long"
            deadline = time.monotonic() + scaled(30) + DELAY_MS / 1000

            def read(timeout: float) -> None:
                frame_type, data = c.read_frame(timeout)
                if frame_type == FRAME_ERROR:
                    errors.append(data)
                    return
                assert frame_type == FRAME_MESSAGE, (frame_type, data)
                _, attempts, msg_id, body = decode_message(data)
                got.setdefault(body, []).append((attempts, msg_id, time.time()))
                c.send(encode_fin(msg_id))

            while not self.expected <= set(got) and time.monotonic() < deadline:
                read(max(0.1, deadline - time.monotonic()))
            try:
                while True:  # anything more (a repeat) arrives right behind
                    read(0.5)
            except TimeoutError:
                pass
        missing = self.expected - set(got)
        assert not missing, f"{len(missing)} lost, e.g. {sorted(missing)[:5]}"
        assert not errors, f"{len(errors)} errors, e.g. {errors[:3]}"
        twice = {body: seen for body, seen in got.items() if len(seen) > 1}
        assert not twice, f"{len(twice)} delivered more than once, e.g. {sorted(twice.items())[:3]}"
        assert not set(got) & self.finished, "a FINed message came back"
        assert set(got) == self.expected
        for body in self.held | self.requeued:
            assert got[body][0][0] >= 2 and got[body][0][1] == self.ids[body], (body, got[body])
        for body in self.requeued:
            assert got[body][0][2] >= self.req_due - 0.05, (body, got[body][0][2] - self.req_due)
        for body in self.dpubs:
            assert got[body][0][2] >= self.dpub_due - 0.05, (body, got[body][0][2] - self.dpub_due)


@pytest.mark.parametrize("how", ["kill-9-tree", "kill-9-shard", "sigterm"])
def test_every_message_comes_back_exactly_once_with_attempts_and_due_times(
        nsqd_factory: Callable[..., Daemon], tmp_path: Path, how: str) -> None:
    nsqd = nsqd_factory(*ARGS, data_path=tmp_path)
    before = Before(nsqd)
    try:
        if how == "kill-9-shard":  # the supervisor restarts it
            pid = owner_pid(nsqd, tmp_path)
            os.kill(pid, signal.SIGKILL)
            before.consumer.expect_closed()
            wait_for(lambda: owner_pid(nsqd, tmp_path) != pid and get_json(
                nsqd, "/stats?format=json&include_shards=true")["supervisor"]["shard_restarts"] == 1,
                timeout=30, what="the shard's restart")
            again = nsqd
        elif how == "kill-9-tree":
            nsqd.kill()
            again = nsqd_factory(*ARGS, data_path=tmp_path)
        else:  # the consumer still holds its messages: the stop waits for FINs, then persists
            assert nsqd.stop(timeout=scaled(30)) == 0
            again = nsqd_factory(*ARGS, data_path=tmp_path)
    finally:
        before.consumer.close()
    before.consume_after(again, check_early=how != "sigterm")
