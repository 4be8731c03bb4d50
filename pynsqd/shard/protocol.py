"""Protocol V2 for one TCP connection: a thin ``asyncio.Protocol`` over ``pynsqd.wire``.

Theory of operation
-------------------
``data_received`` checks the magic once, feeds ``CommandParser`` and runs each command it
returns through its handler on the connection's ``Session`` (``commands.py``: the commands,
their checks in nsqd's order, and the session state they change). ``ClientV2`` is the
connection around them: bytes in and out, buffering, timers, upgrades — the ``Link`` the
session writes through — and the ``Subscriber`` its channel delivers to (``subscriber.py``). A
``ProtocolError`` becomes an error frame; a fatal one also closes the connection once
everything queued before it has been written.

Output: message frames collect in ``_out`` and are written when the buffer reaches the
negotiated ``output_buffer_size``, when the consumer has no room left (RDY reached), or
after ``output_buffer_timeout`` — nsqd's buffering. Responses and errors flush at once,
behind any buffered messages, so order on the wire is the order of events.

Back-pressure: when the transport's buffer passes its high-water mark (``pause_writing``)
the connection stops taking messages and stops reading commands; if it stays stuck for a
heartbeat interval (nsqd's write deadline) it is closed and its messages go back to the
channel. A connection that sends nothing for two heartbeat intervals is closed too.

Features (``transport.py``, ``auth.py``): an IDENTIFY that negotiates TLS or compression
upgrades the connection before any further command is read; a connection that sent bytes
beyond such an IDENTIFY is refused (the client must wait for the upgrade's ``OK``). With
``--tls-required`` every command but IDENTIFY needs TLS. A command that must ask the auth
server first (AUTH, or a check after the TTL expired) suspends the command stream: reading
pauses, the query runs, and the same command runs again with the answer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
import ssl
import struct
import time
from collections import deque
from collections.abc import Coroutine
from typing import Any, cast

from pynsqd.node.config import NsqdOptions
from pynsqd.node.identify import Settings
from pynsqd.node.messages import ConnectionState
from pynsqd.options import MS
from pynsqd.shard.auth import AuthSession, NeedQuery
from pynsqd.shard.broker import RING_RETRY, Backpressure, Broker
from pynsqd.shard.commands import COMMANDS, STATE_CLOSING, STATE_SUBSCRIBED, Relayed, Session
from pynsqd.shard.transport import CompressedTransport, peer_common_name, start_tls, tls_info
from pynsqd.wire import MAGIC_V2
from pynsqd.wire.commands import FIN_RUN, Command, CommandParser, encode_command
from pynsqd.wire.compression import Codec, CompressionError, make_codec
from pynsqd.wire.errors import ProtocolError
from pynsqd.wire.frames import (
    FRAME_ERROR,
    FRAME_MESSAGE,
    HEARTBEAT_FRAME,
    OK_FRAME,
    encode_frame,
)

log = logging.getLogger("pynsqd.shard")

_MSG_HEADER = struct.Struct(">ii")
_ATTEMPTS = struct.Struct(">H")
_pack_header = _MSG_HEADER.pack
_pack_attempts_into = _ATTEMPTS.pack_into


class ClientV2(asyncio.Protocol):
    """One client connection speaking protocol V2: the ``Link`` of its ``session`` and the
    ``Subscriber`` of the channel it subscribes to."""

    _next_id = 0

    def __init__(self, broker: Broker, opts: NsqdOptions, tls_ctx: ssl.SSLContext | None = None,
                 handoff: tuple[ConnectionState, bytes] | None = None) -> None:
        self.broker = broker
        self.opts = opts
        self.session = Session(self, broker, opts)
        self.in_flight_count = 0  # messages of ours the channel holds in flight
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self._handoff = handoff  # (state, unread bytes) of a connection adopted from elsewhere
        self._unreplayed = b""  # handed-over bytes not yet fed to the parser
        self._ring_full = False  # the next command waits for room in another shard's ring
        self._ring_timer: asyncio.TimerHandle | None = None
        self.tls_ctx = tls_ctx
        self._tls_required = opts.tls_required != "false"
        self._decoder: Codec | None = None
        self._events: deque[Command | ProtocolError] = deque()
        self._suspended = False  # an upgrade or auth query is running: hold commands and output
        self._task: asyncio.Task[None] | None = None
        ClientV2._next_id += 1
        self.id = ClientV2._next_id
        self.transport: asyncio.Transport | None = None
        self._parser = CommandParser(opts.max_msg_size, opts.max_body_size, opts.max_req_timeout // MS,
                                     fin_runs=True)
        self._magic = b""
        self._out = bytearray()
        self._flush_timer: asyncio.TimerHandle | None = None
        self._heartbeat_timer: asyncio.TimerHandle | None = None
        self._last_read = time.monotonic_ns()
        self._write_paused_at = 0
        self._closing = False
        self._batching = False  # commands of one read are running: responses wait in ``_out``
        self._responded = False  # ... and one did: flush when they are done

    def __repr__(self) -> str:
        return f"<ClientV2 {self.session.remote_address}>"

    @property
    def remote_address(self) -> str:
        return self.session.remote_address

    # --- asyncio.Protocol -----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        host = str(peer[0]) if isinstance(peer, tuple) else "unix"
        session = self.session
        session.remote_address = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer or "unix")
        session.settings = Settings.defaults(self.opts, host)
        session.auth = AuthSession(self.opts, host)
        self.broker.clients.add(self)
        handoff, self._handoff = self._handoff, None
        if handoff is not None:
            self._adopt(*handoff)
        if self._out:  # frames a replaced shard had not written yet (``restore_session``)
            self.flush()
        self.arm_heartbeat()
        log.debug("TCP: new client(%s)", self.remote_address)
        if handoff is not None and handoff[1]:
            # Replay the handed-over bytes once the transport is fully started: an upgrade
            # they ask for pauses reading, which uvloop ignores inside connection_made. Bytes
            # read from the socket before the replay runs go behind them (data_received).
            self._unreplayed = handoff[1]
            asyncio.get_running_loop().call_soon(self._replay)

    def _replay(self) -> None:
        if self._unreplayed:
            self.data_received(b"")

    def _adopt(self, state: ConnectionState, unread: bytes) -> None:
        """Take over what the supervisor (or another shard) already did on this connection."""
        session = self.session
        if state.remote:
            session.remote_address = state.remote
        if state.settings is not None:
            session.settings = state.settings
        if state.magic:
            self._magic = MAGIC_V2
        session.pub_counts.update(state.pub_counts)
        # A relayed connection: TLS and compression stay on the relaying shard's side of the
        # pump (it decodes and encodes); they show in this shard's stats and satisfy
        # --tls-required here, and the AUTH session carries over.
        if state.tls:
            session.tls = True
            session.tls_info = dict(state.tls)
        session.compression = state.compression
        if state.auth and session.auth is not None:
            session.auth.restore(state.auth)

    @property
    def decoder(self) -> Codec | None:
        """The inbound decompressor once snappy or deflate is on (a relay keeps using it)."""
        return self._decoder

    def relay_state(self) -> ConnectionState:
        """What ``_adopt`` takes over on the shard this connection is relayed to."""
        session = self.session
        auth = session.auth.export() if session.auth is not None else None
        return ConnectionState(magic=True, remote=session.remote_address,
                               settings=dataclasses.replace(session.settings), pub_counts=dict(session.pub_counts),
                               tls=session.tls_info if session.tls else None, compression=session.compression,
                               auth=auth)

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        if self._unreplayed:
            data, self._unreplayed = self._unreplayed + data, b""
        self._last_read = time.monotonic_ns()
        if len(self._magic) < 4:
            need = 4 - len(self._magic)
            self._magic += data[:need]
            data = data[need:]
            if len(self._magic) < 4:
                return
            if self._magic != MAGIC_V2:
                log.error("client(%s) bad protocol magic %r", self.remote_address, self._magic)
                self._fatal(ProtocolError("E_BAD_PROTOCOL"))
                return
            if not data:
                return
        if self._decoder is None:
            self._events.extend(self._parser.feed(data))
        else:
            try:
                for piece in self._decoder.decode(data):
                    self._events.extend(self._parser.feed(piece))
                    if self._parser.failed:
                        break
            except CompressionError as exc:
                log.error("client(%s) failed to read command - %s", self.remote_address, exc)
                self.close()
                return
        self._run_events()

    def _run_events(self) -> None:
        """Run the commands read so far; their responses go out in one write at the end."""
        self._batching = True
        try:
            self._run_commands()
        finally:
            self._batching = False
            if self._responded:
                self._responded = False
                self.flush()

    def _run_commands(self) -> None:
        events = self._events
        session = self.session
        while events and not self._suspended and not self._ring_full and not self._closing:
            event = events.popleft()
            if isinstance(event, ProtocolError):
                self._fatal(event)
                return
            name, params, body = event
            if name is FIN_RUN:  # several FINs read at once (the parser's fast path)
                if (session.state not in (STATE_SUBSCRIBED, STATE_CLOSING) or session.channel is None
                        or (self._tls_required and not session.tls)):
                    # not the common case: one at a time, for each one's own error
                    events.extendleft([(b"FIN", [b"FIN", msg_id], None) for msg_id in reversed(params)])
                else:
                    session.fin_many(params)
                continue
            handler = COMMANDS.get(name)
            try:
                if self._tls_required and not session.tls and name != b"IDENTIFY":
                    raise ProtocolError("E_INVALID", f"cannot {name.decode('utf-8', 'surrogateescape')} "
                                        "in current state (TLS required)")
                if handler is None:
                    raise ProtocolError("E_INVALID", f"invalid command {name.decode('utf-8', 'surrogateescape')}")
                handler(session, params, body)
            except NeedQuery:
                events.appendleft(event)
                self.suspend(self._query_auth())
            except Backpressure:
                events.appendleft(event)
                self._wait_for_ring()
                return
            except Relayed as relayed:
                assert self.broker.router is not None
                events.appendleft(event)
                self.flush()  # the answers before it, ahead of the relayed stream
                self.broker.router.relay(self, relayed.owner, self.pending_input(events))
                return
            except ProtocolError as exc:
                if exc.fatal:
                    self._fatal(exc)
                    return
                log.debug("client(%s) %s", self.remote_address, exc.text)
                self.send(encode_frame(FRAME_ERROR, exc.encode_text()))

    def _wait_for_ring(self) -> None:
        """Another shard's inbound ring is full: stop reading, retry the held commands soon."""
        self._ring_full = True
        if self.transport is not None:
            self.transport.pause_reading()
        self._ring_timer = asyncio.get_running_loop().call_later(RING_RETRY, self._ring_retry)

    def _ring_retry(self) -> None:
        self._ring_timer = None
        self._ring_full = False
        if self._closing:
            return
        self._run_events()
        if (not self._ring_full and not self._closing and not self._suspended and not self._write_paused_at
                and self.transport is not None):
            self.transport.resume_reading()

    def stop_delivery(self) -> None:
        """Shutdown: no more messages (as after CLS); FIN, REQ and TOUCH still work."""
        session = self.session
        if session.state == STATE_SUBSCRIBED:
            session.rdy = 0
            session.state = STATE_CLOSING
            self.flush()

    def detach(self) -> None:
        """Stop serving this connection without closing it (it is relayed elsewhere now)."""
        self._closing = True
        for timer in (self._flush_timer, self._heartbeat_timer, self._ring_timer):
            if timer is not None:
                timer.cancel()
        self.broker.clients.discard(self)
        self.broker.stuck.discard(self)

    def input_pending(self) -> bool:
        return bool(self._events) or bool(self._parser.buffered)

    def pending_input(self, events: deque[Command | ProtocolError]) -> bytes:
        """The raw (decoded) bytes of ``events`` and of what the parser holds, for a relay."""
        out = b"".join(encode_command(*e) for e in events if not isinstance(e, ProtocolError))
        events.clear()
        return out + self._parser.unparsed()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._events.clear()
        for timer in (self._flush_timer, self._heartbeat_timer, self._ring_timer):
            if timer is not None:
                timer.cancel()
        self.broker.clients.discard(self)
        self.broker.stuck.discard(self)
        channel = self.session.channel
        if channel is not None:
            channel.remove_consumer(self, time.monotonic_ns())
            self.broker.consumer_left(channel)
        log.debug("client(%s) closed", self.remote_address)

    def pause_writing(self) -> None:
        self._write_paused_at = time.monotonic_ns()
        self.broker.stuck.add(self)
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self._write_paused_at = 0
        self.broker.stuck.discard(self)
        if self.transport is not None and not self._closing and not self._suspended and not self._ring_full:
            self.transport.resume_reading()
        if self.session.channel is not None:
            self.session.channel.notify_ready()

    # --- writing --------------------------------------------------------------------------
    def send(self, frame: bytes) -> None:
        """Write a response/error frame now, behind any buffered messages (or, while a read's
        commands run, once they have all run: one write for a pipelining client)."""
        if self.transport is None or self._closing:
            return
        if self._batching:
            self._out += frame
            self._responded = True
        elif self._out or self._suspended:
            self._out += frame
            self.flush()
        else:
            self.transport.write(frame)

    def flush(self) -> None:
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        if self._out and self.transport is not None and not self._closing and not self._suspended:
            out = self._out
            self._out = bytearray()
            self.transport.write(out)

    def _fatal(self, exc: ProtocolError) -> None:
        log.error("client(%s) - %s", self.remote_address, exc.text)
        self.send(encode_frame(FRAME_ERROR, exc.encode_text()))
        self.close()

    def close(self) -> None:
        """Close after what is queued has been written."""
        if not self._closing:
            self._closing = True
            self._flush_out_for_close()
            if self.transport is not None:
                self.transport.close()

    def _flush_out_for_close(self) -> None:
        if self._out and self.transport is not None and not self._suspended:
            self.transport.write(self._out)
            self._out = bytearray()

    # --- what the channel calls -----------------------------------------------------------
    @property
    def msg_timeout(self) -> int:
        return self.session.settings.msg_timeout

    @property
    def sample_rate(self) -> int:
        return self.session.settings.sample_rate

    def capacity(self) -> int:
        session = self.session
        if session.state != STATE_SUBSCRIBED or self._write_paused_at or self._closing:
            return 0
        return session.rdy - self.in_flight_count

    def output(self) -> bytearray:
        """The buffer message frames go to; call ``delivered`` after appending to it."""
        return self._out

    def deliver(self, messages: list[tuple[bytes, int]]) -> None:
        """Send encoded messages with their attempts (this delivery included)."""
        out = self._out
        for record, attempts in messages:
            pos = len(out)
            out += _pack_header(len(record) + 4, FRAME_MESSAGE)
            out += record
            _pack_attempts_into(out, pos + 16, attempts)
        self.delivered(len(messages))

    def delivered(self, count: int) -> None:
        """``count`` message frames were appended to ``output()``: flush as nsqd would."""
        self.message_count += count
        out = self._out
        settings = self.session.settings
        if len(out) >= settings.output_buffer_size or self.capacity() <= 0:
            self.flush()
        elif self._flush_timer is None and settings.output_buffer_timeout:
            loop = asyncio.get_running_loop()
            self._flush_timer = loop.call_later(settings.output_buffer_timeout / 1e9, self.flush)

    def close_for_channel_delete(self) -> None:
        self.close()

    def check_deadlines(self, now: int) -> None:
        """Called every scan: nsqd's read deadline (2 heartbeats) and write deadline (1).
        The write deadline holds for a closing connection too: a close waits for what is
        queued to be written, which a client that does not read never lets happen."""
        hb = self.session.settings.heartbeat_interval
        if not hb:
            return
        if self._write_paused_at and now - self._write_paused_at > hb:
            log.info("client(%s) write timed out: not reading", self.remote_address)
            self._write_paused_at = 0  # once: the abort's connection_lost follows
            self._closing = True
            if self.transport is not None:
                self.transport.abort()
        elif not self._closing and now - self._last_read > 2 * hb:
            log.info("client(%s) timed out: no data for %.1fs", self.remote_address, 2 * hb / 1e9)
            self.close()

    def arm_heartbeat(self) -> None:
        if self._heartbeat_timer is not None:
            self._heartbeat_timer.cancel()
            self._heartbeat_timer = None
        hb = self.session.settings.heartbeat_interval
        if hb and not self._closing:
            loop = asyncio.get_running_loop()
            self._heartbeat_timer = loop.call_later(hb / 1e9, self._heartbeat)

    def _heartbeat(self) -> None:
        self._heartbeat_timer = None
        self.send(HEARTBEAT_FRAME)
        self.arm_heartbeat()

    # --- a shard's replacement (``transfer.py``) --------------------------------------------
    @property
    def movable(self) -> bool:
        """Everything this connection is can move to another process now: its transport is
        plain (a relayed connection's TLS and compression stay on the relaying shard), no
        upgrade or auth query runs, nothing waits in the transport to be written, and it is
        not retrying a batch already stored in part (only this process knows which part)."""
        transport = self.transport
        return (transport is not None and not self._closing and not self._suspended and self._decoder is None
                and not self._parser.failed and not isinstance(transport, CompressedTransport)
                and transport.get_extra_info("ssl_object") is None and not transport.get_write_buffer_size()
                and not any(isinstance(e, ProtocolError) or self.broker.stored_in_part(e[2]) for e in self._events))

    def freeze(self) -> None:
        """Read nothing more here (the shard is being replaced)."""
        if self.transport is not None and not self._closing:
            self.transport.pause_reading()

    def hand_over(self) -> tuple[int, ConnectionState, dict[str, Any], bytes, bytes]:
        """Stop serving this (``movable``) connection here, keeping the connection open, and
        return what a replacement needs to carry on: a duplicate of its descriptor, its
        state, its session (``restore_session``), the message frames not written yet and the
        bytes read but not yet run. The caller took it out of its channel's consumers."""
        assert self.transport is not None
        fd = os.dup(self.transport.get_extra_info("socket").fileno())
        unread = self.pending_input(self._events) + self._unreplayed
        state = self.relay_state()
        if len(self._magic) < 4:
            state = dataclasses.replace(state, magic=False)
            unread = self._magic + unread
        channel = self.session.channel
        session = {"state": self.session.state, "topic": channel.topic_name if channel else "",
                   "channel": channel.name if channel else "", "rdy": self.session.rdy,
                   "message_count": self.message_count, "finish_count": self.finish_count,
                   "requeue_count": self.requeue_count, "connect_ts": self.session.connect_ts,
                   "last_read": self._last_read}
        out = bytes(self._out)
        self.session.channel = None
        self.detach()
        self.transport.abort()  # closes this process's descriptor only
        return fd, state, session, out, unread

    def restore_session(self, state: ConnectionState, session: dict[str, Any], out: bytes) -> None:
        """Before the connection is made here: carry on from ``hand_over`` of a replaced
        shard (the caller subscribes it to its channel again)."""
        if state.settings is not None:
            self.session.settings = state.settings
        self.session.state = int(session["state"])
        self.session.rdy = int(session["rdy"])
        self.message_count = int(session["message_count"])
        self.finish_count = int(session["finish_count"])
        self.requeue_count = int(session["requeue_count"])
        self.session.connect_ts = int(session["connect_ts"])
        self._last_read = int(session["last_read"])
        self._out = bytearray(out)

    # --- suspending the command stream: upgrades and auth queries --------------------------
    def suspend(self, work: Coroutine[Any, Any, None]) -> None:
        """Hold commands and output until ``work`` (a coroutine) is done, then carry on."""
        self.flush()  # what was answered before goes out first (an IDENTIFY before its TLS)
        self._suspended = True
        assert self.transport is not None
        self.transport.pause_reading()
        self._task = asyncio.get_running_loop().create_task(self._run_suspended(work))

    async def _run_suspended(self, work: Coroutine[Any, Any, None]) -> None:
        try:
            await work
        finally:
            self._suspended = False
            self._task = None
            self._last_read = time.monotonic_ns()  # a handshake or query is not client silence
        if self._closing or self.transport is None:
            return
        self.flush()
        if not self._write_paused_at:
            self.transport.resume_reading()
        self._run_events()

    async def _query_auth(self) -> None:
        session = self.session
        assert session.auth is not None and self.transport is not None
        await session.auth.query(session.tls, peer_common_name(self.transport) if session.tls else "")

    async def upgrade_tls(self, compression: str, level: int) -> None:
        assert self.transport is not None and self.tls_ctx is not None
        try:
            self.transport = await start_tls(self.transport, self, self.tls_ctx)
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            log.error("client(%s) - E_IDENTIFY_FAILED IDENTIFY failed %s", self.remote_address, exc)
            self._closing = True
            if self.transport is not None:
                self.transport.abort()
            return
        self.session.tls = True
        self.session.tls_info = tls_info(self.transport)
        self._suspended = False
        held, self._out = self._out, bytearray()  # a heartbeat due during the handshake
        self.send(OK_FRAME)
        if compression:
            self.compress(compression, level)
        self._out += held

    def compress(self, name: str, level: int) -> None:
        assert self.transport is not None
        self.flush()  # the IDENTIFY response, uncompressed
        log.info("PROTOCOL(V2): [%s] upgrading connection to %s", self.remote_address, name)
        codec = make_codec(name, level)
        self.transport = cast(asyncio.Transport, CompressedTransport(self.transport, codec))
        self._decoder = codec
        self.session.compression = name
        self.send(OK_FRAME)
