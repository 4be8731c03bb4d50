"""A blocking, frame-level V2 client for driving the server byte by byte in tests."""

from __future__ import annotations

import json
import socket
import ssl
import time
from typing import Any

from pynsqd.wire import MAGIC_V2
from pynsqd.wire.commands import encode_identify, encode_rdy, encode_sub
from pynsqd.wire.compression import Codec, make_codec
from pynsqd.wire.frames import FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE, FrameParser
from pynsqd.wire.message import decode_message
from testbed.harness import connect, scaled


class Message:
    def __init__(self, data: bytes) -> None:
        self.timestamp, self.attempts, self.id, self.body = decode_message(data)


class RawClient:
    """``RawClient(nsqd.tcp)`` connects and sends the magic; then send commands, read frames."""

    def __init__(self, address: tuple[str, int], magic: bytes = MAGIC_V2) -> None:
        self.sock = connect(address)
        self.parser = FrameParser()
        self.frames: list[tuple[int, bytes]] = []
        self.codec: Codec | None = None
        if magic:
            self.sock.sendall(magic)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(self.codec.encode(data) if self.codec else data)

    def _recv(self) -> bytes:
        data = self.sock.recv(1 << 20)
        if self.codec is not None and data:
            data = b"".join(self.codec.decode(data))
        return data

    def start_tls(self, ctx: ssl.SSLContext, server_hostname: str = "localhost") -> None:
        """Run the client side of the TLS handshake (after IDENTIFY negotiated ``tls_v1``)."""
        assert not self.frames and not self.parser.buffered
        self.sock = ctx.wrap_socket(self.sock, server_hostname=server_hostname)

    def start_compression(self, name: str, level: int = 6) -> None:
        """Switch both directions to snappy or deflate (after IDENTIFY negotiated it)."""
        self.codec = make_codec(name, level)

    def read_frame(self, timeout: float = 5.0, skip_heartbeats: bool = True) -> tuple[int, bytes]:
        end = time.monotonic() + scaled(timeout)
        while True:
            while self.frames:
                frame = self.frames.pop(0)
                if skip_heartbeats and frame == (FRAME_RESPONSE, b"_heartbeat_"):
                    continue
                return frame
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError("no frame arrived in time")
            self.sock.settimeout(left)
            data = self._recv()
            if not data:
                raise ConnectionError("connection closed by server")
            self.frames.extend(self.parser.feed(data))

    def expect_response(self, expected: bytes | None = None, timeout: float = 5.0) -> bytes:
        frame_type, data = self.read_frame(timeout)
        assert frame_type == FRAME_RESPONSE, f"expected a response, got {frame_type} {data!r}"
        if expected is not None:
            assert data == expected
        return data

    def expect_ok(self) -> None:
        self.expect_response(b"OK")

    def expect_error(self, text: str, timeout: float = 5.0) -> None:
        frame_type, data = self.read_frame(timeout)
        assert (frame_type, data.decode()) == (FRAME_ERROR, text)

    def read_message(self, timeout: float = 5.0) -> Message:
        frame_type, data = self.read_frame(timeout)
        assert frame_type == FRAME_MESSAGE, f"expected a message, got {frame_type} {data!r}"
        return Message(data)

    def read_messages(self, count: int, timeout: float = 5.0) -> list[Message]:
        return [self.read_message(timeout) for _ in range(count)]

    def expect_nothing(self, seconds: float) -> None:
        """No frame other than heartbeats arrives for ``seconds`` (used to check that
        something does *not* happen; the wait is the claim, not a synchronisation)."""
        try:
            frame = self.read_frame(seconds)
        except TimeoutError:
            return
        raise AssertionError(f"unexpected frame {frame!r}")

    def expect_closed(self, timeout: float = 5.0) -> None:
        end = time.monotonic() + scaled(timeout)
        while time.monotonic() < end:
            self.sock.settimeout(max(0.01, end - time.monotonic()))
            try:
                data = self._recv()
            except TimeoutError:
                continue
            except (ConnectionResetError, ssl.SSLError):
                return
            if not data:
                return
            self.frames.extend(self.parser.feed(data))
        raise AssertionError("connection still open")

    # --- conveniences ---------------------------------------------------------------------
    def identify(self, **fields: Any) -> dict[str, Any]:
        """IDENTIFY with feature negotiation; reads exactly the response frame off the socket,
        so bytes of an upgraded stream that follow it stay unread."""
        body = {"feature_negotiation": True, **fields}
        self.send(encode_identify(json.dumps(body).encode()))
        if self.frames or self.parser.buffered or self.codec is not None:
            return dict(json.loads(self.expect_response()))
        frame: tuple[int, bytes] = (FRAME_RESPONSE, b"_heartbeat_")
        while frame == (FRAME_RESPONSE, b"_heartbeat_"):
            frame = self.read_frame_exact()
        assert frame[0] == FRAME_RESPONSE, frame
        return dict(json.loads(frame[1]))

    def read_frame_exact(self, timeout: float = 5.0) -> tuple[int, bytes]:
        """One frame read straight off the socket, nothing more."""
        self.sock.settimeout(scaled(timeout))
        head = self._recv_exact(8)
        size, frame_type = int.from_bytes(head[:4], "big"), int.from_bytes(head[4:], "big")
        return frame_type, self._recv_exact(size - 4)

    def _recv_exact(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            data = self.sock.recv(n - len(out))
            if not data:
                raise ConnectionError("connection closed by server")
            out += data
        return out

    def negotiate(self, tls: ssl.SSLContext | None = None, compression: str = "") -> None:
        """IDENTIFY asking for TLS (``tls``: the client's context) and/or ``compression``
        (snappy or deflate), then run the upgrades, each acknowledged with OK."""
        fields: dict[str, Any] = {"tls_v1": tls is not None}
        if compression:
            fields[compression] = True
        self.identify(**fields)
        if tls is not None:
            self.start_tls(tls)
            self.expect_ok()
        if compression:
            self.start_compression(compression)
            self.expect_ok()

    def subscribe(self, topic: str, channel: str, rdy: int | None = None) -> None:
        self.send(encode_sub(topic, channel))
        self.expect_ok()
        if rdy is not None:
            self.send(encode_rdy(rdy))


def pair(address: tuple[str, int]) -> socket.socket:
    return connect(address)
