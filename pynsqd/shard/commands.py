"""Protocol V2's commands for one connection, and the session state they change.

Each handler follows nsqd's checks in nsqd's order (state, parameters, names, then the
action) and raises ``ProtocolError`` for the connection to answer. States (``stateInit`` 0 →
``stateSubscribed`` 3 → ``stateClosing`` 4, as in nsqd's stats): IDENTIFY, AUTH and SUB only
in INIT (IDENTIFY may repeat); RDY, FIN, REQ, TOUCH once subscribed (FIN/REQ/TOUCH also while
closing; RDY is ignored while closing); PUB, MPUB, DPUB and NOP in any state.

``Session`` holds what a client is to the broker (settings, AUTH session, TLS and
compression, subscription, RDY, what it published) and runs the commands; it reaches the
connection that carries it (``protocol.ClientV2``) only through ``Link``: write a frame,
flush, start an upgrade, suspend the command stream. That connection is also the
``Subscriber`` its channel delivers to, so ``Link`` extends that interface. ``COMMANDS`` maps
each command name to its handler.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from pynsqd.node.config import NsqdOptions
from pynsqd.node.identify import Settings, negotiate
from pynsqd.shard.auth import AuthSession
from pynsqd.shard.broker import Broker, BrokerError
from pynsqd.shard.channel import Channel, ChannelError
from pynsqd.shard.subscriber import Subscriber
from pynsqd.shard.transport import NO_TLS
from pynsqd.wire.commands import ms_to_duration_ns, parse_base10
from pynsqd.wire.errors import ProtocolError, go_quote
from pynsqd.wire.frames import CLOSE_WAIT_FRAME, FRAME_ERROR, OK_FRAME, encode_frame, encode_response
from pynsqd.wire.names import is_valid_name

log = logging.getLogger("pynsqd.shard")

STATE_INIT = 0
STATE_SUBSCRIBED = 3
STATE_CLOSING = 4


class Relayed(Exception):
    """A SUB for a topic another shard owns: the connection moves there (``shard/relay.py``)."""

    def __init__(self, owner: int) -> None:
        super().__init__(owner)
        self.owner = owner


class Link(Subscriber, Protocol):
    """What the commands need from the connection that carries them (``protocol.ClientV2``),
    which is also the consumer its channel delivers to."""

    def send(self, frame: bytes) -> None:
        """Write a response or error frame, behind any buffered messages."""

    def flush(self) -> None:
        """Write the buffered message frames now."""

    def input_pending(self) -> bool:
        """Bytes or commands were read beyond the one running."""

    def arm_heartbeat(self) -> None:
        """The heartbeat interval changed: time the next heartbeat from now."""

    def suspend(self, work: Coroutine[Any, Any, None]) -> None:
        """Hold further commands and output until ``work`` is done."""

    def upgrade_tls(self, compression: str, level: int) -> Coroutine[Any, Any, None]:
        """The TLS handshake (then the compression ``compression``, if any), for ``suspend``."""

    def compress(self, name: str, level: int) -> None:
        """Compress the connection with ``name`` from the next frame on."""


class Session:
    """The commands of protocol V2 and the session state they change, for one connection."""

    def __init__(self, link: Link, broker: Broker, opts: NsqdOptions) -> None:
        self.link = link
        self.broker = broker
        self.opts = opts
        self.remote_address = ""
        self.settings: Settings
        self.auth: AuthSession | None = None
        self.tls = False
        self.tls_info: dict[str, Any] = NO_TLS
        self.compression = ""
        self.state = STATE_INIT
        self.channel: Channel | None = None
        self.rdy = 0
        self.pub_counts: dict[str, int] = {}
        self.connect_ts = int(time.time())

    def _identify(self, params: list[bytes], body: Any) -> None:
        if self.state != STATE_INIT:
            raise ProtocolError("E_INVALID", "cannot IDENTIFY in current state")
        old_hb = self.settings.heartbeat_interval
        settings, response = negotiate(body, self.opts, self.settings)
        tls, compression = settings.upgrade_tls, settings.compression
        if (tls and self.tls) or (compression and self.compression):
            raise ProtocolError("E_IDENTIFY_FAILED", "IDENTIFY failed connection already upgraded")
        if (tls or compression) and self.link.input_pending():
            raise ProtocolError("E_IDENTIFY_FAILED", "IDENTIFY failed data sent before the upgrade completed")
        self.settings = settings
        link = self.link
        link.send(encode_response(response))
        if self.settings.heartbeat_interval != old_hb:
            link.arm_heartbeat()
        if tls:
            log.info("PROTOCOL(V2): [%s] upgrading connection to TLS", self.remote_address)
            link.suspend(link.upgrade_tls(compression, settings.deflate_level))
        elif compression:
            link.compress(compression, settings.deflate_level)

    def _auth(self, params: list[bytes], body: Any) -> None:
        if self.state != STATE_INIT:
            raise ProtocolError("E_INVALID", "cannot AUTH in current state")
        if len(params) != 1:
            raise ProtocolError("E_INVALID", "AUTH invalid number of parameters")
        assert self.auth is not None
        self.link.send(encode_response(self.auth.authenticate(body)))

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
        assert self.auth is not None
        self.auth.check("SUB", topic_name, channel_name)
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
            channel.add_consumer(self.link)
        except ChannelError as exc:
            raise ProtocolError("E_SUB_FAILED", f"SUB failed {exc}") from None
        self.channel = channel
        self.state = STATE_SUBSCRIBED
        self.link.send(OK_FRAME)

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
            link = self.link
            if link.output() and link.capacity() <= 0:
                link.flush()
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
            self.channel.finish(self.link, msg_id)
        except ChannelError as exc:
            raise ProtocolError("E_FIN_FAILED", f"FIN {msg_id.decode('latin-1')} failed {exc}") from None

    def fin_many(self, ids: list[bytes]) -> None:
        """FIN each of ``ids`` (valid 16-byte ids, subscribed); errors as ``_fin``'s."""
        assert self.channel is not None
        for msg_id, reason in self.channel.finish_many(self.link, ids):
            self.link.send(encode_frame(FRAME_ERROR, ProtocolError(
                "E_FIN_FAILED", f"FIN {msg_id.decode('latin-1')} failed {reason}").encode_text()))

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
            self.channel.requeue(self.link, msg_id, delay, time.monotonic_ns())
        except ChannelError as exc:
            raise ProtocolError("E_REQ_FAILED", f"REQ {msg_id.decode('latin-1')} failed {exc}") from None

    def _touch(self, params: list[bytes], body: Any) -> None:
        msg_id = self._message_id("TOUCH", params, 2)
        assert self.channel is not None
        try:
            self.channel.touch(self.link, msg_id, time.monotonic_ns(), self.opts.max_msg_timeout)
        except ChannelError as exc:
            raise ProtocolError("E_TOUCH_FAILED", f"TOUCH {msg_id.decode('latin-1')} failed {exc}") from None

    def _cls(self, params: list[bytes], body: Any) -> None:
        if self.state != STATE_SUBSCRIBED:
            raise ProtocolError("E_INVALID", "cannot CLS in current state")
        self.rdy = 0
        self.state = STATE_CLOSING
        self.link.send(CLOSE_WAIT_FRAME)

    def _nop(self, params: list[bytes], body: Any) -> None:
        pass

    def _published(self, topic: str, count: int) -> None:
        self.pub_counts[topic] = self.pub_counts.get(topic, 0) + count
        self.link.send(OK_FRAME)

    def _check_pub(self, cmd: str, params: list[bytes]) -> str:
        topic = params[1].decode()
        assert self.auth is not None
        self.auth.check(cmd, topic, "")
        return topic

    def _pub(self, params: list[bytes], body: Any) -> None:
        topic = self._check_pub("PUB", params)
        try:
            self.broker.publish(topic, [body])
        except BrokerError as exc:
            raise ProtocolError("E_PUB_FAILED", f"PUB failed {exc}") from None
        self._published(topic, 1)

    def _mpub(self, params: list[bytes], body: Any) -> None:
        topic = self._check_pub("MPUB", params)
        try:
            self.broker.publish(topic, body)
        except BrokerError as exc:
            raise ProtocolError("E_MPUB_FAILED", f"MPUB failed {exc}") from None
        self._published(topic, len(body))

    def _dpub(self, params: list[bytes], body: Any) -> None:
        topic = self._check_pub("DPUB", params)
        try:
            self.broker.publish_deferred(topic, body, int(params[2]))
        except BrokerError as exc:
            raise ProtocolError("E_DPUB_FAILED", f"DPUB failed {exc}") from None
        self._published(topic, 1)


Handler = Callable[[Session, list[bytes], Any], None]
COMMANDS: dict[bytes, Handler] = {
    b"IDENTIFY": Session._identify, b"SUB": Session._sub, b"RDY": Session._rdy,
    b"FIN": Session._fin, b"REQ": Session._req, b"TOUCH": Session._touch, b"CLS": Session._cls,
    b"NOP": Session._nop, b"PUB": Session._pub, b"MPUB": Session._mpub, b"DPUB": Session._dpub,
    b"AUTH": Session._auth,
}
