"""The one back-off rule (``pynsqd.backoff``): doubling from ``base`` to ``cap`` per
consecutive failure, drawn down by jitter, never above the cap, back to ``base`` on success."""

from __future__ import annotations

import random

import pytest

from pynsqd.backoff import Backoff, exponential


def test_exponential_doubles_up_to_the_cap() -> None:
    assert [exponential(0.25, 15.0, n) for n in range(8)] == [0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0]
    assert exponential(1.0, 60.0, 10_000) == 60.0  # no overflow however long it failed


def test_delays_are_jittered_within_the_upper_part_of_each_step_and_reset_on_success() -> None:
    retry = Backoff(0.1, 10.0, jitter=0.5, rng=random.Random(7))
    for n in range(1, 12):
        top = exponential(0.1, 10.0, n)
        assert top * 0.5 <= retry.failed() <= top
    retry.reset()
    assert 0.05 <= retry.failed() <= 0.1
    assert Backoff(0.1, 10.0, jitter=0.0).failed() == 0.1


def test_peers_that_fail_together_do_not_retry_together() -> None:
    peers = [Backoff(1.0, 60.0, rng=random.Random(seed)) for seed in range(50)]
    for _ in range(3):
        delays = [peer.failed() for peer in peers]
        assert len({round(d, 3) for d in delays}) > 40
        assert max(delays) - min(delays) > 0.25 * max(delays)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        Backoff(-1.0, 1.0)
    with pytest.raises(ValueError):
        Backoff(1.0, 1.0, jitter=1.5)
