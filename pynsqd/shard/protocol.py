"""Protocol V2 for one TCP connection: a thin ``asyncio.Protocol`` over ``pynsqd.wire``.

Theory of operation
-------------------
``data_received`` checks the magic once, feeds ``CommandParser`` and runs each command it
returns through a handler that follows nsqd's checks in nsqd's order (state, parameters,
names, then the action). A ``ProtocolError`` becomes an error frame; a fatal one also
closes the connection once everything queued before it has been written.

States (``stateInit`` 0 → ``stateSubscribed`` 3 → ``stateClosing`` 4, as in nsqd's stats):
IDENTIFY, AUTH and SUB only in INIT (IDENTIFY may repeat); RDY, FIN, REQ, TOUCH once
subscribed (FIN/REQ/TOUCH also while closing; RDY is ignored while closing); PUB, MPUB,
DPUB and NOP in any state.

Output: message frames collect in ``_out`` and are written when the buffer reaches the
negotiated ``output_buffer_size``, when the consumer has no room left (RDY reached), or
after ``output_buffer_timeout`` — nsqd's buffering. Responses and errors flush at once,
behind any buffered messages, so order on the wire is the order of events.

Back-pressure: when the transport's buffer passes its high-water mark (``pause_writing``)
the connection stops taking messages and stops reading commands; if it stays stuck for a
heartbeat interval (nsqd's write deadline) it is closed and its messages go back to the
channel. A connection that sends nothing for two heartbeat intervals is closed too.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import time
from typing import Any, cast

from pynsqd.options import MS
from pynsqd.shard.broker import Backpressure, Broker, BrokerError
from pynsqd.shard.channel import Channel, ChannelError
from pynsqd.shard.config import NsqdOptions
from pynsqd.shard.identify import Settings, negotiate
from pynsqd.shard.inflight import InFlightTable
from pynsqd.wire import MAGIC_V2
from pynsqd.wire.commands import CommandParser, encode_command, ms_to_duration_ns, parse_base10
from pynsqd.wire.errors import ProtocolError, go_quote
from pynsqd.wire.frames import (
    CLOSE_WAIT_FRAME,
    FRAME_ERROR,
    FRAME_MESSAGE,
    HEARTBEAT_FRAME,
    OK_FRAME,
    encode_frame,
    encode_response,
)
from pynsqd.wire.names import is_valid_name

log = logging.getLogger("pynsqd.shard")

STATE_INIT = 0
STATE_SUBSCRIBED = 3
STATE_CLOSING = 4

_MSG_HEADER = struct.Struct(">ii")
_ATTEMPTS = struct.Struct(">H")
_pack_header = _MSG_HEADER.pack
_pack_attempts_into = _ATTEMPTS.pack_into
STALL_RETRY = 0.001  # seconds between tries to put into a full cross-shard ring


class Relayed(Exception):
    """A SUB for a topic another shard owns: the connection moves there (``shard/relay.py``)."""

    def __init__(self, owner: int) -> None:
        super().__init__(owner)
        self.owner = owner


class ClientV2(asyncio.Protocol):
    """One client connection speaking protocol V2."""

    _next_id = 0

    def __init__(self, broker: Broker, opts: NsqdOptions,
                 handoff: tuple[dict[str, Any], bytes] | None = None) -> None:
        self.broker = broker
        self._handoff = handoff  # (state, unread bytes) of a connection adopted from elsewhere
        self._stalled: list[Any] = []  # commands waiting for room in another shard's ring
        self._stall_timer: asyncio.TimerHandle | None = None
        self.opts = opts
        ClientV2._next_id += 1
        self.id = ClientV2._next_id
        self.transport: asyncio.Transport | None = None
        self.remote_address = ""
        self.settings: Settings
        self.state = STATE_INIT
        self.channel: Channel | None = None
        self.rdy = 0
        self.in_flight = InFlightTable()
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.pub_counts: dict[str, int] = {}
        self.connect_ts = int(time.time())
        self._parser = CommandParser(opts.max_msg_size, opts.max_body_size, opts.max_req_timeout // MS)
        self._magic = b""
        self._out = bytearray()
        self._flush_timer: asyncio.TimerHandle | None = None
        self._heartbeat_timer: asyncio.TimerHandle | None = None
        self._last_read = time.monotonic_ns()
        self._write_paused_at = 0
        self._closing = False
        self._handlers = {
            b"IDENTIFY": self._identify, b"SUB": self._sub, b"RDY": self._rdy,
            b"FIN": self._fin, b"REQ": self._req, b"TOUCH": self._touch, b"CLS": self._cls,
            b"NOP": self._nop, b"PUB": self._pub, b"MPUB": self._mpub, b"DPUB": self._dpub,
            b"AUTH": self._auth,
        }

    def __repr__(self) -> str:
        return f"<ClientV2 {self.remote_address}>"

    # --- asyncio.Protocol -----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        host = str(peer[0]) if isinstance(peer, tuple) else "unix"
        self.remote_address = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer or "unix")
        self.settings = Settings.defaults(self.opts, host)
        self.broker.clients.add(self)
        handoff, self._handoff = self._handoff, None
        if handoff is not None:
            self._adopt(*handoff)
        self._arm_heartbeat()
        log.debug("TCP: new client(%s)", self.remote_address)
        if handoff is not None and handoff[1]:
            self.data_received(handoff[1])

    def _adopt(self, state: dict[str, Any], unread: bytes) -> None:
        """Take over what the supervisor (or another shard) already did on this connection."""
        if state.get("remote"):
            self.remote_address = state["remote"]
        if state.get("settings"):
            self.settings = Settings(**state["settings"])
        if state.get("magic"):
            self._magic = MAGIC_V2
        for topic, count in (state.get("pub_counts") or {}).items():
            self.pub_counts[topic] = count

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
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
        if self._stalled:
            self._stalled.extend(self._parser.feed(data))
            return
        self._run(self._parser.feed(data))

    def _run(self, events: list[Any]) -> None:
        for i, event in enumerate(events):
            if isinstance(event, ProtocolError):
                self._fatal(event)
                return
            name, params, body = event
            handler = self._handlers.get(name)
            try:
                if handler is None:
                    raise ProtocolError("E_INVALID", f"invalid command {name.decode('utf-8', 'surrogateescape')}")
                handler(params, body)
            except Backpressure:
                self._stall(events[i:])
                return
            except Relayed as relayed:
                assert self.broker.router is not None
                self.broker.router.relay(self, relayed.owner, self.pending_input(events[i:]))
                return
            except ProtocolError as exc:
                if exc.fatal:
                    self._fatal(exc)
                    return
                log.debug("client(%s) %s", self.remote_address, exc.text)
                self._send(encode_frame(FRAME_ERROR, exc.encode_text()))
            if self._closing:
                return

    def _stall(self, events: list[Any]) -> None:
        """Another shard's inbound ring is full: stop reading, retry the commands soon."""
        self._stalled = events
        if self.transport is not None:
            self.transport.pause_reading()
        self._stall_timer = asyncio.get_running_loop().call_later(STALL_RETRY, self._unstall)

    def _unstall(self) -> None:
        self._stall_timer = None
        events, self._stalled = self._stalled, []
        if self._closing:
            return
        self._run(events)
        if not self._stalled and not self._closing and self.transport is not None:
            self.transport.resume_reading()

    def stop_delivery(self) -> None:
        """Shutdown: no more messages (as after CLS); FIN, REQ and TOUCH still work."""
        if self.state == STATE_SUBSCRIBED:
            self.rdy = 0
            self.state = STATE_CLOSING
            self._flush()

    def detach(self) -> None:
        """Stop serving this connection without closing it (it is relayed elsewhere now)."""
        self._closing = True
        for timer in (self._flush_timer, self._heartbeat_timer, self._stall_timer):
            if timer is not None:
                timer.cancel()
        self.broker.clients.discard(self)

    def pending_input(self, events: list[Any]) -> bytes:
        """The raw bytes of ``events`` and of what the parser holds, for a relay."""
        return b"".join(encode_command(*e) for e in events) + self._parser.unparsed()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        for timer in (self._flush_timer, self._heartbeat_timer, self._stall_timer):
            if timer is not None:
                timer.cancel()
        self.broker.clients.discard(self)
        channel = self.channel
        if channel is not None:
            channel.remove_consumer(self, time.monotonic_ns())
            self.broker.consumer_left(channel)
        log.debug("client(%s) closed", self.remote_address)

    def pause_writing(self) -> None:
        self._write_paused_at = time.monotonic_ns()
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self._write_paused_at = 0
        if self.transport is not None and not self._closing:
            self.transport.resume_reading()
        if self.channel is not None:
            self.channel.notify_ready()

    # --- writing --------------------------------------------------------------------------
    def _send(self, frame: bytes) -> None:
        """Write a response/error frame now, behind any buffered messages."""
        if self.transport is None or self._closing:
            return
        if self._out:
            self._out += frame
            self._flush()
        else:
            self.transport.write(frame)

    def _flush(self) -> None:
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        if self._out and self.transport is not None and not self._closing:
            out = self._out
            self._out = bytearray()
            self.transport.write(out)

    def _fatal(self, exc: ProtocolError) -> None:
        log.error("client(%s) - %s", self.remote_address, exc.text)
        self._send(encode_frame(FRAME_ERROR, exc.encode_text()))
        self.close()

    def close(self) -> None:
        """Close after what is queued has been written."""
        if not self._closing:
            self._closing = True
            self._flush_out_for_close()
            if self.transport is not None:
                self.transport.close()

    def _flush_out_for_close(self) -> None:
        if self._out and self.transport is not None:
            self.transport.write(self._out)
            self._out = bytearray()

    # --- what the channel calls -----------------------------------------------------------
    @property
    def msg_timeout(self) -> int:
        return self.settings.msg_timeout

    @property
    def sample_rate(self) -> int:
        return self.settings.sample_rate

    def capacity(self) -> int:
        if self.state != STATE_SUBSCRIBED or self._write_paused_at or self._closing:
            return 0
        return self.rdy - len(self.in_flight)

    def deliver(self, messages: list[tuple[bytes, int]]) -> None:
        out = self._out
        for record, attempts in messages:
            pos = len(out)
            out += _pack_header(len(record) + 4, FRAME_MESSAGE)
            out += record
            _pack_attempts_into(out, pos + 16, attempts)
        self.message_count += len(messages)
        settings = self.settings
        if len(out) >= settings.output_buffer_size or self.capacity() <= 0:
            self._flush()
        elif self._flush_timer is None and settings.output_buffer_timeout:
            loop = asyncio.get_running_loop()
            self._flush_timer = loop.call_later(settings.output_buffer_timeout / 1e9, self._flush)

    def on_channel_timers(self) -> None:
        """Messages of ours timed out or were emptied: we may have room again."""

    def close_for_channel_delete(self) -> None:
        self.close()

    def check_deadlines(self, now: int) -> None:
        """Called every scan: nsqd's read deadline (2 heartbeats) and write deadline (1)."""
        hb = self.settings.heartbeat_interval
        if not hb or self._closing:
            return
        if now - self._last_read > 2 * hb:
            log.info("client(%s) timed out: no data for %.1fs", self.remote_address, 2 * hb / 1e9)
            self.close()
        elif self._write_paused_at and now - self._write_paused_at > hb:
            log.info("client(%s) write timed out: not reading", self.remote_address)
            if self.transport is not None:
                self._closing = True
                self.transport.abort()

    def _arm_heartbeat(self) -> None:
        if self._heartbeat_timer is not None:
            self._heartbeat_timer.cancel()
            self._heartbeat_timer = None
        hb = self.settings.heartbeat_interval
        if hb and not self._closing:
            loop = asyncio.get_running_loop()
            self._heartbeat_timer = loop.call_later(hb / 1e9, self._heartbeat)

    def _heartbeat(self) -> None:
        self._heartbeat_timer = None
        self._send(HEARTBEAT_FRAME)
        self._arm_heartbeat()

    # --- commands -------------------------------------------------------------------------
    def _identify(self, params: list[bytes], body: Any) -> None:
        if self.state != STATE_INIT:
            raise ProtocolError("E_INVALID", "cannot IDENTIFY in current state")
        old_hb = self.settings.heartbeat_interval
        self.settings, response = negotiate(body, self.opts, self.settings)
        self._send(encode_response(response))
        if self.settings.heartbeat_interval != old_hb:
            self._arm_heartbeat()

    def _auth(self, params: list[bytes], body: Any) -> None:
        if self.state != STATE_INIT:
            raise ProtocolError("E_INVALID", "cannot AUTH in current state")
        raise ProtocolError("E_AUTH_DISABLED", "AUTH disabled")

    def _sub(self, params: list[bytes], body: Any) -> None:
        if self.state != STATE_INIT:
            raise ProtocolError("E_INVALID", "cannot SUB in current state")
        if not self.settings.heartbeat_interval:
            raise ProtocolError("E_INVALID", "cannot SUB with heartbeats disabled")
        if len(params) < 3:
            raise ProtocolError("E_INVALID", "SUB insufficient number of parameters")
        topic_name = params[1].decode("utf-8", "surrogateescape")
        if not is_valid_name(topic_name):
            raise ProtocolError("E_BAD_TOPIC", f"SUB topic name {go_quote(params[1])} is not valid")
        channel_name = params[2].decode("utf-8", "surrogateescape")
        if not is_valid_name(channel_name):
            raise ProtocolError("E_BAD_CHANNEL", f"SUB channel name {go_quote(params[2])} is not valid")
        router = self.broker.router
        if router is not None:
            owner = router.owner(topic_name)
            if owner != self.broker.shard:
                raise Relayed(owner)
        if self.broker.exiting:
            raise ProtocolError("E_SUB_FAILED", "SUB failed exiting")
        topic = self.broker.get_topic(topic_name)
        channel = self.broker.get_channel(topic, channel_name)
        try:
            channel.add_consumer(self)
        except ChannelError as exc:
            raise ProtocolError("E_SUB_FAILED", f"SUB failed {exc}") from None
        self.channel = channel
        self.state = STATE_SUBSCRIBED
        self._send(OK_FRAME)

    def _rdy(self, params: list[bytes], body: Any) -> None:
        if self.state == STATE_CLOSING:
            return
        if self.state != STATE_SUBSCRIBED:
            raise ProtocolError("E_INVALID", "cannot RDY in current state")
        count = 1
        if len(params) > 1:
            try:
                parsed = parse_base10(params[1])
            except ValueError:
                raw = params[1].decode("utf-8", "surrogateescape")
                raise ProtocolError("E_INVALID", f"RDY could not parse count {raw}") from None
            count = parsed - (1 << 64) if parsed >= 1 << 63 else parsed  # Go's int64(uint64)
        if not 0 <= count <= self.opts.max_rdy_count:
            raise ProtocolError("E_INVALID", f"RDY count {count} out of range 0-{self.opts.max_rdy_count}")
        self.rdy = count
        if self.channel is not None:
            if self._out and self.capacity() <= 0:
                self._flush()
            self.channel.notify_ready()

    def _message_id(self, cmd: str, params: list[bytes], need: int) -> bytes:
        if self.state not in (STATE_SUBSCRIBED, STATE_CLOSING):
            raise ProtocolError("E_INVALID", f"cannot {cmd} in current state")
        if len(params) < need:
            raise ProtocolError("E_INVALID", f"{cmd} insufficient number of params")
        msg_id = params[1]
        if len(msg_id) != 16:
            raise ProtocolError("E_INVALID", "invalid message ID")
        return msg_id

    def _fin(self, params: list[bytes], body: Any) -> None:
        msg_id = self._message_id("FIN", params, 2)
        assert self.channel is not None
        try:
            self.channel.finish(self, msg_id)
        except ChannelError as exc:
            raise ProtocolError("E_FIN_FAILED", f"FIN {msg_id.decode('latin-1')} failed {exc}") from None

    def _req(self, params: list[bytes], body: Any) -> None:
        msg_id = self._message_id("REQ", params, 3)
        try:
            timeout_ms = parse_base10(params[2])
        except ValueError:
            raw = params[2].decode("utf-8", "surrogateescape")
            raise ProtocolError("E_INVALID", f"REQ could not parse timeout {raw}") from None
        delay = min(max(ms_to_duration_ns(timeout_ms), 0), self.opts.max_req_timeout)
        assert self.channel is not None
        if self.broker.exiting:
            raise ProtocolError("E_REQ_FAILED", f"REQ {msg_id.decode('latin-1')} failed exiting")
        try:
            self.channel.requeue(self, msg_id, delay, time.monotonic_ns())
        except ChannelError as exc:
            raise ProtocolError("E_REQ_FAILED", f"REQ {msg_id.decode('latin-1')} failed {exc}") from None

    def _touch(self, params: list[bytes], body: Any) -> None:
        msg_id = self._message_id("TOUCH", params, 2)
        assert self.channel is not None
        try:
            self.channel.touch(self, msg_id, time.monotonic_ns(), self.opts.max_msg_timeout)
        except ChannelError as exc:
            raise ProtocolError("E_TOUCH_FAILED", f"TOUCH {msg_id.decode('latin-1')} failed {exc}") from None

    def _cls(self, params: list[bytes], body: Any) -> None:
        if self.state != STATE_SUBSCRIBED:
            raise ProtocolError("E_INVALID", "cannot CLS in current state")
        self.rdy = 0
        self.state = STATE_CLOSING
        self._send(CLOSE_WAIT_FRAME)

    def _nop(self, params: list[bytes], body: Any) -> None:
        pass

    def _published(self, topic: str, count: int) -> None:
        self.pub_counts[topic] = self.pub_counts.get(topic, 0) + count
        self._send(OK_FRAME)

    def _pub(self, params: list[bytes], body: Any) -> None:
        topic = params[1].decode()
        try:
            self.broker.publish(topic, [body])
        except BrokerError as exc:
            raise ProtocolError("E_PUB_FAILED", f"PUB failed {exc}") from None
        self._published(topic, 1)

    def _mpub(self, params: list[bytes], body: Any) -> None:
        topic = params[1].decode()
        try:
            self.broker.publish(topic, body)
        except BrokerError as exc:
            raise ProtocolError("E_MPUB_FAILED", f"MPUB failed {exc}") from None
        self._published(topic, len(body))

    def _dpub(self, params: list[bytes], body: Any) -> None:
        topic = params[1].decode()
        try:
            self.broker.publish_deferred(topic, body, int(params[2]))
        except BrokerError as exc:
            raise ProtocolError("E_DPUB_FAILED", f"DPUB failed {exc}") from None
        self._published(topic, 1)
