"""A request's target as Go's ``url.ParseRequestURI`` takes it (what ``net/http`` requires of
the second word of a request line): ``*``, an absolute path, or an absolute URL — no control
byte anywhere, a scheme of a letter then letters, digits, ``+-.``, an authority whose port is
digits, whose host holds only the bytes Go allows and escapes only non-ASCII bytes (and
``%25``), and valid ``%`` escapes in the path (the query is not looked at). ``CONNECT`` takes
an authority alone."""

from __future__ import annotations

import re

_CTL = re.compile(rb"[\x00-\x1f\x7f]")
_SCHEME = re.compile(rb"[A-Za-z][A-Za-z0-9+\-.]*:")
_ESCAPES = re.compile(rb"%(?![0-9A-Fa-f]{2})")  # a % not followed by two hex digits
_HOST_ESCAPE_OK = re.compile(rb"%(?:[89A-Fa-f][0-9A-Fa-f]|25)")  # a host escapes non-ASCII bytes (and %)
_HOST_CHARS_BAD = re.compile(rb"[^0-9A-Za-z!$&'()*+,;=:\[\]<>\"\-_.~%\x80-\xff]")
_USERINFO_BAD = re.compile(rb"[^0-9A-Za-z\-._:~!$&'()*+,;=%@]")


def target_ok(method: bytes, target: bytes) -> bool:
    """Whether Go's ``url.ParseRequestURI`` takes ``target`` (a CONNECT authority as
    ``http://`` + it)."""
    if target[:1] == b"/" and b"%" not in target:
        return _CTL.search(target) is None  # an absolute path: the common case
    if method == b"CONNECT" and target[:1] != b"/":
        target = b"http://" + target
    if not target or _CTL.search(target):
        return False
    if target == b"*":
        return True
    scheme = _SCHEME.match(target)
    if target[:1] == b":":
        return False  # "missing protocol scheme"
    rest = target[scheme.end():] if scheme else target
    if rest.endswith(b"?") and rest.count(b"?") == 1:
        rest = rest[:-1]
    else:
        rest = rest.partition(b"?")[0]
    if rest[:1] != b"/":
        return scheme is not None  # an opaque URL; a rootless path is no request URI
    if scheme and rest[:2] == b"//":
        authority, slash, path = rest[2:].partition(b"/")
        if not _authority_ok(authority):
            return False
        rest = slash + path
    return _ESCAPES.search(rest) is None


def _authority_ok(authority: bytes) -> bool:
    userinfo, at, host = authority.rpartition(b"@")
    if at and (_USERINFO_BAD.search(userinfo) or _ESCAPES.search(userinfo)):
        return False
    if host[:1] == b"[":
        close = host.rfind(b"]")
        if close < 0 or not _port_ok(host[close + 1:]):
            return False
    elif b":" in host and not _port_ok(host[host.rfind(b":"):]):
        return False
    if _ESCAPES.search(host) or _HOST_CHARS_BAD.search(host):
        return False
    return all(_HOST_ESCAPE_OK.match(host, i) for i in range(len(host)) if host[i] == 37)


def _port_ok(port: bytes) -> bool:
    """Go's ``validOptionalPort``: empty, or ``:`` and digits."""
    return not port or (port[:1] == b":" and (len(port) == 1 or port[1:].isdigit()))
