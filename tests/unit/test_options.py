"""Flags, config files and Go durations (pynsqd.options) and nsqd's options (pynsqd.shard.config)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pynsqd.options import (
    HOUR,
    MINUTE,
    MS,
    NS,
    SECOND,
    US,
    UsageError,
    config_value,
    format_duration,
    parse_bool,
    parse_duration,
    resolve,
    run_cli,
)
from pynsqd.shard.config import NsqdOptions, check_supported, default_node_id, parse_args

MAX_I64 = 2**63 - 1


def opts(*argv: str) -> NsqdOptions:
    """Resolve without the start-up checks (so unsupported-but-valid flags can be tested)."""
    return resolve(NsqdOptions, argv, "nsqd", "test")[0]


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "nsqd.cfg"
    path.write_text(text)
    return str(path)


# --- Go durations ----------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "ns"), [
    ("250ms", 250 * MS), ("1m0s", MINUTE), ("1h", HOUR), ("1.5h", 90 * MINUTE), ("-1s", -SECOND),
    ("0", 0), ("+0", 0), ("-0", 0), ("0s", 0), ("1h2m3.5s", HOUR + 2 * MINUTE + 3500 * MS),
    ("60s", MINUTE), ("15m", 15 * MINUTE), ("10ns", 10), ("1us", US), ("1µs", US), ("1μs", US),
    (".5s", 500 * MS), ("1.s", SECOND), ("+2ms", 2 * MS), ("1.000000001s", SECOND + 1),
    ("1.9ns", 1),  # Go drops a fraction of a nanosecond
    ("3m3m", 6 * MINUTE), ("1h1h1h", 3 * HOUR),
    ("2562047h47m16.854775807s", MAX_I64), ("-2562047h47m16.854775808s", -(2**63)),
])
def test_parse_duration(text: str, ns: int) -> None:
    assert parse_duration(text) == ns


@pytest.mark.parametrize("text", [
    "", "1", "s", "1 s", " 1s", "1s ", "1d", ".s", "1s1", "-", "+", "1.5", "ms", "1hh", "1e3s",
    "2562047h47m16.854775808s", "9999999999999999999ns", "--1s",
])
def test_parse_duration_errors(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize(("ns", "text"), [
    (0, "0s"), (1, "1ns"), (999, "999ns"), (US, "1µs"), (1500, "1.5µs"), (250 * MS, "250ms"),
    (1500 * US, "1.5ms"), (SECOND, "1s"), (1500 * MS, "1.5s"), (MINUTE, "1m0s"),
    (HOUR, "1h0m0s"), (90 * MINUTE, "1h30m0s"), (-SECOND, "-1s"), (-1, "-1ns"),
    (HOUR + MINUTE + 1500 * MS, "1h1m1.5s"), (SECOND + 1, "1.000000001s"),
    (123456789, "123.456789ms"), (MAX_I64, "2562047h47m16.854775807s"),
])
def test_format_duration(ns: int, text: str) -> None:
    assert format_duration(ns) == text


def test_format_parse_round_trip() -> None:
    for ns in (0, 1, 7 * US + 3, 25 * MS, 60 * SECOND, 15 * MINUTE, HOUR, 36 * HOUR + 17,
               -250 * MS, 10**18 + 12345, MAX_I64):
        assert parse_duration(format_duration(ns)) == ns


def test_parse_bool_like_go() -> None:
    for text in ("1", "t", "T", "true", "TRUE", "True"):
        assert parse_bool(text) is True
    for text in ("0", "f", "F", "false", "FALSE", "False"):
        assert parse_bool(text) is False
    for text in ("yes", "tRuE", "", "2"):
        with pytest.raises(ValueError):
            parse_bool(text)


# --- command-line forms ------------------------------------------------------------------------

def test_defaults() -> None:
    o = opts()
    assert o.msg_timeout == 60 * SECOND
    assert o.max_req_timeout == HOUR
    assert o.max_msg_size == 1048576 and o.max_body_size == 5242880
    assert o.snappy is True and o.deflate is True
    assert o.tls_required == "false" and o.log_level == "info"
    assert o.lookupd_tcp_address == [] and o.e2e_processing_latency_percentile == []
    assert o.node_id == default_node_id()
    assert 0 <= o.node_id < 1024


@pytest.mark.parametrize("argv", [
    ["--mem-queue-size=5"], ["--mem-queue-size", "5"], ["-mem-queue-size=5"], ["-mem-queue-size", "5"],
])
def test_flag_forms(argv: list[str]) -> None:
    assert opts(*argv).mem_queue_size == 5


def test_duration_flags() -> None:
    o = opts("--msg-timeout=250ms", "--max-req-timeout", "1.5h", "-sync-timeout=1m0s")
    assert (o.msg_timeout, o.max_req_timeout, o.sync_timeout) == (250 * MS, 90 * MINUTE, MINUTE)


def test_a_value_may_start_with_a_dash() -> None:
    # Go's flag package takes the next argument as the value, whatever it looks like.
    assert opts("--statsd-interval", "-1s").statsd_interval == -SECOND
    assert opts("--log-prefix", "-x-").log_prefix == "-x-"
    assert opts("--node-id", "-1").node_id == default_node_id()


@pytest.mark.parametrize(("argv", "value"), [
    (["--snappy=false"], False), (["--snappy=0"], False), (["-snappy=f"], False),
    (["--snappy"], True), (["--snappy=true"], True), (["--snappy=1"], True), ([], True),
])
def test_boolean_flags(argv: list[str], value: bool) -> None:
    assert opts(*argv).snappy is value


def test_repeatable_flags() -> None:
    o = opts("--lookupd-tcp-address=a:4160", "--lookupd-tcp-address", "b:4160")
    assert o.lookupd_tcp_address == ["a:4160", "b:4160"]
    # go-options joins a list flag's values with commas and splits them again
    assert opts("--lookupd-tcp-address=a:1,b:2").lookupd_tcp_address == ["a:1", "b:2"]
    o = opts("--e2e-processing-latency-percentile=0.99,0.95", "--e2e-processing-latency-percentile=1")
    assert o.e2e_processing_latency_percentile == [0.99, 0.95, 1.0]


def test_tls_required_takes_go_booleans_and_a_bare_flag() -> None:
    assert opts("--tls-required").tls_required == "true"
    assert opts("--tls-required=1").tls_required == "true"
    assert opts("--tls-required=FALSE").tls_required == "false"
    assert opts("--tls-required=TCP-HTTPS").tls_required == "tcp-https"
    with pytest.raises(UsageError):
        opts("--tls-required=maybe")


def test_case_insensitive_levels_and_versions() -> None:
    assert opts("--log-level=DEBUG").log_level == "debug"
    assert opts("--tls-min-version=TLS1.2").tls_min_version == "tls1.2"


def test_client_auth_policy_forces_tls_required() -> None:
    assert opts("--tls-client-auth-policy=require").tls_required == "true"


@pytest.mark.parametrize("argv", [
    ["--no-such-flag=1"], ["--mem-queue"], ["--mem-queue-size=abc"], ["--mem-queue-size"],
    ["--msg-timeout=10"], ["--msg-timeout=1d"], ["--snappy=yes"], ["--log-level=loud"],
    ["--mem-queue-size=-1"], ["--max-msg-size=0"], ["--msg-timeout=0s"],
    ["--e2e-processing-latency-percentile=x"], ["--tls-min-version=ssl3.0"], ["positional"],
    ["--auth-http-request-method=put"],
])
def test_bad_flags_are_one_line_usage_errors(argv: list[str]) -> None:
    with pytest.raises(UsageError) as info:
        opts(*argv)
    assert "\n" not in str(info.value) and str(info.value)


def test_version_flag() -> None:
    assert resolve(NsqdOptions, ["--version"], "nsqd", "")[1] is True
    assert resolve(NsqdOptions, [], "nsqd", "")[1] is False


# --- config files ------------------------------------------------------------------------------

def test_config_file_with_nsq_key_names(tmp_path: Path) -> None:
    cfg = write(tmp_path, """
id = 77
nsqlookupd_tcp_addresses = ["127.0.0.1:4160", "127.0.0.2:4160"]
auth_http_addresses = ["http://auth:4181"]
e2e_processing_latency_percentiles = [1.0, 0.99]
msg_timeout = "90s"
max_req_timeout = 1500
sync_timeout = 250
mem_queue_size = 42
statsd_mem_stats = false
tls_required = false
tls_min_version = ""
log_level = "WARN"
statsd_prefix = "nsq.%s"
some_key_from_another_version = "ignored"
""")
    o = opts("--config", cfg)
    assert o.node_id == 77
    assert o.lookupd_tcp_address == ["127.0.0.1:4160", "127.0.0.2:4160"]
    assert o.auth_http_address == ["http://auth:4181"]
    assert o.e2e_processing_latency_percentile == [1.0, 0.99]
    assert o.msg_timeout == 90 * SECOND
    assert o.max_req_timeout == 1500 * MS  # integers are milliseconds (go-options)
    assert o.sync_timeout == 250 * MS
    assert (o.mem_queue_size, o.statsd_mem_stats) == (42, False)
    assert (o.tls_required, o.tls_min_version, o.log_level) == ("false", "", "warn")
    assert config_value(o, "id") == 77
    assert config_value(o, "nsqlookupd_tcp_addresses") == o.lookupd_tcp_address
    assert config_value(o, "msg_timeout") == 90 * SECOND  # nanoseconds, as Go's JSON says
    with pytest.raises(KeyError):
        config_value(o, "node_id")


def test_config_string_list_is_split_on_commas(tmp_path: Path) -> None:
    cfg = write(tmp_path, 'nsqlookupd_tcp_addresses = "a:4160,b:4160"\n')
    assert opts("--config=" + cfg).lookupd_tcp_address == ["a:4160", "b:4160"]


def test_config_tls_required_forms(tmp_path: Path) -> None:
    for raw, value in (("true", "true"), ('"tcp-https"', "tcp-https"), ('"1"', "true"), ("false", "false")):
        cfg = write(tmp_path, f"tls_required = {raw}\n")
        assert opts("-config", cfg).tls_required == value


def test_precedence_command_line_over_config_over_default(tmp_path: Path) -> None:
    cfg = write(tmp_path, 'mem_queue_size = 5\nmsg_timeout = "2s"\n'
                          'nsqlookupd_tcp_addresses = ["cfg:4160"]\nsnappy = false\n')
    o = opts("--config", cfg, "--mem-queue-size=7", "--lookupd-tcp-address=cli:4160")
    assert o.mem_queue_size == 7  # command line
    assert o.msg_timeout == 2 * SECOND  # config file
    assert o.lookupd_tcp_address == ["cli:4160"]  # a list flag replaces, not extends
    assert o.snappy is False  # config file
    assert o.max_msg_size == 1048576  # default
    # order on the command line does not matter
    assert opts("--mem-queue-size=7", "--config", cfg).mem_queue_size == 7


@pytest.mark.parametrize("text", [
    "mem_queue_size = \"many\"\n", "msg_timeout = 1.5\n", "msg_timeout = true\n", "snappy = 1\n",
    "id = true\n", 'msg_timeout = "forever"\n', "log_level = 2\n", "nsqlookupd_tcp_addresses = [1]\n",
    "tls_required = \"sometimes\"\n", "mem_queue_size = -1\n", "this is not toml\n",
])
def test_bad_config_values_are_one_line_usage_errors(tmp_path: Path, text: str) -> None:
    with pytest.raises(UsageError) as info:
        opts("--config", write(tmp_path, text))
    assert "\n" not in str(info.value)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="failed to load config file"):
        opts("--config", str(tmp_path / "nope.cfg"))


# --- start-up checks ---------------------------------------------------------------------------

@pytest.mark.parametrize(("argv", "match"), [
    (["--enable-experiment=topology-aware-consumption"], "experiment"),
])
def test_check_supported_refuses_what_is_not_built_yet(argv: list[str], match: str) -> None:
    with pytest.raises(UsageError, match=match) as info:
        parse_args(argv)
    assert "not supported by this build" in str(info.value)


@pytest.mark.parametrize(("argv", "match"), [
    (["--node-id=1024"], r"\[0,1024\)"),
    (["--node-id=-2"], r"\[0,1024\)"),
    (["--max-deflate-level=0"], r"\[1,9\]"),
    (["--tls-cert=c.pem"], "together"),
    (["--tls-key=k.pem"], "together"),
    (["--max-deflate-level=10"], r"\[1,9\]"),
    (["--e2e-processing-latency-percentile=1.5"], "percentile"),
    (["--e2e-processing-latency-percentile=0"], "percentile"),
    (["--enable-experiment=warp-drive"], "experiment"),
    (["--tls-required=true"], "without TLS key and cert"),
    (["--tls-client-auth-policy=require-verify"], "without TLS key and cert"),
])
def test_check_supported_refuses_what_nsqd_refuses(argv: list[str], match: str) -> None:
    with pytest.raises(UsageError, match=match):
        parse_args(argv)


def test_parse_args_accepts_supported_settings() -> None:
    o, version = parse_args(["--node-id=0", "--max-deflate-level=9", "--snappy=false",
                             "--tcp-address=127.0.0.1:0", "--msg-timeout=1s"])
    assert not version and o.node_id == 0 and o.snappy is False
    check_supported(o)  # idempotent


def test_version_skips_the_start_up_checks() -> None:
    assert parse_args(["--version", "--node-id=5000"])[1] is True


def test_run_cli_turns_usage_errors_into_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    def main(argv: list[str]) -> int:
        parse_args(argv)
        return 0

    with pytest.raises(SystemExit) as info:
        run_cli(main, "nsqd", ["--bogus"])
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("nsqd: error:") and "--bogus" in err
    with pytest.raises(SystemExit) as info:
        run_cli(main, "nsqd", [])
    assert info.value.code == 0


def test_units() -> None:
    assert (NS, US, MS, SECOND) == (1, 1000, 10**6, 10**9)
