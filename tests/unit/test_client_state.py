"""The client's pure state: RDY arithmetic, backoff in virtual time, lookupd answers."""

from __future__ import annotations

import random

import pytest

from pynsqd.client.backoff import Action, RdyBackoff, State
from pynsqd.client.discovery import poll_delay, producer_keys
from pynsqd.client.rdy import RdyBook


def apply(book: RdyBook, changes: list[tuple[object, int]]) -> dict[object, int]:
    return {k: v for k, v in changes}


def test_first_rdy_is_one_then_the_even_share() -> None:
    book = RdyBook(max_in_flight=100)
    book.add("a", 2500, now=0)
    assert apply(book, book.rebalance(0, random.Random(1))) == {"a": 1}
    book.on_message("a", 1)
    book.on_done("a")
    assert book.wants_update("a") == 100
    assert book.set("a", 100) == 100
    book.add("b", 2500, now=2)
    changes = book.rebalance(2, random.Random(1))
    assert changes == [("a", 50), ("b", 1)]  # decrease first, then the newcomer's first RDY
    assert book.total <= 100


def test_rdy_never_above_max_in_flight_or_max_rdy_count() -> None:
    book = RdyBook(max_in_flight=1000)
    book.add("a", 300, now=0)
    book.add("b", 2500, now=0)
    for key in ("a", "b"):
        book.on_message(key, 0)
        book.on_done(key)
    book.rebalance(0, random.Random(0))
    assert book.conns["a"].rdy == 300  # the server's max_rdy_count wins
    assert book.conns["b"].rdy == 500
    assert book.set("b", 10_000) == 700  # clamped to what the budget leaves
    assert book.total == 1000


def test_uneven_division_rounds_down() -> None:
    book = RdyBook(max_in_flight=10)
    for key in "abc":
        book.add(key, 2500, now=0)
        book.on_message(key, 0)
        book.on_done(key)
    book.rebalance(0, random.Random(0))
    assert [book.conns[k].rdy for k in "abc"] == [3, 3, 3]


def test_update_rule_25_percent_of_last_rdy() -> None:
    book = RdyBook(max_in_flight=100)
    book.add("a", 2500, now=0)
    book.conns["a"].fresh = False
    book.set("a", 100)
    for _ in range(75):
        book.on_message("a", 0)
        book.on_done("a")
    assert book.wants_update("a") is None  # 25 left = 25%: not below yet
    book.on_message("a", 0)
    book.on_done("a")
    assert book.wants_update("a") == 100


def test_fewer_rdy_than_connections_moves_rdy_away_from_idle_nodes() -> None:
    rng = random.Random(7)
    book = RdyBook(max_in_flight=2, low_rdy_idle_timeout=10)
    for key in "abcde":
        book.add(key, 2500, now=0)
    book.rebalance(0, rng)
    assert book.total == 2
    holders = {k for k, c in book.conns.items() if c.rdy}
    seen = set(holders)
    now = 0.0
    for _ in range(20):
        now += 11  # everyone idle past the timeout
        book.rebalance(now, rng)
        assert book.total <= 2
        assert all(c.rdy <= 1 for c in book.conns.values())
        seen |= {k for k, c in book.conns.items() if c.rdy}
    assert seen == set("abcde")  # every node gets to prove it has messages


def test_an_active_node_keeps_its_rdy() -> None:
    book = RdyBook(max_in_flight=1, low_rdy_idle_timeout=10)
    for key in "ab":
        book.add(key, 2500, now=0)
    book.rebalance(0, random.Random(3))
    holder = next(k for k, c in book.conns.items() if c.rdy)
    for t in range(1, 50):
        book.on_message(holder, t)
        book.on_done(holder)
        book.rebalance(t, random.Random(t))
        assert book.conns[holder].rdy == 1


def test_is_starved() -> None:
    book = RdyBook(max_in_flight=20)
    book.add("a", 2500, now=0)
    book.conns["a"].fresh = False
    book.set("a", 20)
    assert not book.is_starved()
    for _ in range(16):
        book.on_message("a", 0)
    assert not book.is_starved()  # 16 < 17 (85% of 20)
    book.on_message("a", 0)
    assert book.is_starved()
    book.on_done("a")
    assert not book.is_starved()


def test_removed_connection_gives_its_budget_back() -> None:
    book = RdyBook(max_in_flight=10)
    for key in "ab":
        book.add(key, 2500, now=0)
        book.conns[key].fresh = False
    book.rebalance(0, random.Random(0))
    book.remove("a")
    assert apply(book, book.rebalance(0, random.Random(0))) == {"b": 10}


# --- backoff in virtual time -----------------------------------------------------------------

def test_backoff_windows_grow_exponentially_and_cap() -> None:
    b = RdyBackoff(multiplier=1.0, max_duration=8.0)
    now = 0.0
    assert b.result(False, now) is Action.PAUSE
    windows = []
    for _ in range(6):
        windows.append(b.deadline - now)  # type: ignore[operator]
        now = b.deadline  # type: ignore[assignment]
        assert b.on_timer(now) is Action.TEST
        assert b.state is State.TESTING
        assert b.result(False, now) is Action.PAUSE
    assert windows == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]


def test_one_result_per_window_and_recovery() -> None:
    b = RdyBackoff(multiplier=0.5, max_duration=60.0)
    now = 10.0
    b.result(False, now)
    b.on_timer(now + 0.5)
    b.result(False, now + 0.5)  # level 2, window 1.0 s
    assert b.level == 2
    for t in (now + 0.6, now + 1.0, now + 1.4):  # results inside the window are ignored
        assert b.result(False, t) is None
        assert b.result(True, t) is None
    assert b.level == 2
    assert b.on_timer(now + 1.4) is None  # too early
    assert b.on_timer(now + 1.5) is Action.TEST
    assert b.result(True, now + 1.5) is Action.PAUSE  # level 1: one more window
    assert b.level == 1 and b.deadline == pytest.approx(now + 2.0)
    assert b.on_timer(now + 2.0) is Action.TEST
    assert b.result(True, now + 2.0) is Action.RESUME
    assert b.state is State.NORMAL and not b.active
    assert b.result(True, now + 3) is None


# --- discovery ---------------------------------------------------------------------------------

def test_producer_keys_union_key_and_old_envelope() -> None:
    answer = {"channels": [], "producers": [
        {"broadcast_address": "a.example", "tcp_port": 4150, "http_port": 4151},
        {"broadcast_address": "::1", "tcp_port": 4150},
        {"broadcast_address": "", "tcp_port": 4150},
        {"tcp_port": 4150}]}
    assert producer_keys(answer) == {"a.example:4150", "[::1]:4150"}
    assert producer_keys({"status_code": 200, "data": answer}) == {"a.example:4150", "[::1]:4150"}
    assert producer_keys("nonsense") == set()


def test_poll_delay_is_jittered_within_bounds() -> None:
    rng = random.Random(5)
    delays = [poll_delay(60.0, 0.3, rng) for _ in range(200)]
    assert all(42.0 <= d <= 60.0 for d in delays)
    assert max(delays) - min(delays) > 10
    assert poll_delay(60.0, 0.0, rng) == 60.0
