"""The compiled kernels against their pure-Python twins. The log's (``pynsqd.shm._logscan``,
``pynsqd.shm.logscan``): the same calls on two copies of one log leave the same bytes and
return the same values, through wraps, empty runs, the largest records, attempts that carry
and wrap, messages shorter than NSQ's header and corrupt frames, and a log recovered in
steps (states, then ids). The MPUB scan's (``pynsqd.wire._mpubscan``,
``pynsqd.wire.mpubscan``): the same messages and errors at every point of a body's arrival.
The records' (``pynsqd.wire._idrecords``, ``pynsqd.wire.idrecords``): the same bytes for any
bodies and id range. The frame runs' (``pynsqd.wire._frameruns``, ``pynsqd.wire.frameruns``):
the same message frames found in any stream cut anywhere, and the same answer lines.
``PYNSQD_PURE=1`` makes the callers pick the pure ones."""

from __future__ import annotations

import os
import random
import struct
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pynsqd.shm import logscan as pure
from pynsqd.shm.frames import FRAME, FRAME_SIZE, RingError
from pynsqd.shm.log import DEFERRED, DONE, IN_FLIGHT, READY, MessageLog
from pynsqd.shm.ring import HEADER_SIZE, buffer_size
from pynsqd.wire import commands, frameruns, idrecords, mpubscan
from pynsqd.wire.errors import ProtocolError
from pynsqd.wire.message import HEADER

compiled = pytest.importorskip("pynsqd.shm._logscan", reason="the compiled kernels are not built")
ORIGINAL_SCAN = commands._scan_bodies


def msg(i: int, size: int = 40, attempts: int = 0) -> bytes:
    return HEADER.pack(i, attempts, b"%016d" % i) + bytes([i & 0xFF]) * size


class Twins:
    """Two logs over two buffers, fed the same calls; ``run`` calls a kernel on both."""

    def __init__(self, capacity: int) -> None:
        self.bufs = [bytearray(buffer_size(capacity)) for _ in range(2)]
        self.logs = [MessageLog(buf, init=True) for buf in self.bufs]

    def each(self, call: Callable[[MessageLog], Any]) -> list[Any]:
        return [call(log) for log in self.logs]

    def run(self, name: str, *args: Any) -> Any:
        """``name`` of the pure kernels on the first log, of the compiled on the second;
        both results (or both errors) and both buffers must be equal."""
        results: list[Any] = []
        for impl, log in zip((pure, compiled), self.logs):
            fresh = [list(a) if isinstance(a, list) else bytearray(a) if isinstance(a, bytearray) else a
                     for a in args]
            fixed = (log._buf, log._cap, log.read_index, log.write_index) if name != "deliver_run" else (log._buf,)
            try:
                value = getattr(impl, name)(*fixed, *fresh)
            except Exception as exc:  # the same error, with the same message, from both
                value = (type(exc), str(exc))
            results.append((value, [a for a in fresh if isinstance(a, bytearray | list)]))
        assert results[0] == results[1]
        assert self.bufs[0] == self.bufs[1]
        return results[0]

    def release(self) -> int:
        (read, count), _ = self.run("release_front")
        for log in self.logs:
            log._advance(read, count)
        return count

    def close(self) -> None:
        self.each(lambda log: log.close())


def deliver(twins: Twins, cursor: int, count: int) -> tuple[list[int], int, bytearray, list[bytes]]:
    (positions, cursor), (out, ids) = twins.run("deliver_ready", cursor, count, bytearray(b"x"), [])
    return positions, cursor, out, ids


def finish(twins: Twins, positions: list[int]) -> None:
    for log in twins.logs:
        for pos in positions:
            log.set_state(pos, DONE)


def test_a_round_of_delivery_fin_and_release_is_the_same_byte_for_byte() -> None:
    twins = Twins(4096)
    twins.each(lambda log: log.append_ready([msg(i, 10 + i * 7) for i in range(20)]))
    positions, cursor, out, ids = deliver(twins, 0, 8)
    assert len(positions) == 8 and out[:1] == b"x" and len(ids) == 8
    assert ids[3] == b"%016d" % 3  # the message ids, in order
    finish(twins, positions[:5])
    assert twins.release() == 5
    rest, cursor, _, _ = deliver(twins, cursor, 100)
    assert len(rest) == 12
    assert deliver(twins, cursor, 100)[0] == []  # nothing left ready: an empty run
    assert twins.run("find", 0, 100, IN_FLIGHT)[0][0] != []
    twins.close()


def test_empty_log_zero_counts_and_an_empty_run() -> None:
    twins = Twins(1024)
    assert deliver(twins, 0, 10)[:2] == ([], 0)
    assert twins.run("find", 0, 0, READY)[0] == ([], 0)
    assert twins.release() == 0
    twins.each(lambda log: log.append_ready([msg(1), msg(2)]))
    assert deliver(twins, 0, 0)[:2] == ([], 0)
    value, _ = twins.run("deliver_run", [], [], bytearray(), [])
    assert value[0] is IndexError  # both refuse a run of nothing alike
    twins.close()


def test_runs_that_wrap_around_the_end_of_the_area() -> None:
    twins = Twins(2048)
    cursor = 0
    for round_ in range(30):  # the indices go round the area many times, at every alignment
        batch = [msg(round_ * 10 + i, 3 + (round_ * 5 + i * 11) % 90) for i in range(1 + round_ % 6)]
        stored = twins.each(lambda log, batch=batch: log.append_ready(batch))
        assert stored[0] == stored[1] == len(batch)
        positions, cursor, _, _ = deliver(twins, cursor, 4)
        more, cursor, _, _ = deliver(twins, cursor, 100)
        finish(twins, positions + more)
        twins.release()
        assert twins.logs[0].read_index == twins.logs[0].write_index
    assert twins.logs[0].write_index > 4 * 2048
    twins.close()


def test_the_largest_record_and_attempts_that_carry_and_wrap() -> None:
    twins = Twins(4096)
    largest = twins.logs[0].max_frame - FRAME_SIZE - 16  # message bytes of the largest record
    big = msg(7, largest - 26, attempts=255)
    assert twins.each(lambda log: log.append_ready([big])) == [1, 1]
    positions, cursor, out, _ = deliver(twins, 0, 5)
    assert len(out) == 1 + 8 + largest and out[1 + 8 + 8:1 + 8 + 10] == b"\x01\x00"  # 255 + 1
    finish(twins, positions)
    twins.release()
    twins.each(lambda log: log.append_ready([msg(1, attempts=0xFFFF), msg(2, attempts=0x12FF)]))
    _, _, out, _ = deliver(twins, cursor, 5)
    assert out[1 + 16:1 + 18] == b"\x00\x00"  # 65535 + 1 wraps to 0, as the pure code does
    twins.close()


def test_messages_shorter_than_the_header_take_the_pure_path() -> None:
    twins = Twins(1024)
    twins.each(lambda log: log.append_ready([b"short", msg(3), b"", b"0123456789abcdefghijklmno"]))
    positions, _, out, ids = deliver(twins, 0, 10)
    assert len(positions) == len(ids) == 4 and len(out) == 1 + 4 * 8 + 5 + 66 + 0 + 25
    twins.close()


def test_requeued_positions_are_delivered_alike() -> None:
    twins = Twins(1024)
    twins.each(lambda log: log.append_ready([msg(i) for i in range(4)]))
    positions, _, _, _ = deliver(twins, 0, 4)
    size = FRAME.unpack_from(twins.bufs[0], HEADER_SIZE + positions[2] - FRAME_SIZE)[0]
    for log in twins.logs:
        log.set_state(positions[2], READY)
    twins.run("deliver_run", [positions[2]], [positions[2] + size], bytearray(), [])
    twins.run("deliver_run", [positions[3], positions[1]], [positions[3] + size, positions[1] + size],
              bytearray(), [])  # out of order: handed to the pure code as it is
    twins.close()


@pytest.mark.parametrize("damage", ["length", "complement", "past the end"])
def test_a_corrupt_frame_raises_the_same_ring_error(damage: str) -> None:
    twins = Twins(1024)
    twins.each(lambda log: log.append_ready([msg(i) for i in range(3)]))
    second = twins.run("find", 0, 10, READY)[0][0][0][0][1] - FRAME_SIZE
    for buf in twins.bufs:
        at = HEADER_SIZE + second
        size = FRAME.unpack_from(buf, at)[0]
        new = {"length": (size + 8, size ^ 0xFFFFFFFF), "complement": (size, 0),
               "past the end": (900, 900 ^ 0xFFFFFFFF)}[damage]
        FRAME.pack_into(buf, at, *new)
    value, _ = twins.run("deliver_ready", 0, 10, bytearray(), [])
    assert value[0] is RingError
    for buf in twins.bufs:  # the first record is DONE: release walks onto the damaged frame
        buf[HEADER_SIZE + FRAME_SIZE] = DONE
    value, _ = twins.run("release_front")  # a length release need not trust: it stops at READY
    assert value[0] is RingError if damage != "past the end" else value == (second, 1)
    twins.close()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 300)), min_size=1, max_size=60), st.integers(0, 2**32))
def test_any_sequence_of_appends_deliveries_fins_and_releases(ops: list[tuple[int, int]], seed: int) -> None:
    rng = random.Random(seed)
    twins = Twins(2048)
    cursor = 0
    delivered: list[int] = []
    try:
        for op, n in ops:
            if op <= 1:
                batch = [msg(n + i, rng.randrange(0, 200)) for i in range(1 + n % 7)]
                stored = twins.each(lambda log, batch=batch: log.append_ready(batch))
                assert stored[0] == stored[1]
            elif op == 2:
                positions, cursor, _, _ = deliver(twins, cursor, 1 + n % 9)
                delivered += positions
            elif op == 3 and delivered:
                rng.shuffle(delivered)
                done, delivered = delivered[: 1 + n % len(delivered)], delivered[1 + n % len(delivered):]
                finish(twins, done)
            elif op == 4:
                twins.release()
            else:
                for want in (READY, IN_FLIGHT, DEFERRED, DONE):
                    twins.run("find", n % 100, 1 + n % 13, want)
    finally:
        twins.close()


def recover_both(twins: Twins, steps: int) -> tuple[list[Any], list[set[bytes]]]:
    """``recover_run`` then ``live_ids`` (all, then among the even ids) over each log in
    steps of ``steps`` records, pure on the first and compiled on the second: each step's
    results, and the ids found."""
    results: list[list[Any]] = [[], []]
    found: list[set[bytes]] = [set(), set()]
    for i, (impl, log) in enumerate(zip((pure, compiled), twins.logs)):
        fixed = (log._buf, log._cap, log.read_index, log.write_index)
        cursor = 0
        try:
            while cursor < log.write_index:
                step = impl.recover_run(*fixed, cursor, steps)
                results[i].append(step)
                cursor = step[0]
            for among in (None, {b"%016d" % n for n in range(0, 400, 2)}):
                cursor = 0
                while cursor < log.write_index:
                    cursor = impl.live_ids(*fixed, cursor, steps, among, found[i])
                results[i].append(sorted(found[i]))
        except RingError as exc:
            results[i].append((type(exc), str(exc)))
    assert results[0] == results[1] and found[0] == found[1]
    assert twins.bufs[0] == twins.bufs[1]
    return results[0], found


def test_recovery_in_steps_is_the_same_byte_for_byte() -> None:
    twins = Twins(8192)
    cursor = 0
    for round_ in range(12):  # round the area, so that runs wrap; every state on the way
        batch = [msg(round_ * 10 + i, 3 + (round_ * 7 + i * 13) % 120) for i in range(1 + round_ % 5)]
        twins.each(lambda log, batch=batch: log.append_ready(batch))
        positions, cursor, _, _ = deliver(twins, cursor, 2 + round_ % 3)
        finish(twins, positions[::2])
        for log in twins.logs:
            for pos in positions[1::4]:
                log.set_deferred(pos, 10**18 + pos)
        if round_ % 3 == 0:
            twins.release()
    twins.each(lambda log: log.append_ready([b"short", msg(399)]))  # no id in the first
    for steps in (1, 3, 1000):
        results, found = recover_both(twins, steps)
        walked = sum(step[1] for step in results[:-2])
        assert walked == len(twins.logs[0])  # every record, live or done, once
        assert b"%016d" % 399 in found[0]
    assert not twins.run("find", 0, 1000, IN_FLIGHT)[0][0]  # in flight became ready
    twins.close()


@pytest.mark.parametrize("damage", ["length", "state", "wrap"])
def test_recovery_of_a_corrupt_log_raises_the_same_ring_error(damage: str) -> None:
    twins = Twins(1024)
    twins.each(lambda log: log.append_ready([msg(i) for i in range(3)]))
    second = twins.run("find", 0, 10, READY)[0][0][0][0][1] - FRAME_SIZE
    for buf in twins.bufs:
        at = HEADER_SIZE + second
        if damage == "length":
            FRAME.pack_into(buf, at, 900, 900 ^ 0xFFFFFFFF)
        elif damage == "state":
            buf[at + FRAME_SIZE] = 9
        else:
            FRAME.pack_into(buf, at, 0xFFFFFFFF, 0)
    results, _ = recover_both(twins, 10)
    assert results[-1][0] is RingError
    twins.close()


def test_pynsqd_pure_picks_the_pure_kernels() -> None:
    code = ("import pynsqd.shm.kernels as k, pynsqd.shm.logscan as p, pynsqd.wire.commands as c;"
            "import pynsqd.client.batch as b;"
            "print(k.COMPILED, k.find is p.find, c._scan_bodies.__module__, b.scan_messages.__module__)")
    env = {**os.environ, "PYNSQD_PURE": "1"}
    forced = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert forced.stdout.split() == ["False", "True", "pynsqd.wire.mpubscan", "pynsqd.wire.frameruns"]
    env.pop("PYNSQD_PURE")
    default = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert default.stdout.split() == ["True", "False", "pynsqd.wire._mpubscan", "pynsqd.wire._frameruns"]
    assert compiled.HEADER_SIZE == HEADER_SIZE


# -- the MPUB scan ---------------------------------------------------------------------------

def mpub_body(sizes: list[int]) -> bytes:
    """An MPUB body announcing messages of ``sizes`` (of the largest, only its first 2 MiB)."""
    return struct.pack(">i", len(sizes)) + b"".join(
        struct.pack(">i", n) + bytes([n & 0xFF]) * min(max(n, 0), 1 << 21) for n in sizes)


def scan_both(buf: bytearray, start: int, off: int, avail: int, size: int, count: int, max_msg: int,
              taken: tuple[bytes, ...] = ()) -> Any:
    """``scan_bodies`` of both kinds on the same input, ``taken`` the messages already
    scanned: (offset or error, bodies), equal."""
    results = []
    for impl in (mpubscan, compiled_mpub):
        bodies = list(taken)
        try:
            value: Any = impl.scan_bodies(buf, start, off, avail, size, count, max_msg, bodies)
        except ProtocolError as exc:
            value = (exc.code, str(exc))
        results.append((value, bodies))
    assert results[0] == results[1]
    return results[0]


compiled_mpub = pytest.importorskip("pynsqd.wire._mpubscan", reason="the compiled kernels are not built")


@pytest.mark.parametrize(("sizes", "max_msg"), [
    ([1, 2, 3], 100), ([100] * 50, 100), ([1048576], 1048576), ([5, 0, 5], 100), ([5, -1], 100),
    ([5, 101], 100), ([7, 2**31 - 1], 2**31 - 1)])
def test_the_mpub_scan_takes_and_refuses_alike_at_every_arrival(sizes: list[int], max_msg: int) -> None:
    body = mpub_body(sizes)
    lead = b"MPUB t\n" + struct.pack(">i", len(body))
    buf = bytearray(lead + body)
    start = len(lead)
    steps = sorted({0, 1, 3, 4, 5, 8, len(body) - 1, len(body), *range(0, len(body), max(1, len(body) // 40))})
    for avail in steps:  # the body arriving in pieces: each scan resumes nowhere but from 4
        if 0 <= avail <= len(body):
            scan_both(buf, start, 4, avail, len(body), len(sizes), max_msg)
    scan_both(buf, start, 4, len(body), len(body) - 1, len(sizes), max_msg)  # declared body too short
    scan_both(buf, start, 4, 2, 5, len(sizes), max_msg)  # no room for the next size


def test_the_mpub_scan_resumes_where_it_stopped() -> None:
    body = mpub_body([10, 20, 30])
    buf = bytearray(body)
    first, bodies = scan_both(buf, 0, 4, 30, len(body), 3, 100)
    assert (first, bodies) == (18, [b"\n" * 10])
    assert scan_both(buf, 0, first, len(body), len(body), 3, 100, tuple(bodies)) == (
        len(body), [b"\n" * 10, b"\x14" * 20, b"\x1e" * 30])


def test_the_parser_splits_an_mpub_in_pieces_the_same_with_either_kernel() -> None:
    body = mpub_body([3, 200, 1, 4096, 77])
    stream = b"MPUB topic\n" + struct.pack(">i", len(body)) + body + b"NOP\n"
    outcomes = []
    for impl in (mpubscan, compiled_mpub):
        commands.__dict__["_scan_bodies"] = impl.scan_bodies
        try:
            parser = commands.CommandParser()
            events = [event for i in range(0, len(stream), 13) for event in parser.feed(stream[i:i + 13])]
        finally:
            commands.__dict__["_scan_bodies"] = ORIGINAL_SCAN
        outcomes.append(events)
    assert outcomes[0] == outcomes[1] and len(outcomes[0]) == 2
    assert [len(b) for b in outcomes[0][0][2]] == [3, 200, 1, 4096, 77]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=60), st.integers(0, (1 << 64) - 1 - 60 * 256),
       st.sampled_from([1, 2, 4, 256]), st.binary(min_size=10, max_size=10))
def test_records_compiled_and_pure_make_the_same_bytes(bodies: list[bytes], first: int, step: int,
                                                       prefix: bytes) -> None:
    twin = pytest.importorskip("pynsqd.wire._idrecords")
    want = idrecords.make_records(prefix, first, step, bodies)
    assert twin.make_records(prefix, first, step, bodies) == want
    assert [r[10:26] for r in want] == [b"%016x" % (first + i * step) for i in range(len(bodies))]


@given(st.lists(st.tuples(st.integers(0, 3000), st.sampled_from([b"", b"L" * 16]), st.integers(0, 4)),
                min_size=1, max_size=60))
@settings(max_examples=200, deadline=None)
def test_put_one_appends_what_the_pure_append_does(steps: list[tuple[int, bytes, int]]) -> None:
    # one record at a time into two rings, taking some out between (so appends meet the end
    # of the area, wrap markers and a full ring): the same answers and the same bytes
    twins = Twins(4096)
    for i, (size, lead, take) in enumerate(steps):
        record = bytes([i & 0xFF]) * size
        got = [impl.put_one(log._buf, log._words, log._cap, log.max_frame, lead, record)
               for impl, log in zip((pure, compiled), twins.logs)]
        assert got[0] == got[1], (i, size)
        assert twins.bufs[0] == twins.bufs[1]
        taken = [log.take_many(take) for log in twins.logs]
        assert taken[0] == taken[1]
    left = twins.each(lambda log: log.take_many(1000))
    assert left[0] == left[1]


def test_put_one_refuses_a_buffer_smaller_than_its_area() -> None:
    log = MessageLog(bytearray(buffer_size(4096)), init=True)
    with pytest.raises(ValueError, match="no 8192-byte record area"):
        compiled.put_one(log._buf, log._words, 8192, log.max_frame, b"", b"x")


def test_one_record_is_next_records_of_one_on_both_kernels() -> None:
    from pynsqd.wire import message

    for make in (idrecords.make_records, message._make_records):
        before = message._make_records
        message._make_records = make
        try:
            one = message.IdFactory(7, 1, 2, clock=lambda: 1_700_000_000_000_000_000)
            batch = message.IdFactory(7, 1, 2, clock=lambda: 1_700_000_000_000_000_000)
            assert one.next_record(b"P" * 10, b"body") == batch.next_records(b"P" * 10, [b"body"])[0]
            assert one.next_id() == batch.next_ids(1)[0]
        finally:
            message._make_records = before


# -- frame runs --------------------------------------------------------------------------------

def frame(frame_type: int, size: int, fill: int) -> bytes:
    """A frame whose size field says ``size`` (its data ``size - 4`` bytes of ``fill``)."""
    return struct.pack(">ii", size, frame_type) + bytes([fill & 0xFF]) * max(0, size - 4)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0, 1, 2, 2, 2, 7]), st.integers(0, 200)), max_size=40),
       st.integers(0, 300), st.integers(0, 50), st.sampled_from([30, 100, 1 << 20]))
def test_frame_runs_compiled_and_pure_find_the_same_messages(frames: list[tuple[int, int]], cut: int, start: int,
                                                             limit: int) -> None:
    twin = pytest.importorskip("pynsqd.wire._frameruns")
    stream = b"".join(frame(t, size, i) for i, (t, size) in enumerate(frames))
    buf = bytearray(stream[:max(0, len(stream) - cut)])  # the stream cut anywhere, maybe mid-frame
    start = min(start, len(buf))
    results = []
    for impl in (frameruns, twin):
        offsets = [7]  # appended to, not replaced
        results.append((impl.scan_messages(buf, start, limit, offsets), offsets))
    assert results[0] == results[1]
    pos, offsets = results[0]
    assert all(buf[o + 7] == 2 for o in offsets[1:])  # each one a message frame
    assert pos == (offsets[-1] + 4 + struct.unpack_from(">i", buf, offsets[-1])[0] if len(offsets) > 1 else start)


def test_frame_runs_answer_lines_are_the_same_and_checked_alike() -> None:
    twin = pytest.importorskip("pynsqd.wire._frameruns")
    frames = b"".join(struct.pack(">ii", 30 + n, 2) + b"t" * 10 + b"%016x" % i + b"b" * n
                      for i, n in enumerate([0, 5, 100]))
    offsets = [0, 34, 73, len(frames)]
    for verb in (b"FIN", b"TOUCH"):
        want = b"".join(verb + b" %016x\n" % i for i in range(3))
        assert frameruns.id_commands(verb, frames, offsets) == twin.id_commands(verb, frames, offsets) == want
        assert twin.id_commands(verb, frames, offsets[1:3]) == verb + b" %016x\n" % 1
        assert frameruns.id_commands(verb, frames, [0]) == twin.id_commands(verb, frames, []) == b""
    for bad in ([len(frames) - 20, len(frames)], [-1, 3]):
        errors = []
        for impl in (frameruns, twin):
            with pytest.raises(ValueError) as caught:
                impl.id_commands(b"FIN", frames, bad)
            errors.append(str(caught.value))
        assert errors[0] == errors[1]
