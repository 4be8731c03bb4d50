"""Command-line flags and TOML config files, the way NSQ's daemons take them.

Each daemon declares its options once, as a dataclass whose fields carry a ``flag(...)``
description. From that one declaration this module builds:

- the command-line parser: ``--name=value``, ``--name value`` and the single-dash forms Go's
  ``flag`` package also accepts; booleans as ``--name`` or ``--name=false``; repeatable flags;
  Go durations (``250ms``, ``1m0s``, ``1h``);
- the config-file reader (``--config FILE``, TOML, keys are flag names with ``_``, or the
  ``cfg`` name NSQ uses where it differs);
- precedence: a flag given on the command line beats the config file, which beats the default.

Every problem is a ``UsageError`` whose text is one line; the command prints it and exits 1.
Durations are held as integer nanoseconds, as Go's ``time.Duration`` is, so ``/config`` and
``/info`` can report them in NSQ's units without rounding.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar, cast

from pynsqd import NSQ_VERSION, __version__

NS = 1
US = 1_000
MS = 1_000_000
SECOND = 1_000_000_000
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE

_UNITS = {"ns": NS, "us": US, "µs": US, "μs": US, "ms": MS, "s": SECOND, "m": MINUTE, "h": HOUR}
_DURATION_PART = re.compile(r"([0-9]*)(?:\.([0-9]*))?(ns|us|µs|μs|ms|s|m|h)")
_MAX_DURATION = (1 << 63) - 1


class UsageError(Exception):
    """A bad flag, flag value or config file; the text is one line meant for the user."""


def parse_duration(text: str) -> int:
    """Parse a Go duration string (``"1h2m3.5s"``, ``"-250ms"``, ``"0"``) into nanoseconds.

    Exactly as Go's ``time.ParseDuration``: integer arithmetic (a fraction of a nanosecond is
    dropped), every number needs a unit, no spaces, and a value beyond int64 is an error.
    Raises ``ValueError``.
    """
    s = text
    neg = False
    if s[:1] in ("+", "-"):
        neg = s[0] == "-"
        s = s[1:]
    if s == "0":
        return 0
    if not s:
        raise ValueError(f"invalid duration {text!r}")
    total = 0
    pos = 0
    while pos < len(s):
        m = _DURATION_PART.match(s, pos)
        if m is None:
            raise ValueError(f"invalid duration {text!r}")
        whole, frac, unit = m.group(1), m.group(2), m.group(3)
        if not whole and not frac:
            raise ValueError(f"invalid duration {text!r}")
        scale = _UNITS[unit]
        total += int(whole or "0") * scale
        if frac:
            total += int(frac) * scale // 10 ** len(frac)
        if total > _MAX_DURATION + neg:
            raise ValueError(f"invalid duration {text!r}")
        pos = m.end()
    if total > _MAX_DURATION and not neg:
        raise ValueError(f"invalid duration {text!r}")
    return -total if neg else total


def format_duration(ns: int) -> str:
    """Format nanoseconds the way Go's ``time.Duration.String`` does (``1m0s``, ``250ms``)."""
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    if ns < US:
        return f"{sign}{ns}ns"
    if ns < MS:
        return sign + _decimal(ns, US) + "µs"
    if ns < SECOND:
        return sign + _decimal(ns, MS) + "ms"
    hours, rest = divmod(ns, HOUR)
    minutes, rest = divmod(rest, MINUTE)
    out = sign
    if hours:
        out += f"{hours}h"
    if hours or minutes:
        out += f"{minutes}m"
    return out + _decimal(rest, SECOND) + "s"


def _decimal(value: int, unit: int) -> str:
    """``value / unit`` in decimal without trailing zeros (``unit`` is a power of ten)."""
    whole, frac = divmod(value, unit)
    if not frac:
        return str(whole)
    digits = len(str(unit)) - 1
    return f"{whole}." + f"{frac:0{digits}d}".rstrip("0")


def parse_bool(text: str) -> bool:
    """Parse a boolean as Go's ``strconv.ParseBool`` does."""
    low = text.strip()
    if low in ("1", "t", "T", "true", "TRUE", "True"):
        return True
    if low in ("0", "f", "F", "false", "FALSE", "False"):
        return False
    raise ValueError(f"invalid boolean {text!r}")


# --- declaring options -------------------------------------------------------------------

KINDS = ("str", "int", "float", "bool", "duration", "strlist", "floatlist")


def flag(
    name: str,
    default: Any,
    help: str,
    *,
    kind: str = "",
    cfg: str = "",
    validate: Callable[[Any], str | None] | None = None,
    parse: Callable[[Any], Any] | None = None,
    bare: str | None = None,
) -> Any:
    """Declare a dataclass field as a command-line flag.

    ``kind`` is inferred from the default where it can be (use ``"duration"`` explicitly for
    nanosecond durations, ``"strlist"``/``"floatlist"`` for repeatable flags). ``cfg`` is the
    config-file key when NSQ's differs from the flag name. ``validate`` returns an error text
    for a bad value, or None. ``parse`` replaces the kind's conversion of a command-line
    string or TOML value (raise ``ValueError`` for a bad one); ``bare`` is the value of the
    flag given without one (Go's ``IsBoolFlag``; booleans get ``"true"``).
    """
    if not kind:
        kind = {bool: "bool", int: "int", float: "float", str: "str"}.get(type(default), "")
    if kind not in KINDS:
        raise TypeError(f"flag {name}: unknown kind {kind!r}")
    meta = {"flag": name, "help": help, "kind": kind, "cfg": cfg, "validate": validate,
            "parse": parse, "bare": "true" if kind == "bool" else bare}
    if kind in ("strlist", "floatlist"):
        return dataclasses.field(default_factory=lambda: list(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _convert(kind: str, raw: Any, name: str) -> Any:
    """Turn a command-line string or a TOML value into the field's Python value."""
    try:
        if kind == "str":
            if not isinstance(raw, (str, int, float)) or isinstance(raw, bool):
                raise ValueError(f"expected a string, got {raw!r}")
            return str(raw)
        if kind == "int":
            if isinstance(raw, bool):
                raise ValueError(f"expected an integer, got {raw!r}")
            return int(raw, 0) if isinstance(raw, str) else int(raw)
        if kind == "float":
            return float(raw)
        if kind == "bool":
            return parse_bool(raw) if isinstance(raw, str) else _strict_bool(raw)
        if kind == "duration":
            if isinstance(raw, bool):
                raise ValueError(f"expected a duration, got {raw!r}")
            if isinstance(raw, int):  # go-options reads integers as milliseconds
                return raw * MS
            if not isinstance(raw, str):
                raise ValueError(f"expected a duration, got {raw!r}")
            return parse_duration(raw)
        if kind == "strlist":
            if isinstance(raw, str):  # go-options splits a string on commas
                return raw.split(",")
            if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
                raise ValueError(f"expected a list of strings, got {raw!r}")
            return list(raw)
        if kind == "floatlist":
            items = raw if isinstance(raw, list) else [raw]
            out: list[float] = []
            for item in items:
                out.extend(float(p) for p in str(item).split(",") if p.strip())
            return out
    except (TypeError, ValueError) as exc:
        raise UsageError(f"invalid value {raw!r} for flag --{name}: {exc}") from None
    raise UsageError(f"flag --{name} has an unknown kind")


def _convert_field(field: dataclasses.Field[Any], raw: Any) -> Any:
    meta = field.metadata
    if meta["parse"] is None:
        return _convert(meta["kind"], raw, meta["flag"])
    try:
        return meta["parse"](raw)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"invalid value {raw!r} for flag --{meta['flag']}: {exc}") from None


def _strict_bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    raise ValueError(f"expected a boolean, got {raw!r}")


class Parser(argparse.ArgumentParser):
    """argparse, but errors are one line and exit status 1 (NSQ's binaries exit 1 too)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


T = TypeVar("T")


def build_parser(cls: type[Any], prog: str, description: str) -> argparse.ArgumentParser:
    """The argparse parser for an options dataclass; every flag's default is SUPPRESS so the
    resolver can tell a flag given on the command line from one left alone."""
    parser = Parser(prog=prog, description=description, allow_abbrev=False,
                     argument_default=argparse.SUPPRESS)
    parser.add_argument("--config", "-config", metavar="FILE", help="path to config file")
    parser.add_argument("--version", "-version", action="store_true",
                        help="print version string")
    for field in dataclasses.fields(cls):
        meta = field.metadata
        if "flag" not in meta:
            continue
        name, kind = meta["flag"], meta["kind"]
        names = [f"--{name}", f"-{name}"]
        default = field.default if kind not in ("strlist", "floatlist") else []
        shown = _show_default(kind, default)
        help_text = f"{meta['help']} (default {shown})" if shown else meta["help"]
        help_text = help_text.replace("%", "%%")  # argparse %-formats help ("%Y", "'%s'")
        if meta["bare"] is not None:
            parser.add_argument(*names, dest=field.name, nargs="?", const=meta["bare"],
                                metavar="BOOL" if kind == "bool" else kind.upper(), help=help_text)
        elif kind in ("strlist", "floatlist"):
            parser.add_argument(*names, dest=field.name, action="append", metavar="VALUE",
                                help=help_text + " (may be given multiple times)")
        else:
            parser.add_argument(*names, dest=field.name, metavar=kind.upper(), help=help_text)
    return parser


def _show_default(kind: str, value: Any) -> str:
    if kind == "duration":
        return format_duration(value)
    if kind in ("strlist", "floatlist"):
        return ""
    if value == "":
        return ""
    return str(value).lower() if isinstance(value, bool) else repr(value) if kind == "str" else str(value)


def resolve(cls: type[T], argv: Sequence[str], prog: str, description: str) -> tuple[T, bool]:
    """Parse ``argv`` (and the ``--config`` file it names) into an instance of ``cls``.

    Returns ``(options, version_requested)``. Raises ``UsageError`` with a one-line text.
    """
    parser = build_parser(cls, prog, description)
    all_fields = dataclasses.fields(cast(Any, cls))
    ns = vars(parser.parse_args(_join_values(argv, all_fields)))
    fields = {f.name: f for f in all_fields if "flag" in f.metadata}
    values: dict[str, Any] = {}
    config_path = ns.pop("config", None)
    version = bool(ns.pop("version", False))
    if config_path:
        values.update(_load_config(config_path, fields))
    for key, raw in ns.items():
        field = fields[key]
        kind = field.metadata["kind"]
        if kind in ("strlist", "floatlist"):
            converted: list[Any] = []
            for item in raw:
                converted.extend(_convert_field(field, item))
            values[key] = converted
        else:
            values[key] = _convert_field(field, raw)
    for key, value in values.items():
        check = fields[key].metadata["validate"]
        problem = check(value) if check else None
        if problem:
            raise UsageError(f"invalid value for --{fields[key].metadata['flag']}: {problem}")
    return cls(**values), version


def _join_values(argv: Sequence[str], fields: tuple[dataclasses.Field[Any], ...]) -> list[str]:
    """Turn ``--name value`` into ``--name=value`` for flags that take a value, so a value
    that starts with ``-`` (``--max-req-timeout -1s``) is read as Go's ``flag`` reads it."""
    takes_value = {"--config", "-config"}
    for field in fields:
        meta = field.metadata
        if "flag" in meta and meta["bare"] is None:
            takes_value.update((f"--{meta['flag']}", f"-{meta['flag']}"))
    out: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            out.extend(args[i:])
            break
        if arg in takes_value and i + 1 < len(args):
            out.append(f"{arg}={args[i + 1]}")
            i += 2
            continue
        out.append(arg)
        i += 1
    return out


def _load_config(path: str, fields: dict[str, dataclasses.Field[Any]]) -> dict[str, Any]:
    import tomllib  # only with --config: its parser compiles regexes at import (tens of ms at boot)
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise UsageError(f"failed to load config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"failed to parse config file {path}: {exc}") from None
    by_key: dict[str, dataclasses.Field[Any]] = {}
    for field in fields.values():
        by_key[field.metadata["cfg"] or field.metadata["flag"].replace("-", "_")] = field
    out: dict[str, Any] = {}
    for key, raw in data.items():
        known = by_key.get(key)
        if known is None:
            continue  # NSQ ignores keys it does not know (shared config files are common)
        out[known.name] = _convert_field(known, raw)
    return out


def config_value(options: Any, cfg_name: str) -> Any:
    """The value of the option whose config-file name is ``cfg_name`` (for ``GET /config``);
    durations come back as nanoseconds, as Go's JSON encoding of ``time.Duration`` does."""
    for field in dataclasses.fields(options):
        meta = field.metadata
        if "flag" in meta and (meta["cfg"] or meta["flag"].replace("-", "_")) == cfg_name:
            return getattr(options, field.name)
    raise KeyError(cfg_name)


def version_string(prog: str) -> str:
    """What ``prog --version`` prints (and a daemon logs at start), as NSQ's binaries word it."""
    return f"{prog} v{NSQ_VERSION} (built w/pynsqd {__version__})"


def run_cli(main: Callable[[list[str]], int], prog: str, argv: list[str] | None = None) -> NoReturn:
    """Run a command's ``main``; a ``UsageError`` becomes one line on stderr and exit 1."""
    try:
        code = main(sys.argv[1:] if argv is None else argv)
    except UsageError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)
