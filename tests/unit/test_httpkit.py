"""The HTTP toolkit the three daemons share: Go's query parsing and httprouter's matching."""

from __future__ import annotations

import pytest

from pynsqd.httpkit import HTTPError, RouteTable, parse_query


def test_query_parsing_takes_any_bytes_as_go_does_and_refuses_what_go_refuses() -> None:
    assert parse_query(b"topic=%ff&b=caf%C3%A9") == {"topic": ["\ufffd"], "b": ["café"]}
    for bad in (b"topic=%zz", b"topic=%f", b"a=1;b=2", b"%=x"):
        with pytest.raises(HTTPError) as caught:
            parse_query(bad)
        assert (caught.value.status, caught.value.message) == (400, "INVALID_REQUEST")


def test_router_matches_params_and_reports_methods_and_redirects() -> None:
    router: RouteTable[str] = RouteTable([("GET", "/ping", "ping"), ("GET", "/topics/:topic", "topic"),
                                  ("POST", "/topics/:topic", "action"), ("PUT", "/config/:opt", "config")])
    found = router.match("GET", "/topics/a")
    assert (found.handler, found.params) == ("topic", {"topic": "a"})
    assert router.match("POST", "/topics/a").handler == "action"
    missed = router.match("DELETE", "/topics/a")
    assert (missed.handler, missed.allowed, missed.redirect) == (None, ("GET", "POST"), None)
    assert router.match("GET", "/topics/a/").redirect == "/topics/a"  # trailing slash
    assert router.match("GET", "/PING").redirect == "/ping"  # fixed path, any case
    assert router.match("GET", "/ping/../ping/").redirect == "/ping"
    assert router.match("POST", "/ping/").redirect is None  # no POST route to fix it to
    assert router.match("GET", "/topics/").handler is None  # a parameter is never empty
    assert router.routes("/config/x") == ["PUT"]
