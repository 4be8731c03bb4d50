"""CommandParser and the command encoders against nsqd's exact behaviour (protocol_v2.go).

Every parse goes through ``parse3``: the whole input at once, one byte at a time, and (for
input that ends on a command boundary) with a following command's bytes appended; all three
must agree. Error texts are nsqd's, byte for byte, including its quirks.
"""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pynsqd.wire import commands as c
from pynsqd.wire.commands import CommandParser, ms_to_duration_ns, parse_base10
from pynsqd.wire.errors import CODES, ProtocolError, go_quote
from pynsqd.wire.frames import FRAME_ERROR, FrameParser, encode_error

NOP_CMD = (b"NOP", [b"NOP"], None)
TRAILER = b"NOP\n"


def size(n: int) -> bytes:
    return struct.pack(">i", n)


def norm(items: list[Any]) -> list[Any]:
    """Make parser output comparable: errors become ``("ERROR", code, description)``."""
    out: list[Any] = []
    for item in items:
        if isinstance(item, ProtocolError):
            out.append(("ERROR", item.code, item.description))
        else:
            out.append(item)
    return out


def feed_bytewise(parser: CommandParser, data: bytes) -> list[Any]:
    out: list[Any] = []
    for i in range(len(data)):
        out.extend(parser.feed(data[i:i + 1]))
    return out


def parse3(data: bytes, *, trailing: bool = True, **limits: int) -> list[Any]:
    """Parse ``data`` three ways and return the (normalized) result they agree on."""
    whole = norm(CommandParser(**limits).feed(data))
    bytewise = norm(feed_bytewise(CommandParser(**limits), data))
    assert bytewise == whole, "feeding one byte at a time changed the result"
    if trailing:
        with_tail = norm(CommandParser(**limits).feed(data + TRAILER))
        if whole and whole[-1][0] == "ERROR":
            assert with_tail == whole, "bytes after an error must be ignored"
        else:
            assert with_tail == [*whole, NOP_CMD], "a following command was lost or merged"
    return whole


def error_of(data: bytes, **limits: int) -> tuple[str, str]:
    """The one error ``data`` produces (asserting that nothing else is returned)."""
    result = parse3(data, **limits)
    assert len(result) == 1 and result[0][0] == "ERROR", result
    _, code, desc = result[0]
    assert code in CODES
    return code, desc


def error_text(data: bytes, **limits: int) -> str:
    code, desc = error_of(data, **limits)
    return f"{code} {desc}"


# --- every command, parsed three ways --------------------------------------------------------

MSG_ID = b"0123456789abcdef"

COMMANDS: list[tuple[str, bytes, tuple[bytes, list[bytes], Any]]] = [
    ("IDENTIFY", c.encode_identify(b'{"client_id":"x"}'),
     (b"IDENTIFY", [b"IDENTIFY"], b'{"client_id":"x"}')),
    ("AUTH", c.encode_auth(b"s3cret"), (b"AUTH", [b"AUTH"], b"s3cret")),
    ("SUB", c.encode_sub("t", "ch#ephemeral"), (b"SUB", [b"SUB", b"t", b"ch#ephemeral"], None)),
    ("PUB", c.encode_pub("t", b"hello"), (b"PUB", [b"PUB", b"t"], b"hello")),
    ("PUB binary", c.encode_pub("t", b"\n\x00\nPUB x\n"), (b"PUB", [b"PUB", b"t"], b"\n\x00\nPUB x\n")),
    ("DPUB", c.encode_dpub("t", 1000, b"later"), (b"DPUB", [b"DPUB", b"t", b"1000"], b"later")),
    ("MPUB", c.encode_mpub("t", [b"a", b"bc", b"\n"]), (b"MPUB", [b"MPUB", b"t"], [b"a", b"bc", b"\n"])),
    ("RDY", c.encode_rdy(100), (b"RDY", [b"RDY", b"100"], None)),
    ("FIN", c.encode_fin(MSG_ID), (b"FIN", [b"FIN", MSG_ID], None)),
    ("REQ", c.encode_req(MSG_ID, 500), (b"REQ", [b"REQ", MSG_ID, b"500"], None)),
    ("TOUCH", c.encode_touch(MSG_ID), (b"TOUCH", [b"TOUCH", MSG_ID], None)),
    ("NOP", c.NOP, NOP_CMD),
    ("CLS", c.CLS, (b"CLS", [b"CLS"], None)),
]


@pytest.mark.parametrize(("wire", "expected"), [(w, e) for _, w, e in COMMANDS],
                         ids=[name for name, _, _ in COMMANDS])
def test_each_command_three_ways(wire: bytes, expected: Any) -> None:
    assert parse3(wire) == [expected]


def test_all_commands_in_one_stream() -> None:
    stream = b"".join(w for _, w, _ in COMMANDS)
    assert parse3(stream) == [e for _, _, e in COMMANDS]


def test_encoder_parser_round_trip_every_split_point() -> None:
    stream = b"".join(w for _, w, _ in COMMANDS)
    expected = [e for _, _, e in COMMANDS]
    for cut in range(len(stream) + 1):
        parser = CommandParser()
        got = parser.feed(stream[:cut]) + parser.feed(stream[cut:])
        assert got == expected, cut
        assert parser.buffered == 0


def test_incomplete_command_is_held() -> None:
    parser = CommandParser()
    assert parser.feed(b"PUB t\n" + size(5) + b"hel") == []
    assert parser.buffered == 3
    assert parser.feed(b"lo") == [(b"PUB", [b"PUB", b"t"], b"hello")]
    assert parser.buffered == 0


# --- line framing ------------------------------------------------------------------------------

def test_crlf_line_endings() -> None:
    assert parse3(b"NOP\r\nRDY 5\r\nPUB t\r\n" + size(1) + b"x") == [
        NOP_CMD, (b"RDY", [b"RDY", b"5"], None), (b"PUB", [b"PUB", b"t"], b"x")]


def test_only_one_trailing_cr_is_stripped() -> None:
    assert parse3(b"NOP\r\r\n") == [(b"NOP\r", [b"NOP\r"], None)]
    assert parse3(b"N\rOP\n") == [(b"N\rOP", [b"N\rOP"], None)]


def test_empty_lines_are_empty_commands() -> None:
    # TestEmptyCommand: "\n\n" must not crash; nsqd answers E_INVALID "invalid command ".
    assert parse3(b"\n\n") == [(b"", [b""], None), (b"", [b""], None)]
    assert parse3(b"\r\n") == [(b"", [b""], None)]


def test_params_split_on_single_spaces() -> None:
    assert parse3(b"SUB  t c\n") == [(b"SUB", [b"SUB", b"", b"t", b"c"], None)]
    assert parse3(b"RDY \n") == [(b"RDY", [b"RDY", b""], None)]


def test_names_are_case_sensitive_and_not_body_commands() -> None:
    # "pub" is not PUB: no body is read; the server answers "invalid command pub".
    assert parse3(b"pub t\n") == [(b"pub", [b"pub", b"t"], None)]


def test_line_limit_counts_the_newline() -> None:
    # nsqd's bufio.Reader holds 16 KiB: a line of 16383 bytes plus "\n" fits, 16384 does not.
    limit = c.DEFAULT_MAX_LINE
    ok = b"X" * (limit - 1) + b"\n"
    assert parse3(ok) == [(ok[:-1], [ok[:-1]], None)]
    assert error_text(b"X" * limit + b"\n") == "E_INVALID command line too long"


def test_line_limit_without_newline_fails_once_limit_bytes_arrive() -> None:
    parser = CommandParser(max_line=10)
    assert parser.feed(b"X" * 9) == []
    assert norm(parser.feed(b"X")) == [("ERROR", "E_INVALID", "command line too long")]


def test_long_line_rejected_however_it_is_chunked() -> None:
    # The whole line and its newline in one chunk must not slip past the limit.
    data = b"NOP\n" + b"Y" * 50 + b"\nNOP\n"
    assert parse3(data, max_line=20) == [NOP_CMD, ("ERROR", "E_INVALID", "command line too long")]


def test_line_limit_applies_to_body_command_lines() -> None:
    assert error_text(b"PUB " + b"t" * 30 + b"\n", max_line=20) == "E_INVALID command line too long"


# --- errors before the body --------------------------------------------------------------------

@pytest.mark.parametrize(("line", "text"), [
    (b"PUB\n", "E_INVALID PUB insufficient number of parameters"),
    (b"MPUB\n", "E_INVALID MPUB insufficient number of parameters"),
    (b"DPUB t\n", "E_INVALID DPUB insufficient number of parameters"),
    (b"DPUB\n", "E_INVALID DPUB insufficient number of parameters"),
    (b"PUB \n", 'E_BAD_TOPIC PUB topic name "" is not valid'),
    (b"PUB bad:topic\n", 'E_BAD_TOPIC PUB topic name "bad:topic" is not valid'),
    (b"MPUB bad$\n", 'E_BAD_TOPIC E_BAD_TOPIC MPUB topic name "bad$" is not valid'),
    (b"DPUB t:x 10\n", 'E_BAD_TOPIC DPUB topic name "t:x" is not valid'),
    (b"PUB " + b"a" * 65 + b"\n", 'E_BAD_TOPIC PUB topic name "' + "a" * 65 + '" is not valid'),
    (b"DPUB t abc\n", "E_INVALID DPUB could not parse timeout abc"),
    (b"DPUB t -1\n", "E_INVALID DPUB could not parse timeout -1"),
    (b"DPUB t +5\n", "E_INVALID DPUB could not parse timeout +5"),
    (b"DPUB t 1.5\n", "E_INVALID DPUB could not parse timeout 1.5"),
    (b"DPUB t 3600001\n", "E_INVALID DPUB timeout 3600001 out of range 0-3600000"),
    (b"AUTH x\n", "E_INVALID AUTH invalid number of parameters"),
    (b"AUTH \n", "E_INVALID AUTH invalid number of parameters"),
])
def test_header_errors(line: bytes, text: str) -> None:
    assert error_text(line) == text


def test_dpub_out_of_range_matches_testdpub() -> None:
    # TestDPUB: --max-req-timeout 1h, a delay 100ms beyond it.
    assert error_text(b"DPUB t 3600100\n", max_req_timeout_ms=3600000) == \
        "E_INVALID DPUB timeout 3600100 out of range 0-3600000"


def test_dpub_edges_of_the_range_are_accepted() -> None:
    body = size(1) + b"x"
    assert parse3(b"DPUB t 0\n" + body) == [(b"DPUB", [b"DPUB", b"t", b"0"], b"x")]
    assert parse3(b"DPUB t 3600000\n" + body) == [(b"DPUB", [b"DPUB", b"t", b"3600000"], b"x")]
    # ByteToBase10 reads an empty string as 0, so nsqd accepts an empty delay.
    assert parse3(b"DPUB t \n" + body) == [(b"DPUB", [b"DPUB", b"t", b""], b"x")]


def test_dpub_timeout_wraps_like_go() -> None:
    # 2**64 - 1 is -1 as an int64: negative, out of range; nsqd prints the uint64.
    big = str(2**64 - 1).encode()
    assert error_text(b"DPUB t " + big + b"\n") == \
        f"E_INVALID DPUB timeout {2**64 - 1} out of range 0-3600000"
    # 2**64 + 5 wraps to 5 ms: nsqd accepts it.
    wrapped = str(2**64 + 5).encode()
    assert parse3(b"DPUB t " + wrapped + b"\n" + size(1) + b"x")[0][0] == b"DPUB"


def test_parse_base10() -> None:
    assert parse_base10(b"") == 0
    assert parse_base10(b"007") == 7
    assert parse_base10(str(2**64).encode()) == 0
    assert parse_base10(b"9" * 5000) == (10**5000 - 1) % 2**64
    for bad in (b"-1", b"+1", b" 1", b"1 ", b"0x10", b"1e3", "\u0661".encode()):
        with pytest.raises(ValueError):
            parse_base10(bad)
    assert ms_to_duration_ns(1000) == 1_000_000_000
    assert ms_to_duration_ns(2**64 - 1) == -1_000_000


def test_topic_names_in_errors_are_go_quoted() -> None:
    assert error_text(b'PUB a"b\n') == 'E_BAD_TOPIC PUB topic name "a\\"b" is not valid'
    assert error_text(b"PUB a\\b\tc\n") == 'E_BAD_TOPIC PUB topic name "a\\\\b\\tc" is not valid'
    assert error_text(b"PUB \xff\x00\x7f\n") == 'E_BAD_TOPIC PUB topic name "\\xff\\x00\\x7f" is not valid'
    assert error_text("PUB é\n".encode()) == 'E_BAD_TOPIC PUB topic name "é" is not valid'


def test_go_quote() -> None:
    assert go_quote(b"") == '""'
    assert go_quote(b"test") == '"test"'
    assert go_quote(b"\a\b\f\n\r\t\v") == '"\\a\\b\\f\\n\\r\\t\\v"'
    assert go_quote("\u200b\U000e0001".encode()) == '"\\u200b\\U000e0001"'
    assert go_quote(b"\xe2\x82A") == '"\\xe2\\x82A"'  # a truncated sequence, byte by byte
    assert go_quote(b"\xed\xa0\x80") == '"\\xed\\xa0\\x80"'  # an encoded surrogate is invalid


def test_raw_bytes_in_errors_survive_to_the_error_frame() -> None:
    # nsqd formats DPUB's bad timeout with %s: the client's bytes go back unchanged.
    [err] = CommandParser().feed(b"DPUB t \xff1\n")
    assert isinstance(err, ProtocolError)
    frame = encode_error(err)
    [(frame_type, data)] = FrameParser().feed(frame)
    assert frame_type == FRAME_ERROR
    assert data == b"E_INVALID DPUB could not parse timeout \xff1"


def test_topic_name_rules() -> None:
    # TestChannelTopicNames
    for name in (b"test", b"test-with_period.", b"test#ephemeral", b"a" * 64,
                 b"a" * 54 + b"#ephemeral"):
        assert parse3(b"PUB " + name + b"\n" + size(1) + b"x")[0][0] == b"PUB"
    for name in (b"test:ephemeral", b"a" * 55 + b"#ephemeral", b"#ephemeral", b"t#ephemeral#ephemeral",
                 b"t\xff"):
        assert error_of(b"PUB " + name + b"\n")[0] == "E_BAD_TOPIC"


def test_header_errors_do_not_wait_for_the_body() -> None:
    # nsqd answers from the line alone; the announced body may never come.
    parser = CommandParser()
    result = norm(parser.feed(b"PUB bad:topic\n"))
    assert result == [("ERROR", "E_BAD_TOPIC", 'PUB topic name "bad:topic" is not valid')]


# --- body errors -------------------------------------------------------------------------------

LIMITS = {"max_msg_size": 100, "max_body_size": 1000}


def mpub_body(parts: list[bytes]) -> bytes:
    return size(len(parts)) + b"".join(size(len(p)) + p for p in parts)


def test_size_limits_pub() -> None:
    # TestSizeLimits with --max-msg-size 100 --max-body-size 1000
    assert parse3(c.encode_pub("t", b"x" * 95), **LIMITS) == [(b"PUB", [b"PUB", b"t"], b"x" * 95)]
    assert error_text(c.encode_pub("t", b"x" * 105), **LIMITS) == \
        "E_BAD_MESSAGE PUB message too big 105 > 100"
    assert error_text(c.encode_pub("t", b""), **LIMITS) == \
        "E_BAD_MESSAGE PUB invalid message body size 0"


def test_size_limits_mpub() -> None:
    assert parse3(c.encode_mpub("t", [b"x" * 100] * 5), **LIMITS) == \
        [(b"MPUB", [b"MPUB", b"t"], [b"x" * 100] * 5)]
    assert error_text(c.encode_mpub("t", [b"x" * 100] * 11), **LIMITS) == \
        "E_BAD_BODY MPUB body too big 1148 > 1000"
    assert error_text(c.encode_mpub("t", [b"x" * 100] * 5 + [b""]), **LIMITS) == \
        "E_BAD_MESSAGE MPUB invalid message(5) body size 0"
    assert error_text(c.encode_mpub("t", [b"x" * 101] * 5), **LIMITS) == \
        "E_BAD_MESSAGE MPUB message too big 101 > 100"


@pytest.mark.parametrize(("data", "text"), [
    (b"PUB t\n" + size(-1), "E_BAD_MESSAGE PUB invalid message body size -1"),
    (b"PUB t\n" + size(101), "E_BAD_MESSAGE PUB message too big 101 > 100"),
    (b"DPUB t 5\n" + size(0), "E_BAD_MESSAGE DPUB invalid message body size 0"),
    (b"DPUB t 5\n" + size(101), "E_BAD_MESSAGE DPUB message too big 101 > 100"),
    (b"MPUB t\n" + size(0), "E_BAD_BODY MPUB invalid body size 0"),
    (b"MPUB t\n" + size(-7), "E_BAD_BODY MPUB invalid body size -7"),
    (b"MPUB t\n" + size(1001), "E_BAD_BODY MPUB body too big 1001 > 1000"),
    (b"MPUB t\n" + size(3), "E_BAD_BODY MPUB failed to read message count"),
    (b"MPUB t\n" + size(8) + size(0), "E_BAD_BODY MPUB invalid message count 0"),
    (b"MPUB t\n" + size(8) + size(-1), "E_BAD_BODY MPUB invalid message count -1"),
    # at most (max_body_size - 4) / 5 = 199 messages
    (b"MPUB t\n" + size(8) + size(200), "E_BAD_BODY MPUB invalid message count 200"),
    (b"MPUB t\n" + size(8) + size(1) + size(-3), "E_BAD_MESSAGE MPUB invalid message(0) body size -3"),
    (b"MPUB t\n" + size(20) + size(2) + size(1) + b"a" + size(101),
     "E_BAD_MESSAGE MPUB message too big 101 > 100"),
    # the messages must fit in the declared body
    (b"MPUB t\n" + size(6) + size(1) + b"xx", "E_BAD_MESSAGE MPUB failed to read message(0) body size"),
    (b"MPUB t\n" + size(10) + size(1) + size(5), "E_BAD_MESSAGE MPUB failed to read message body"),
    (b"IDENTIFY\n" + size(1001), "E_BAD_BODY IDENTIFY body too big 1001 > 1000"),
    (b"IDENTIFY\n" + size(0), "E_BAD_BODY IDENTIFY invalid body size 0"),
    (b"IDENTIFY\n" + size(-1), "E_BAD_BODY IDENTIFY invalid body size -1"),
    (b"AUTH\n" + size(1001), "E_BAD_BODY AUTH body too big 1001 > 1000"),
    (b"AUTH\n" + size(0), "E_BAD_BODY AUTH invalid body size 0"),
])
def test_body_errors_come_as_soon_as_their_bytes_arrive(data: bytes, text: str) -> None:
    # No body follows the offending bytes: the error must not wait for one.
    assert error_text(data, **LIMITS) == text


def test_mpub_message_error_before_later_messages_arrive() -> None:
    # nsqd reads MPUB's messages one by one off the stream: message(1)'s bad size is
    # reported before the (announced) rest of the body is sent.
    body = mpub_body([b"a" * 10, b"", b"c" * 10])
    data = b"MPUB t\n" + size(len(body)) + body
    cut = data.index(size(0)) + 4
    assert error_text(data[:cut], **LIMITS) == "E_BAD_MESSAGE MPUB invalid message(1) body size 0"


def test_mpub_count_limit_edge() -> None:
    bodies = [b"x"] * 199
    assert parse3(c.encode_mpub("t", bodies), **LIMITS) == [(b"MPUB", [b"MPUB", b"t"], bodies)]


def test_mpub_surplus_inside_declared_body_is_discarded() -> None:
    body = mpub_body([b"a"]) + b"junk"
    assert parse3(b"MPUB t\n" + size(len(body)) + body) == [(b"MPUB", [b"MPUB", b"t"], [b"a"])]


def test_identify_and_auth_at_the_body_limit() -> None:
    assert parse3(c.encode_identify(b"{" + b" " * 998 + b"}"), **LIMITS)[0][2] == \
        b"{" + b" " * 998 + b"}"
    assert parse3(c.encode_auth(b"s" * 1000), **LIMITS)[0][2] == b"s" * 1000


def test_identify_ignores_params_like_nsqd() -> None:
    assert parse3(b"IDENTIFY x y\n" + size(2) + b"{}") == [(b"IDENTIFY", [b"IDENTIFY", b"x", b"y"], b"{}")]


# --- errors end the stream ---------------------------------------------------------------------

def test_commands_before_an_error_are_returned() -> None:
    data = b"NOP\nRDY 1\n" + c.encode_pub("t", b"ok") + b"PUB bad:t\n"
    assert parse3(data) == [NOP_CMD, (b"RDY", [b"RDY", b"1"], None), (b"PUB", [b"PUB", b"t"], b"ok"),
                            ("ERROR", "E_BAD_TOPIC", 'PUB topic name "bad:t" is not valid')]


def test_nothing_after_an_error() -> None:
    parser = CommandParser()
    [err] = parser.feed(b"PUB\n" + c.encode_pub("t", b"x"))
    assert isinstance(err, ProtocolError)
    assert err.fatal
    assert parser.failed
    assert parser.buffered == 0
    assert parser.feed(b"NOP\n") == []
    assert parser.feed(c.encode_pub("t", b"x")) == []
    assert parser.buffered == 0


def test_error_text_and_fatality() -> None:
    err = ProtocolError("E_INVALID", "invalid command ASDF")
    assert err.text == "E_INVALID invalid command ASDF"  # TestFatalError
    assert err.fatal
    for code in ("E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED"):
        assert not ProtocolError(code, "x").fatal
    assert {code for code in CODES if not ProtocolError(code).fatal} == {
        "E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED"}
    assert ProtocolError("E_INVALID").text == "E_INVALID"


# --- encoders ----------------------------------------------------------------------------------

def test_encoders_exact_bytes() -> None:
    assert c.encode_identify(b"{}") == b"IDENTIFY\n\x00\x00\x00\x02{}"
    assert c.encode_auth(b"k") == b"AUTH\n\x00\x00\x00\x01k"
    assert c.encode_sub("t", "c") == b"SUB t c\n"
    assert c.encode_pub("t", b"m") == b"PUB t\n\x00\x00\x00\x01m"
    assert c.encode_dpub("t", 5, b"m") == b"DPUB t 5\n\x00\x00\x00\x01m"
    assert c.encode_mpub("t", [b"a", b"bc"]) == (
        b"MPUB t\n\x00\x00\x00\x0f\x00\x00\x00\x02\x00\x00\x00\x01a\x00\x00\x00\x02bc")
    assert c.encode_rdy(0) == b"RDY 0\n"
    assert c.encode_fin(MSG_ID) == b"FIN " + MSG_ID + b"\n"
    assert c.encode_req(MSG_ID, 0) == b"REQ " + MSG_ID + b" 0\n"
    assert c.encode_touch(MSG_ID) == b"TOUCH " + MSG_ID + b"\n"
    assert c.NOP == b"NOP\n" and c.CLS == b"CLS\n"


def test_mpub_declared_size_is_4_plus_parts() -> None:
    # 11 x 100: 4 + 11 * (4 + 100) = 1148, the figure in TestSizeLimits
    wire = c.encode_mpub("t", [b"x" * 100] * 11)
    assert struct.unpack_from(">i", wire, len(b"MPUB t\n"))[0] == 1148


# --- the server's FIN fast path (fin_runs=True) -------------------------------------------

_FIN_POOL = [
    b"FIN 0123456789abcdef\n", b"FIN fedcba9876543210\n",  # well-formed
    b"FIN 0123456789abcde\n",                               # short id: E_INVALID in the server
    b"FIN 0123456789abcdef\r\n",                            # CR: the ordinary path strips it
    b"FIN 0123456789abcdef extra\n",                        # extra parameter: nsqd ignores it
    b"FIN 0123456789 bcdef\n",                              # a space inside the 16 bytes
    b"FIN 0123456789abcde\r\n",                             # CR right after 15 bytes
    b"FIN\n", b"FINX 0123456789abcdef\n", b"RDY 5\n", b"NOP\n",
    b"PUB t\n" + struct.pack(">i", 3) + b"abc",
]


def _expand(items: list[Any]) -> list[Any]:
    """FIN_RUN commands as the FIN commands they stand for."""
    out: list[Any] = []
    for item in norm(items):
        if item[0] == c.FIN_RUN:
            out += [(b"FIN", [b"FIN", msg_id], None) for msg_id in item[1]]
        else:
            out.append(item)
    return out


@given(st.lists(st.sampled_from(_FIN_POOL), max_size=30), st.lists(st.integers(0, 800), max_size=6))
@settings(max_examples=300, deadline=None)
def test_fin_runs_parse_as_the_lines_they_are(lines: list[bytes], cuts: list[int]) -> None:
    data = b"".join(lines)
    expected = norm(CommandParser().feed(data))
    fast = CommandParser(fin_runs=True)
    got: list[Any] = []
    start = 0
    for cut in [*sorted({min(cut, len(data)) for cut in cuts}), len(data)]:
        got += fast.feed(data[start:cut])
        start = cut
    assert _expand(got) == expected
    # what a relay hands on re-parses to the same commands
    again = b"".join(c.encode_command(*item) for item in got if not isinstance(item, ProtocolError))
    assert norm(CommandParser().feed(again)) == [e for e in expected if e[0] != "ERROR"]


def test_a_run_of_fins_is_one_command_and_never_the_slow_path() -> None:
    ids = [b"%016d" % i for i in range(500)]
    data = b"".join(b"FIN " + i + b"\n" for i in ids)
    assert CommandParser(fin_runs=True).feed(data) == [(c.FIN_RUN, ids, None)]
    assert b" " not in c.FIN_RUN and b"\n" in c.FIN_RUN  # no client can send this name
    assert CommandParser().feed(data)[0] == (b"FIN", [b"FIN", ids[0]], None)  # off by default


def test_fin_runs_keep_a_tiny_line_limit() -> None:
    # a FIN line (21 bytes) is too long for max_line=10 on both paths
    assert norm(CommandParser(max_line=10, fin_runs=True).feed(b"FIN 0123456789abcdef\n")) == [
        ("ERROR", "E_INVALID", "command line too long")]


_TOPICS = st.sampled_from([b"t", b"a.b_c-9", b"t#ephemeral", b"x" * 64, b"x" * 65, b"", b"t\r", b"t t", b"t\xff",
                           b"\xc3\xa9", b"t#eph"])


@given(mpub=st.booleans(), topic=_TOPICS, body=st.binary(max_size=40), count=st.integers(0, 2),
       size_delta=st.integers(-2, 2), msg_delta=st.integers(-2, 2), tail=st.binary(max_size=3),
       max_line=st.sampled_from([8, 16 * 1024]))
@settings(max_examples=1000, deadline=None)
def test_one_publish_in_one_read_parses_as_the_general_path(
        mpub: bool, topic: bytes, body: bytes, count: int, size_delta: int, msg_delta: int, tail: bytes,
        max_line: int) -> None:
    # a read that is one whole PUB or MPUB of one message takes a shortcut; near-misses
    # around it must come out as the general path gives them (bytewise: no shortcut)
    payload = size(count) + size(len(body) + msg_delta) + body if mpub else body
    data = (b"MPUB " if mpub else b"PUB ") + topic + b"\n" + size(len(payload) + size_delta) + payload + tail
    limits = {"max_msg_size": 32, "max_body_size": 44, "max_line": max_line}
    whole = norm(CommandParser(**limits).feed(data))
    assert whole == norm(feed_bytewise(CommandParser(**limits), data))
