"""deploy/config/*.toml: the sample config files hold every option with its default, and the
daemons' own ``--config`` loads them (so a new or renamed flag, or a changed default, fails here
until the sample follows)."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from pynsqd.admin.config import AdminOptions
from pynsqd.admin.config import parse_args as admin_args
from pynsqd.lookupd.config import LookupdOptions
from pynsqd.lookupd.config import parse_args as lookupd_args
from pynsqd.node.config import NsqdOptions
from pynsqd.node.config import parse_args as nsqd_args
from pynsqd.shared_flags import LOG_LEVELS
from testbed.harness import Daemon, remove_segments

pytestmark = pytest.mark.fast

CONFIG = Path(__file__).resolve().parent.parent / "deploy" / "config"

# Options whose default depends on the host: the sample shows them commented out, with an example.
HOST_DEPENDENT = {"nsqd": {"shards"}, "nsqlookupd": {"broadcast_address"}, "nsqadmin": set()}
# Options the daemon cannot start without (no default): the sample sets them.
REQUIRED = {"nsqd": {}, "nsqlookupd": {}, "nsqadmin": {"nsqlookupd_http_addresses": ["127.0.0.1:4161"]}}

DAEMONS: dict[str, tuple[type[Any], Callable[[Sequence[str]], tuple[Any, bool]]]] = {
    "nsqd": (NsqdOptions, nsqd_args),
    "nsqlookupd": (LookupdOptions, lookupd_args),
    "nsqadmin": (AdminOptions, admin_args),
}


def config_keys(cls: type[Any]) -> dict[str, str]:
    """config-file key → dataclass field name, for every flag of ``cls``."""
    return {(f.metadata["cfg"] or f.metadata["flag"].replace("-", "_")): f.name
            for f in dataclasses.fields(cls) if "flag" in f.metadata}


@pytest.mark.parametrize("prog", sorted(DAEMONS))
def test_sample_lists_every_option_once_with_a_comment(prog: str) -> None:
    cls, _ = DAEMONS[prog]
    text = (CONFIG / f"{prog}.toml").read_text()
    active = tomllib.loads(text)
    commented = set(re.findall(r"^# (\w+) = ", text, re.M))
    keys = config_keys(cls)
    assert set(active) - set(keys) == set(), "keys the daemon does not know (it would ignore them)"
    assert set(keys) - set(active) == HOST_DEPENDENT[prog], "options missing from the sample"
    assert HOST_DEPENDENT[prog] <= commented
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if re.match(r"^(# )?\w+ = ", line) and not line.startswith("# Keys"):
            assert lines[i - 1].startswith("# ") and not re.match(r"^# \w+ = ", lines[i - 1]), \
                f"{prog}.toml:{i + 1}: no one-line comment above {line!r}"


@pytest.mark.parametrize("prog", sorted(DAEMONS))
def test_sample_values_are_the_defaults(prog: str) -> None:
    """Loaded by the daemon's own option parser, the sample gives exactly the defaults."""
    cls, parse = DAEMONS[prog]
    required = [f"--{cls_flag(cls, key)}={v}" for key, values in REQUIRED[prog].items() for v in values]
    loaded, _ = parse([f"--config={CONFIG / f'{prog}.toml'}"])
    defaults, _ = parse(required)
    assert dataclasses.asdict(loaded) == dataclasses.asdict(defaults)


def cls_flag(cls: type[Any], key: str) -> str:
    name = config_keys(cls)[key]
    return next(f.metadata["flag"] for f in dataclasses.fields(cls) if f.name == name)


def test_nsqd_serves_with_the_sample(tmp_path: Path) -> None:
    """A real node started with ``--config`` on the sample (listeners moved to free ports on
    the command line, which beats the file) reports the sample's values on ``GET /config``."""
    sample = tomllib.loads((CONFIG / "nsqd.toml").read_text())
    node = Daemon("pynsqd.supervisor", [f"--config={CONFIG / 'nsqd.toml'}", "--tcp-address=127.0.0.1:0",
                                        "--http-address=127.0.0.1:0", f"--data-path={tmp_path}", "--shards=1"])
    try:
        node.start()
        assert httpx.get(f"{node.http_url}/ping").text == "OK"
        expected = nsqd_args([f"--config={CONFIG / 'nsqd.toml'}"])[0]
        for key in sorted(set(sample) - {"tcp_address", "http_address", "data_path"}):
            reply = httpx.get(f"{node.http_url}/config/{key}")
            assert reply.status_code == 200, (key, reply.text)
            want = getattr(expected, config_keys(NsqdOptions)[key])
            if key == "log_level":  # nsqd reports its LogLevel type's number
                want = LOG_LEVELS.index(want) + 1
            got = reply.text if isinstance(want, str) else orjson.loads(reply.content)
            assert got == want, key
    finally:
        node.stop()
        remove_segments([node])


@pytest.mark.parametrize("prog", ["nsqlookupd", "nsqadmin"])
def test_daemon_starts_with_the_sample(prog: str) -> None:
    module = {"nsqlookupd": "pynsqd.lookupd", "nsqadmin": "pynsqd.admin"}[prog]
    listen = ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"] if prog == "nsqlookupd" \
        else ["--http-address=127.0.0.1:0"]
    daemon = Daemon(module, [f"--config={CONFIG / f'{prog}.toml'}", *listen],
                    listeners=("TCP", "HTTP") if prog == "nsqlookupd" else ("HTTP",))
    try:
        daemon.start()
        assert httpx.get(f"{daemon.http_url}/ping").text == "OK"
        if prog == "nsqadmin":
            # the sample's source reached nsqadmin: it reports the lookupd it was given
            reply = httpx.get(f"{daemon.http_url}/config/nsqlookupd_http_addresses")
            assert reply.json() == ["127.0.0.1:4161"]
    finally:
        daemon.stop()
