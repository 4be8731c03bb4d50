"""Consuming: ``Consumer`` subscribes to one topic/channel on every nsqd that carries it.

Theory of operation. The consumer owns one ``_Conn`` per nsqd (key: ``host:port``), found
either from ``nsqd_tcp_addresses`` or by polling ``lookupd_http_addresses``
(``pynsqd.client.discovery``). Each connection is set up as the client guide says — magic,
IDENTIFY, SUB, then RDY — and its message frames go to ``_on_message``:

- ``attempts > max_attempts`` (when ``max_attempts > 0``): ``on_discard(message)`` is called and
  the message is FINed (NSQ's "give up"), without counting for backoff;
- otherwise ``handler(message)`` runs. A plain function runs inline; a coroutine function
  runs as a task (at most ``max_in_flight`` at once, since nsqd never has more in flight).
  Returning normally FINs the message, returning ``False`` or raising REQs it with backoff —
  unless the handler answered it itself or called ``message.disable_auto_response()``.

RDY is kept by ``pynsqd.client.rdy.RdyBook`` (pure state) and backoff by
``pynsqd.client.backoff.RdyBackoff`` (pure state); this module only turns their answers into RDY
commands and timers. A timer every ``rdy_redistribute_interval`` rebalances RDY (it moves RDY
away from idle connections when ``max_in_flight`` is smaller than the number of connections).

Connections per nsqd. NSQ lets one consumer hold several connections to one nsqd on the same
channel, each an ordinary client with its own RDY, and nsqd caps each connection's RDY at its
``--max-rdy-count`` (2,500 by default). So a ``max_in_flight`` larger than that needs more
than one connection: ``connections_per_nsqd=n`` keeps ``n`` to every nsqd, and ``0`` as many
as this consumer's share of ``max_in_flight`` needs at each nsqd's ``max_rdy_count`` (learnt
from the first connection's IDENTIFY reply; ``max_in_flight`` over the nsqds known, rounded
up, at most ``MAX_CONNECTIONS_PER_NSQD``). Connection ``i`` of an nsqd is keyed ``address``
for ``i == 0``, else ``address#i``, in ``conns`` and in the RDY book; each reconnects (or is
rediscovered) on its own.

Reconnection: a direct address is retried after ``reconnect_interval``, doubling per failure
up to ``max_reconnect_interval``, with jitter (``pynsqd.backoff``). A discovered address is
not retried: the next lookupd poll brings it back if it is still listed; a node that every
lookupd stopped listing is closed.

``stop()`` is graceful: RDY 0 everywhere at once (before it waits for anything, so a handler
that requeues what comes after its last message does not get it back again and again, its
attempts counting up to ``max_attempts``, which FINs it), stop discovery, send CLS
everywhere (nsqd stops sending), wait up to ``grace`` seconds for in-flight messages to be
answered, then close the connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
import ssl
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from pynsqd.backoff import Backoff
from pynsqd.client import http as nsq_http
from pynsqd.client.backoff import Action, RdyBackoff, State
from pynsqd.client.config import Features, Identity, TLSOptions
from pynsqd.client.connection import DEFAULT_MAX_RDY_COUNT, NSQProtocol, RawMessage
from pynsqd.client.discovery import lookup, poll_delay
from pynsqd.client.errorlog import ErrorSummary
from pynsqd.client.errors import ClientClosedError, NSQError, ResponseError
from pynsqd.client.handshake import open_connection
from pynsqd.client.message import Message
from pynsqd.client.rdy import RdyBook
from pynsqd.wire.commands import CLS, encode_fin, encode_rdy, encode_req, encode_sub, encode_touch
from pynsqd.wire.names import is_valid_channel_name, is_valid_topic_name

log = logging.getLogger("pynsqd.client")

MAX_CONNECTIONS_PER_NSQD = 256  # connections_per_nsqd=0: the most it opens to one nsqd

Handler = Callable[[Message], "bool | Awaitable[bool | None] | None"]


def conn_key(address: str, index: int) -> str:
    """The key of connection ``index`` to ``address`` in ``Consumer.conns`` and its RDY book."""
    return address if index == 0 else f"{address}#{index}"


class _Conn:
    """One subscribed connection to one nsqd (``index``: which of the consumer's to it)."""

    __slots__ = ("address", "discovered", "errors", "index", "key", "proto", "settings")

    def __init__(self, address: str, proto: NSQProtocol, settings: dict[str, Any], discovered: bool,
                 index: int = 0) -> None:
        self.address = address
        self.index = index
        self.key = conn_key(address, index)
        self.proto = proto
        self.settings = settings
        self.discovered = discovered
        self.errors: ErrorSummary | None = None  # nsqd's non-fatal errors, counted and summarised

    def send(self, data: bytes) -> None:
        self.proto.send(data)


class Consumer:
    """Subscribes ``handler`` to ``topic``/``channel``. ``await start()``, then let it run;
    ``await stop()`` to finish. See the package docstring for the options."""

    def __init__(self, topic: str, channel: str, handler: Handler, *,
                 nsqd_tcp_addresses: Iterable[str] = (), lookupd_http_addresses: Iterable[str] = (),
                 max_in_flight: int = 1, max_attempts: int = 5,
                 on_discard: Callable[[Message], None] | None = None,
                 requeue_delay: float = 90.0, max_requeue_delay: float = 900.0,
                 backoff_multiplier: float = 1.0, max_backoff_duration: float = 120.0,
                 lookupd_poll_interval: float = 60.0, lookupd_poll_jitter: float = 0.3,
                 low_rdy_idle_timeout: float = 10.0, rdy_redistribute_interval: float = 5.0,
                 reconnect_interval: float = 1.0, max_reconnect_interval: float = 60.0,
                 connect_timeout: float = 5.0, identity: Identity | None = None,
                 connections_per_nsqd: int = 1, rng: random.Random | None = None,
                 tls_v1: bool = False, tls_options: TLSOptions | ssl.SSLContext | None = None,
                 snappy: bool = False, deflate: bool = False, deflate_level: int = 6,
                 auth_secret: str | bytes = "") -> None:
        if not is_valid_topic_name(topic):
            raise ValueError(f"invalid topic name {topic!r}")
        if not is_valid_channel_name(channel):
            raise ValueError(f"invalid channel name {channel!r}")
        self.nsqd_tcp_addresses = list(nsqd_tcp_addresses)
        self.lookupd_http_addresses = list(lookupd_http_addresses)
        if not self.nsqd_tcp_addresses and not self.lookupd_http_addresses:
            raise ValueError("give nsqd_tcp_addresses or lookupd_http_addresses")
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        if connections_per_nsqd < 0:
            raise ValueError("connections_per_nsqd must be >= 0 (0: as many as max_in_flight needs)")
        self.connections_per_nsqd = connections_per_nsqd
        self.features = Features.make(tls_v1, tls_options, snappy, deflate, deflate_level, auth_secret)
        self.topic, self.channel, self.handler = topic, channel, handler
        self.max_attempts = max_attempts
        self.on_discard = on_discard
        self.requeue_delay, self.max_requeue_delay = requeue_delay, max_requeue_delay
        self.lookupd_poll_interval, self.lookupd_poll_jitter = lookupd_poll_interval, lookupd_poll_jitter
        self.rdy_redistribute_interval = rdy_redistribute_interval
        self.reconnect_interval, self.max_reconnect_interval = reconnect_interval, max_reconnect_interval
        self.connect_timeout = connect_timeout
        self.identity = identity or Identity()
        self.rng = rng or random.Random()
        self.rdy = RdyBook(max_in_flight, low_rdy_idle_timeout)
        self.backoff = RdyBackoff(backoff_multiplier, max_backoff_duration)
        self.conns: dict[str, _Conn] = {}  # by conn_key
        self._max_rdy: dict[str, int] = {}  # nsqd address → its max_rdy_count (IDENTIFY)
        self._nsqds: set[str] = set(self.nsqd_tcp_addresses)  # addresses known (direct or last lookup)
        self._direct_keys: set[str] = set()  # direct connections with a task keeping them up
        self.stats = {"received": 0, "finished": 0, "requeued": 0, "discarded": 0, "connects": 0,
                      "errors": 0}  # errors: nsqd's E_FIN_FAILED/E_REQ_FAILED/E_TOUCH_FAILED answers
        self._tasks: set[asyncio.Task[Any]] = set()
        self._handler_tasks: set[asyncio.Task[Any]] = set()
        self._pending: set[str] = set()  # keys of discovered connections being made
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._backoff_timer: asyncio.TimerHandle | None = None
        self._started = False
        self._stopping = False
        self._closed = asyncio.Event()
        self._is_coroutine = inspect.iscoroutinefunction(handler)

    # --- public -------------------------------------------------------------------------------
    @property
    def max_in_flight(self) -> int:
        return self.rdy.max_in_flight

    def is_starved(self) -> bool:
        """True when some connection has (nearly) all its RDY in flight: process a batch now."""
        return self.rdy.is_starved()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    async def start(self) -> None:
        """Connect to the direct addresses and start discovery. Returns once the first
        connections were attempted (failed direct addresses keep retrying in the background)."""
        if self._started:
            return
        self._started = True
        self._loop = asyncio.get_running_loop()
        first = [asyncio.Event() for _ in self.nsqd_tcp_addresses]
        for address, attempted in zip(self.nsqd_tcp_addresses, first):
            self._direct_keys.add(address)
            self._spawn(self._direct(address, attempted))
        if self.lookupd_http_addresses:
            self._http = nsq_http.make_client(self.connect_timeout, self.connect_timeout * 2)
            await self._poll_once()
            self._spawn(self._poll_loop())
        self._spawn(self._redistribute_loop())
        if first:
            waits = [asyncio.ensure_future(e.wait()) for e in first]
            _, pending = await asyncio.wait(waits, timeout=self.connect_timeout * 2)
            for waiter in pending:
                waiter.cancel()

    async def stop(self, grace: float = 30.0) -> None:
        """Stop gracefully (see the module docstring). Idempotent."""
        if self._stopping:
            await self._closed.wait()
            return
        self._stopping = True
        for key in list(self.conns):  # now, before any wait: nsqd sends nothing more from here on
            self._send_rdy(key, 0)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._backoff_timer is not None:
            self._backoff_timer.cancel()
        await asyncio.gather(*(self._cls(c) for c in list(self.conns.values())), return_exceptions=True)
        try:
            await asyncio.wait_for(self._idle.wait(), grace)
        except TimeoutError:
            log.warning("stop: %d message(s) still in flight after %.1fs", self._in_flight, grace)
        for task in list(self._handler_tasks):
            task.cancel()
        await asyncio.gather(*self._handler_tasks, return_exceptions=True)
        for conn in list(self.conns.values()):
            conn.proto.close()
        await asyncio.gather(*(c.proto.closed.wait() for c in list(self.conns.values())))
        for conn in list(self.conns.values()):
            if conn.errors is not None:
                conn.errors.close()
        if getattr(self, "_http", None) is not None:
            await self._http.aclose()
        self._closed.set()

    async def wait_closed(self) -> None:
        await self._closed.wait()

    # --- connections --------------------------------------------------------------------------
    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def connections_for(self, address: str) -> int:
        """How many connections this consumer keeps to the nsqd at ``address``."""
        if self.connections_per_nsqd:
            return self.connections_per_nsqd
        max_rdy = self._max_rdy.get(address)
        if not max_rdy:
            return 1  # the first connection's IDENTIFY reply tells
        share = -(-self.max_in_flight // max(1, len(self._nsqds)))
        return max(1, min(MAX_CONNECTIONS_PER_NSQD, -(-share // max_rdy)))

    def _more_connections(self, address: str, discovered: bool) -> None:
        """Start the connections to ``address`` that ``connections_for`` wants and nothing makes."""
        for index in range(1, self.connections_for(address)):
            key = conn_key(address, index)
            if discovered and key not in self.conns and key not in self._pending:
                self._pending.add(key)
                self._spawn(self._discovered(address, index))
            elif not discovered and key not in self._direct_keys:
                self._direct_keys.add(key)
                self._spawn(self._direct(address, asyncio.Event(), index))

    async def _connect(self, address: str, discovered: bool, index: int = 0) -> _Conn:
        proto, settings = await open_connection(address, self.identity.to_json(), self.connect_timeout,
                                                self.features)
        try:
            await proto.command(encode_sub(self.topic, self.channel), self.connect_timeout)
        except BaseException:
            proto.abort()
            raise
        if self._stopping:
            proto.close()
            raise ClientClosedError("consumer is stopping")
        conn = _Conn(address, proto, settings, discovered, index)
        self._attach(conn)
        proto.on_error = conn.errors = ErrorSummary(conn.key, on_count=self._count_error)
        self.conns[conn.key] = conn
        self.stats["connects"] += 1
        max_rdy = int(settings.get("max_rdy_count", DEFAULT_MAX_RDY_COUNT))
        self._max_rdy[address] = max_rdy
        self.rdy.add(conn.key, max_rdy, self._loop.time())
        log.info("%s: subscribed to %s/%s", conn.key, self.topic, self.channel)
        if self.backoff.active:
            self._send_rdy(conn.key, 0)
        else:
            self._apply(self.rdy.rebalance(self._loop.time(), self.rng))
        if index == 0:
            self._more_connections(address, discovered)
        return conn

    def _count_error(self, error: ResponseError) -> None:
        self.stats["errors"] += 1

    def _lost(self, conn: _Conn) -> None:
        if conn.errors is not None:
            conn.errors.close()
        if self.conns.get(conn.key) is conn:
            del self.conns[conn.key]
            self.rdy.remove(conn.key)
            if not self._stopping and not self.backoff.active:
                self._apply(self.rdy.rebalance(self._loop.time(), self.rng))

    async def _direct(self, address: str, attempted: asyncio.Event, index: int = 0) -> None:
        retry = Backoff(self.reconnect_interval, self.max_reconnect_interval, rng=self.rng)
        while not self._stopping:
            try:
                conn = await self._connect(address, discovered=False, index=index)
            except (NSQError, ValueError) as exc:
                attempted.set()
                delay = retry.failed()
                log.warning("%s: %s; retrying in %.1fs", conn_key(address, index), exc, delay)
                await asyncio.sleep(delay)
                continue
            attempted.set()
            retry.reset()
            await conn.proto.closed.wait()
            self._lost(conn)
            if not self._stopping:
                delay = retry.failed()
                log.warning("%s: connection lost; reconnecting in %.1fs", conn.key, delay)
                await asyncio.sleep(delay)

    async def _discovered(self, address: str, index: int = 0) -> None:
        key = conn_key(address, index)
        try:
            conn = await self._connect(address, discovered=True, index=index)
        except (NSQError, ValueError) as exc:
            log.warning("%s: %s (will retry if lookupd still lists it)", key, exc)
            return
        finally:
            self._pending.discard(key)
        await conn.proto.closed.wait()
        self._lost(conn)

    async def _poll_once(self) -> None:
        result = await lookup(self._http, self.lookupd_http_addresses, self.topic)
        if result.complete:
            self._nsqds = set(self.nsqd_tcp_addresses) | set(result.producers)
        else:
            self._nsqds |= set(result.producers)
        for address in sorted(result.producers):
            if address not in self.conns and address not in self._pending:
                self._pending.add(address)
                self._spawn(self._discovered(address))
            elif address in self.conns:
                self._more_connections(address, discovered=True)
        if result.complete:
            for conn in list(self.conns.values()):
                if conn.discovered and conn.address not in result.producers:
                    log.info("%s: no longer listed by any lookupd; closing", conn.key)
                    self._spawn(self._drop(conn))

    async def _drop(self, conn: _Conn) -> None:
        self._lost(conn)
        await self._cls(conn)
        conn.proto.close()

    async def _poll_loop(self) -> None:
        while True:
            await asyncio.sleep(poll_delay(self.lookupd_poll_interval, self.lookupd_poll_jitter, self.rng))
            await self._poll_once()

    async def _redistribute_loop(self) -> None:
        while True:
            await asyncio.sleep(self.rdy_redistribute_interval)
            now = self._loop.time()
            if not self.backoff.active:
                self._apply(self.rdy.rebalance(now, self.rng))
            elif self.backoff.state is State.TESTING:
                self._move_test_rdy(now)

    def _move_test_rdy(self, now: float) -> None:
        """While testing the water, RDY 1 sits on one connection; if that nsqd has nothing
        to send (or the connection went away), try another one."""
        holders = self.rdy.holders()
        if holders and set(self.rdy.idle_holders(now)) != set(holders):
            return
        others = [k for k in self.conns if k not in holders] or list(self.conns)
        if not others:
            return
        for key in holders:
            self._send_rdy(str(key), 0)
        self._send_rdy(self.rng.choice(sorted(others)), 1)

    async def _cls(self, conn: _Conn) -> None:
        if conn.proto.is_open:
            with contextlib.suppress(NSQError):
                await conn.proto.command(CLS, self.connect_timeout)

    # --- RDY ------------------------------------------------------------------------------
    def _send_rdy(self, key: str, count: int) -> None:
        sent = self.rdy.set(key, count, self._loop.time())
        if sent is not None:
            self._conn_send(key, encode_rdy(sent))

    def _apply(self, changes: list[tuple[Any, int]]) -> None:
        for key, count in changes:
            self._conn_send(key, encode_rdy(count))

    def _conn_send(self, key: str, data: bytes) -> None:
        conn = self.conns.get(key)
        if conn is not None:
            conn.send(data)

    def _backoff_action(self, action: Action | None) -> None:
        if action is None:
            return
        now = self._loop.time()
        if action is Action.PAUSE:
            for key in list(self.conns):
                self._send_rdy(key, 0)
            if self._backoff_timer is not None:
                self._backoff_timer.cancel()
            delay = max(0.0, (self.backoff.deadline or now) - now)
            log.warning("backing off for %.1fs (level %d)", delay, self.backoff.level)
            self._backoff_timer = self._loop.call_later(delay, self._backoff_timer_fired)
        elif action is Action.TEST:
            if self.conns:
                address = self.rng.choice(sorted(self.conns))
                self._send_rdy(address, 1)
        elif action is Action.RESUME:
            log.info("backoff complete, resuming normal RDY")
            self._apply(self.rdy.rebalance(now, self.rng))

    def _backoff_timer_fired(self) -> None:
        self._backoff_timer = None
        if self._stopping:
            return
        now = self._loop.time()
        action = self.backoff.on_timer(now)
        if action is None and self.backoff.deadline is not None:
            # the loop's timers may fire a little early (libuv rounds to ms): wait the rest
            self._backoff_timer = self._loop.call_later(max(0.001, self.backoff.deadline - now),
                                                        self._backoff_timer_fired)
            return
        self._backoff_action(action)

    # --- messages ---------------------------------------------------------------------------
    def _attach(self, conn: _Conn) -> None:
        """Route ``conn``'s messages to this consumer (``BatchConsumer`` routes runs instead)."""
        answers = Answers(self, conn)
        conn.proto.on_message = lambda raw: self._on_message(answers, raw)

    def _on_message(self, answers: Answers, raw: RawMessage) -> None:
        timestamp, attempts, msg_id, body = raw
        self.stats["received"] += 1
        self._in_flight += 1
        self._idle.clear()
        self.rdy.on_message(answers.conn.key, self._loop.time())
        msg = Message(answers, msg_id, body, attempts, timestamp)
        if 0 < self.max_attempts < attempts:
            self.stats["discarded"] += 1
            if self.on_discard is not None:
                try:
                    self.on_discard(msg)
                except Exception:
                    log.exception("on_discard failed for %r", msg)
            if not msg.responded:
                msg.responded = True
                answers.answer(encode_fin(msg.id), 1, None)
            return
        if self._is_coroutine:
            self._track(self._run_async(msg))
            return
        result = call_handler(self.handler, msg)
        if result is None or result is True:  # the common case, without inspect
            if not msg.responded and msg.auto_response:
                msg.finish()
            return
        if inspect.isawaitable(result):
            self._track(self._await_result(msg, result))
            return
        self._auto_respond(msg, result)

    def _track(self, coro: Awaitable[None]) -> None:
        """Run a handler's coroutine as a task that ``stop`` cancels if it outlives the grace."""
        task = asyncio.ensure_future(coro)
        self._handler_tasks.add(task)
        task.add_done_callback(self._handler_tasks.discard)

    async def _run_async(self, msg: Message) -> None:
        try:
            result = await self.handler(msg)  # type: ignore[misc]
        except Exception:
            log.exception("handler failed for %r", msg)
            result = False
        self._auto_respond(msg, result)

    async def _await_result(self, msg: Message, awaitable: Awaitable[bool | None]) -> None:
        try:
            result = await awaitable
        except Exception:
            log.exception("handler failed for %r", msg)
            result = False
        self._auto_respond(msg, result)

    def _auto_respond(self, msg: Message, result: object) -> None:
        if msg.responded or not msg.auto_response:
            return
        if result is False:
            msg.requeue()
        else:
            msg.finish()

    def _answered(self, conn: _Conn, count: int, success: bool | None) -> None:
        """``count`` messages delivered on ``conn`` were answered (the commands are sent):
        in-flight and RDY bookkeeping, one backoff result (``success`` None: none)."""
        self._in_flight -= count
        if self._in_flight <= 0:
            self._in_flight = 0
            self._idle.set()
        if self.conns.get(conn.key) is not conn:
            return
        self.rdy.on_done(conn.key, count)
        if success is not None and not self._stopping:
            self._backoff_action(self.backoff.result(success, self._loop.time()))
        if not self.backoff.active and not self._stopping:
            want = self.rdy.wants_update(conn.key)
            if want is not None:
                self._send_rdy(conn.key, want)


def call_handler(handler: Callable[[Any], object], delivered: object) -> object:
    """``handler(delivered)``'s result; ``False`` (requeue) when it raised, which is logged."""
    try:
        return handler(delivered)
    except Exception:
        log.exception("handler failed for %r", delivered)
        return False


class Answering:
    """Answers to what one connection delivered to a consumer: they go out on that
    connection, and the consumer counts them (in flight, RDY, backoff)."""

    __slots__ = ("conn", "consumer")

    def __init__(self, consumer: Consumer, conn: _Conn) -> None:
        self.consumer = consumer
        self.conn = conn

    @property
    def nsqd_address(self) -> str:
        return self.conn.address

    def answer(self, commands: bytes, count: int, success: bool | None) -> None:
        """Send the answers of ``count`` messages (``success``: the backoff result, None for none)."""
        self.conn.send(commands)
        self.consumer._answered(self.conn, count, success)


class Answers(Answering):
    """The ``Responder`` of the messages one connection delivers (``message.Message``)."""

    __slots__ = ()

    def finish(self, message: Message) -> None:
        self.consumer.stats["finished"] += 1
        self.answer(encode_fin(message.id), 1, True)

    def requeue(self, message: Message, delay: float | None, backoff: bool) -> None:
        consumer = self.consumer
        if delay is None:
            delay = min(consumer.requeue_delay * message.attempts, consumer.max_requeue_delay)
        consumer.stats["requeued"] += 1
        self.answer(encode_req(message.id, max(0, int(delay * 1000))), 1, False if backoff else None)

    def touch(self, message: Message) -> None:
        self.conn.send(encode_touch(message.id))


__all__ = ["Answering", "Answers", "Consumer", "Handler", "ResponseError", "call_handler"]
