"""What the soak saw: every publish (acknowledged or not), every delivery and what the consumer
did with it, every crash; and the verdict drawn from them.

A message is one publish of a unique sequence number (carried in its body); each channel of
its topic must deliver it. A *pair* is (channel, sequence). The verdict:

- **lost**: an acknowledged pair never delivered, or whose last delivery was not finished (a
  requeue that never came back, a delivery cut by a crash and never delivered again);
- **early**: a deferred publish delivered before its due time (the publish's send time plus
  its delay), or a message requeued with a delay delivered again before the REQ's send time
  plus the delay — unless that REQ was exposed to a crash (see below), when it may never have
  been applied;
- **duplicates**: a delivery after one that was finished, or while it was still held. A
  duplicate is *explained* when the earlier delivery was in flight at a crash of the shard
  that owns the topic (on a connection the crash cut, and not finished more than ``grace``
  seconds before it: a FIN has no answer, so one sent just before a crash may never have
  been applied) and the new delivery has attempts >= 2. A crash is one the soak injected or
  a shard death the supervisor logged (listed in the report as unplanned).
  Every other duplicate is classified by what the earlier delivery went through.

Times are ``time.monotonic()`` of the soak process; the node runs on the same host.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

FIN, REQ, NONE = "FIN", "REQ", ""


@dataclass(slots=True)
class Publish:
    seq: int
    topic: str
    kind: str  # tcp-pub, tcp-mpub, tcp-dpub, http-pub, http-mpub, http-dpub
    sent: float
    defer_ms: int = 0
    acked: bool = False


@dataclass(slots=True)
class Connection:
    topic: str
    channel: str
    opened: float
    closed: float | None = None


@dataclass(slots=True)
class Delivery:
    at: float
    conn: int
    msg_id: bytes
    attempts: int
    action: str = NONE  # FIN or REQ once sent
    action_at: float | None = None
    req_delay_ms: int = 0


@dataclass(slots=True)
class Crash:
    at: float  # the moment the shard (or tree) stopped applying commands
    kind: str
    topics: frozenset[str] | None  # None: every topic (the whole tree)

    def hits(self, topic: str) -> bool:
        return self.topics is None or topic in self.topics


@dataclass
class Ledger:
    channels: dict[str, list[str]]  # topic → its channels (created before any publish)
    published: dict[int, Publish] = field(default_factory=dict)
    deliveries: dict[tuple[str, str, int], list[Delivery]] = field(default_factory=dict)
    connections: list[Connection] = field(default_factory=list)
    crashes: list[Crash] = field(default_factory=list)
    faults: list[tuple[float, float, str]] = field(default_factory=list)  # (start, end, kind), crashes too
    unknown_bodies: int = 0
    fin_failed: int = 0
    _seq: int = 0

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def publish(self, seq: int, topic: str, kind: str, sent: float, defer_ms: int = 0) -> Publish:
        p = Publish(seq, topic, kind, sent, defer_ms)
        self.published[seq] = p
        return p

    def open_connection(self, topic: str, channel: str, at: float) -> int:
        self.connections.append(Connection(topic, channel, at))
        return len(self.connections) - 1

    def close_connection(self, conn: int, at: float) -> None:
        if self.connections[conn].closed is None:
            self.connections[conn].closed = at

    def deliver(self, conn: int, seq: int, msg_id: bytes, attempts: int, at: float) -> Delivery:
        c = self.connections[conn]
        d = Delivery(at, conn, msg_id, attempts)
        self.deliveries.setdefault((c.topic, c.channel, seq), []).append(d)
        return d

    def crash(self, at: float, kind: str, topics: frozenset[str] | None) -> None:
        self.crashes.append(Crash(at, kind, topics))
        self.crashes.sort(key=lambda c: c.at)

    # --- progress -------------------------------------------------------------------------
    def expected_pairs(self) -> list[tuple[str, str, int]]:
        return [(p.topic, ch, p.seq) for p in self.published.values() if p.acked for ch in self.channels[p.topic]]

    def settled(self, pair: tuple[str, str, int]) -> bool:
        got = self.deliveries.get(pair)
        return got is not None and got[-1].action == FIN

    def unsettled(self) -> int:
        return sum(1 for pair in self.expected_pairs() if not self.settled(pair))


@dataclass
class Rules:
    grace: float = 2.0  # a FIN/REQ sent this long before a crash may not have been applied
    tolerance: float = 0.02  # seconds of clock rounding allowed on due times
    msg_timeout: float = 60.0  # the node's --msg-timeout: a longer hold is requeued by it


def _exposed(ledger: Ledger, topic: str, d: Delivery, before: float, grace: float) -> Crash | None:
    """The first crash (before ``before``, the next delivery) that caught delivery ``d`` in
    flight: it hit the topic's shard while ``d``'s connection was open, and ``d`` was not
    finished or requeued by then (or only ``grace`` seconds before). ``d`` itself may have
    been read after the crash moment: frames the shard sent before it stopped are still
    read from the socket."""
    conn = ledger.connections[d.conn]
    for crash in ledger.crashes:
        if crash.at > before:
            return None
        if not crash.hits(topic) or crash.at < conn.opened or (conn.closed is not None and conn.closed < crash.at):
            continue
        if d.action_at is None or d.action_at > crash.at - grace:
            return crash
    return None


def _classify(ledger: Ledger, rules: Rules, topic: str, prev: Delivery, d: Delivery) -> str:
    """Why ``d`` came after ``prev`` (which was not requeued by the consumer)."""
    conn = ledger.connections[prev.conn]
    if (prev.action_at is None or prev.action_at > d.at) and (conn.closed is None or conn.closed > d.at):
        return "in flight twice (the earlier delivery still held on a live connection)"
    if prev.action == REQ:
        return f"another copy while requeued (attempts {prev.attempts} then {d.attempts})"
    crash = _exposed(ledger, topic, prev, d.at, rules.grace)
    if crash is not None:
        if d.attempts >= 2:
            return "explained"
        return f"in flight at a crash ({crash.kind}) but attempts={d.attempts}"
    if prev.action_at is not None and prev.action_at - prev.at > rules.msg_timeout:
        return "held past the message timeout"
    if prev.action == FIN:
        return "came back after a FIN no crash could have lost"
    return "requeued after its connection closed without a crash"


def verdict(ledger: Ledger, rules: Rules) -> dict[str, Any]:
    """Counts, and a few examples of each kind of failure."""
    expected = ledger.expected_pairs()
    expected_set = set(expected)
    never = [pair for pair in expected if pair not in ledger.deliveries]
    unfinished = [pair for pair in expected if pair in ledger.deliveries and not ledger.settled(pair)]
    early: list[dict[str, Any]] = []
    duplicates: Counter[str] = Counter()
    examples: dict[str, list[dict[str, Any]]] = {}
    for pair, got in ledger.deliveries.items():
        topic, channel, seq = pair
        pub = ledger.published.get(seq)
        if pub is not None and pub.defer_ms and got[0].at < pub.sent + pub.defer_ms / 1000 - rules.tolerance:
            early.append({"seq": seq, "channel": f"{topic}/{channel}", "kind": pub.kind,
                          "early_by_s": round(pub.sent + pub.defer_ms / 1000 - got[0].at, 3)})
        for prev, d in itertools.pairwise(got):
            req_at = prev.action_at if prev.action == REQ else None
            if req_at is not None and req_at <= d.at and d.attempts > prev.attempts:
                due = req_at + prev.req_delay_ms / 1000
                if d.at < due - rules.tolerance and _exposed(ledger, topic, prev, d.at, rules.grace) is None:
                    early.append({"seq": seq, "channel": f"{topic}/{channel}", "kind": f"REQ {prev.req_delay_ms}ms",
                                  "early_by_s": round(due - d.at, 3), "attempts": d.attempts,
                                  "same_id": prev.msg_id == d.msg_id,
                                  "faults_between": _faults_between(ledger, req_at, d.at)})
                continue
            why = _classify(ledger, rules, topic, prev, d)
            duplicates[why] += 1
            if len(examples.setdefault(why, [])) < 5:
                examples[why].append({"seq": seq, "channel": f"{topic}/{channel}",
                                      "attempts": [prev.attempts, d.attempts], "same_id": prev.msg_id == d.msg_id,
                                      "gap_s": round(d.at - prev.at, 3),
                                      "faults_between": _faults_between(ledger, prev.at, d.at)})
    lost_by = Counter(f"{ledger.published[s].kind}, never delivered" for _, _, s in never)
    lost_by.update(f"{ledger.published[s].kind}, last {ledger.deliveries[(t, c, s)][-1].action or 'held'}"
                   for t, c, s in unfinished)
    acked = sum(1 for p in ledger.published.values() if p.acked)
    unacked_delivered = sum(1 for (_, _, seq) in ledger.deliveries
                            if seq in ledger.published and not ledger.published[seq].acked)
    dup_total = sum(duplicates.values())
    return {
        "published": len(ledger.published),
        "acknowledged": acked,
        "expected_deliveries": len(expected),
        "delivered": sum(1 for pair in ledger.deliveries if pair in expected_set),
        "deliveries": sum(len(v) for v in ledger.deliveries.values()),
        "delivered_unacknowledged": unacked_delivered,
        "unknown_bodies": ledger.unknown_bodies,
        "lost": len(never) + len(unfinished),
        "lost_never_delivered": len(never),
        "lost_not_finished": len(unfinished),
        "lost_by_kind": dict(lost_by),
        "lost_examples": [f"{t}/{c}#{s}" for t, c, s in (never + unfinished)[:10]],
        "early": len(early),
        "early_examples": early[:10],
        "duplicates": dup_total,
        "duplicates_explained": duplicates.get("explained", 0),
        "duplicates_by_cause": dict(duplicates),
        "duplicate_examples": {k: v for k, v in examples.items() if k != "explained"},
        "fin_failed": ledger.fin_failed,
        "crashes": len(ledger.crashes),
    }


def _faults_between(ledger: Ledger, start: float, end: float) -> list[str]:
    return [kind for began, ended, kind in ledger.faults if began <= end and ended >= start]
