"""The lookupd V1 codec: every input three ways (whole, one byte at a time, with trailing
bytes), the error texts nsqlookupd sends, the client side, and a fuzz property."""

from __future__ import annotations

import struct

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pynsqd.wire.errors import ProtocolError
from pynsqd.wire.lookup import (
    MAGIC,
    PING,
    Event,
    Identify,
    IdentifyInfo,
    Ping,
    Register,
    ResponseReader,
    ServerParser,
    Unregister,
    decode_identify,
    decode_identify_response,
    encode_error,
    encode_identify,
    encode_register,
    encode_response,
    encode_unregister,
    response_error,
)

INFO = IdentifyInfo("10.0.0.1", 4150, 4151, "1.3.0", "box")
IDENTIFY = encode_identify(INFO)
DOCUMENTED_CODES = {"E_BAD_PROTOCOL", "E_INVALID", "E_BAD_BODY", "E_BAD_TOPIC", "E_BAD_CHANNEL"}

Out = list[Event | ProtocolError]


def texts(out: Out) -> list[object]:
    return [x.text if isinstance(x, ProtocolError) else x for x in out]


def feed_all(data: bytes) -> Out:
    return ServerParser().feed(data)


def feed_bytewise(data: bytes) -> Out:
    parser = ServerParser()
    out: Out = []
    for i in range(len(data)):
        out += parser.feed(data[i:i + 1])
    return out


def tr(data: bytes, expected: list[object]) -> None:
    """Same result whole and byte by byte; trailing bytes of an incomplete next command
    change nothing (unless the stream already failed)."""
    assert texts(feed_all(data)) == expected
    assert texts(feed_bytewise(data)) == expected
    parser = ServerParser()
    assert texts(parser.feed(data + b"REGIS")) == expected
    if not parser.failed:
        assert parser.buffered == 5


def test_identify_register_unregister_ping() -> None:
    data = (MAGIC + PING + IDENTIFY + encode_register("t", "c") + encode_register("t")
            + encode_unregister("t", "c") + encode_unregister("t") + PING)
    tr(data, [Ping(), Identify(INFO), Register("t", "c"), Register("t", None),
              Unregister("t", "c"), Unregister("t", None), Ping()])


def test_lines_are_trimmed_and_split_as_nsq_does() -> None:
    tr(MAGIC + b"  PING \r\n", [Ping()])
    tr(MAGIC + IDENTIFY + b"REGISTER t c extra\n", [Identify(INFO), Register("t", "c")])
    tr(MAGIC + IDENTIFY + b"REGISTER t  c\n", [Identify(INFO), Register("t", None)])  # "" channel
    tr(MAGIC + IDENTIFY + b"REGISTER t \n", [Identify(INFO), Register("t", None)])
    tr(MAGIC + b"IDENTIFY ignored params\n" + IDENTIFY[len(b"IDENTIFY\n"):], [Identify(INFO)])


@pytest.mark.parametrize(("data", "error"), [
    (b"  V2PING\n", "E_BAD_PROTOCOL"),
    (b"GET / HTTP/1.1\r\n", "E_BAD_PROTOCOL"),
    (MAGIC + b"INVALID_COMMAND\n", "E_INVALID invalid command INVALID_COMMAND"),
    (MAGIC + b"\n", "E_INVALID invalid command "),
    (MAGIC + b"ping\n", "E_INVALID invalid command ping"),
    (MAGIC + b"REGISTER t\n", "E_INVALID client must IDENTIFY"),
    (MAGIC + b"UNREGISTER b@d\n", "E_INVALID client must IDENTIFY"),  # state before names
    (MAGIC + IDENTIFY + b"REGISTER\n", "E_INVALID REGISTER insufficient number of params"),
    (MAGIC + IDENTIFY + b"UNREGISTER\n", "E_INVALID UNREGISTER insufficient number of params"),
    (MAGIC + IDENTIFY + b"REGISTER b@d c\n", "E_BAD_TOPIC REGISTER topic name 'b@d' is not valid"),
    (MAGIC + IDENTIFY + b"UNREGISTER t b@d\n",
     "E_BAD_CHANNEL UNREGISTER channel name 'b@d' is not valid"),
    (MAGIC + IDENTIFY + b"REGISTER " + b"x" * 65 + b"\n",
     "E_BAD_TOPIC REGISTER topic name '" + "x" * 65 + "' is not valid"),
    (MAGIC + IDENTIFY + b"IDENTIFY\n", "E_INVALID cannot IDENTIFY again"),
    (MAGIC + b"IDENTIFY\n\xff\xff\xff\xff", "E_BAD_BODY IDENTIFY failed to read body size"),
    (MAGIC + b"IDENTIFY\n\x00\x01\x00\x01", "E_BAD_BODY IDENTIFY body too big 65537 > 65536"),
    (MAGIC + b"IDENTIFY\n\x00\x00\x00\x00", "E_BAD_BODY IDENTIFY failed to decode JSON body"),
    (MAGIC + b"IDENTIFY\n\x00\x00\x00\x02[]", "E_BAD_BODY IDENTIFY failed to decode JSON body"),
    (MAGIC + b"IDENTIFY\n\x00\x00\x00\x02{}", "E_BAD_BODY IDENTIFY missing fields"),
    (MAGIC + b"x" * 20000, "E_INVALID command line too long"),
])
def test_errors(data: bytes, error: str) -> None:
    before = texts(feed_all(data))[:-1]
    tr(data, [*before, error])


def test_an_error_is_last_and_later_input_is_ignored() -> None:
    parser = ServerParser()
    out = parser.feed(MAGIC + b"PING\nBOGUS\nPING\n")
    assert texts(out) == [Ping(), "E_INVALID invalid command BOGUS"]
    assert parser.failed and parser.buffered == 0
    assert parser.feed(PING) == [] and parser.feed_eof() == []


def test_eof_inside_identify_is_reported() -> None:
    for partial, error in ((b"IDENTIFY\n\x00\x00", "E_BAD_BODY IDENTIFY failed to read body size"),
                           (b"IDENTIFY\n\x00\x00\x00\x09{}", "E_BAD_BODY IDENTIFY failed to read body")):
        parser = ServerParser()
        assert parser.feed(MAGIC + partial) == []
        assert texts(parser.feed_eof()) == [error]
    parser = ServerParser()
    parser.feed(MAGIC + b"PIN")
    assert parser.feed_eof() == []  # a partial line just ends the connection


@pytest.mark.parametrize(("body", "expected"), [
    (b'{"broadcast_address":"a","tcp_port":1,"http_port":2,"version":"v"}',
     IdentifyInfo("a", 1, 2, "v", "")),
    # Go's encoding/json: keys match case-insensitively, unknown keys and nulls are ignored.
    (b'{"Broadcast_Address":"a","TCP_PORT":1,"http_port":2,"version":"v","hostname":null,'
     b'"topology_zone":"z","remote_address":"spoof","extra":[1,{}]}', IdentifyInfo("a", 1, 2, "v", "")),
    (b'{"broadcast_address":"a\xff","tcp_port":1,"http_port":2,"version":"v"}',
     IdentifyInfo("a\ufffd", 1, 2, "v", "")),
])
def test_decode_identify_like_go(body: bytes, expected: IdentifyInfo) -> None:
    assert decode_identify(body) == expected


@pytest.mark.parametrize(("body", "error"), [
    (b"null", "E_BAD_BODY IDENTIFY missing fields"),
    (b'{"broadcast_address":"a","tcp_port":0,"http_port":2,"version":"v"}',
     "E_BAD_BODY IDENTIFY missing fields"),
    (b'{"broadcast_address":"a","tcp_port":"1","http_port":2,"version":"v"}',
     "E_BAD_BODY IDENTIFY failed to decode JSON body"),
    (b'{"broadcast_address":"a","tcp_port":1.5,"http_port":2,"version":"v"}',
     "E_BAD_BODY IDENTIFY failed to decode JSON body"),
    (b'{"broadcast_address":"a","tcp_port":true,"http_port":2,"version":"v"}',
     "E_BAD_BODY IDENTIFY failed to decode JSON body"),
    (b'{"broadcast_address":"a","tcp_port":9223372036854775808,"http_port":2,"version":"v"}',
     "E_BAD_BODY IDENTIFY failed to decode JSON body"),
    (b'{"hostname":5}', "E_BAD_BODY IDENTIFY failed to decode JSON body"),
    (b'{"a":1} x', "E_BAD_BODY IDENTIFY failed to decode JSON body"),
    (b'"str"', "E_BAD_BODY IDENTIFY failed to decode JSON body"),
])
def test_decode_identify_errors(body: bytes, error: str) -> None:
    with pytest.raises(ProtocolError) as info:
        decode_identify(body)
    assert info.value.text == error and info.value.fatal


# --- the client's side ------------------------------------------------------------------

def test_client_encoders() -> None:
    assert encode_register("t") == b"REGISTER t\n"
    assert encode_register("t", "c") == b"REGISTER t c\n"
    assert encode_unregister("t", "c") == b"UNREGISTER t c\n"
    assert PING == b"PING\n"
    size = struct.unpack(">i", IDENTIFY[9:13])[0]
    assert IDENTIFY[:9] == b"IDENTIFY\n" and size == len(IDENTIFY) - 13
    assert IDENTIFY[13:] == (b'{"broadcast_address":"10.0.0.1","hostname":"box","http_port":4151,'
                             b'"tcp_port":4150,"version":"1.3.0"}')


def test_response_reader_and_classification() -> None:
    wire = (encode_response(b"OK") + encode_response(b'{"tcp_port":4160}')
            + encode_error(ProtocolError("E_INVALID", "client must IDENTIFY")))
    reader = ResponseReader()
    got: list[bytes] = []
    for i in range(len(wire)):
        got += reader.feed(wire[i:i + 1])
    assert got == [b"OK", b'{"tcp_port":4160}', b"E_INVALID client must IDENTIFY"]
    assert reader.buffered == 0
    assert response_error(got[0]) is None and response_error(got[1]) is None
    err = response_error(got[2])
    assert err is not None and (err.code, err.description) == ("E_INVALID", "client must IDENTIFY")
    assert decode_identify_response(got[1]) == {"tcp_port": 4160}
    with pytest.raises(ProtocolError):
        decode_identify_response(got[2])
    with pytest.raises(ProtocolError, match="invalid response size"):
        ResponseReader(max_size=10).feed(b"\x00\x00\x00\x0b")
    assert encode_error(ProtocolError("E_BAD_PROTOCOL")) == b"\x00\x00\x00\x0eE_BAD_PROTOCOL"


# --- fuzz: parse, or fail with a documented error, never anything else ---------------------

_pieces = st.sampled_from([
    MAGIC, b"PING\n", IDENTIFY, b"IDENTIFY\n", b"REGISTER t c\n", b"UNREGISTER t\n",
    b"REGISTER b@d\n", b"\x00\x00\x00\x02{}", b"\xff\xff\xff\xff", b"\n", b" ", b"\r\n",
])
_streams = st.one_of(
    st.binary(max_size=200),
    st.lists(st.one_of(_pieces, st.binary(max_size=12)), max_size=12).map(b"".join),
    st.lists(st.one_of(_pieces, st.binary(max_size=12)), max_size=12).map(lambda p: MAGIC + b"".join(p)),
)


@settings(max_examples=400, deadline=None)
@given(data=_streams, cuts=st.lists(st.integers(min_value=0, max_value=300), max_size=6))
def test_fuzz_parse_or_documented_error(data: bytes, cuts: list[int]) -> None:
    whole = feed_all(data)
    for i, item in enumerate(whole):
        if isinstance(item, ProtocolError):
            assert i == len(whole) - 1 and item.code in DOCUMENTED_CODES and item.fatal
        else:
            assert isinstance(item, (Identify, Register, Unregister, Ping))
    parser = ServerParser()
    chunked: Out = []
    start = 0
    for cut in sorted(c for c in cuts if c <= len(data)):
        chunked += parser.feed(data[start:cut])
        start = cut
    chunked += parser.feed(data[start:])
    assert texts(chunked) == texts(whole)
    for item in parser.feed_eof():
        assert isinstance(item, ProtocolError) and item.code == "E_BAD_BODY"


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats() | st.text(max_size=8),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(
        st.sampled_from(["tcp_port", "http_port", "version", "broadcast_address", "hostname",
                         "TCP_Port", "x"]), kids, max_size=5),
    max_leaves=10)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=100), _json_values.map(orjson.dumps)))
def test_fuzz_decode_identify(body: bytes) -> None:
    try:
        info = decode_identify(body)
    except ProtocolError as exc:
        assert exc.code == "E_BAD_BODY"
    else:
        assert info.broadcast_address and info.tcp_port and info.http_port and info.version
