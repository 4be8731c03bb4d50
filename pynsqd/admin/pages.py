"""The pages: one server-rendered HTML shell per route, filled in by ``static/app.js``.

Every page route serves the same small document (as nsqadmin serves its single-page app's
index): the header and navigation, an empty ``<main>``, and a JSON block with what the
script needs — the base path, the version, whether the viewer may take admin actions,
the graphite settings, the lookupds and the sampling interval. The script reads the path,
fetches the page's ``/api`` data and re-renders the numbers every couple of seconds.
"""

from __future__ import annotations

import html
import socket

import orjson

from pynsqd import NSQ_VERSION
from pynsqd.admin.config import AdminOptions

PAGES = ("/", "/topics", "/topics/:topic", "/topics/:topic/:channel", "/nodes", "/nodes/:node",
         "/counter", "/lookup")

_SHELL = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>nsqadmin</title>
<link rel="icon" href="{base}static/favicon.svg" type="image/svg+xml">
<link rel="stylesheet" href="{base}static/app.css?v={assets}">
</head>
<body>
<header class="bar">
  <a class="brand" href="{base}">nsq<span>admin</span></a>
  <nav>
    <a href="{base}" data-nav="topics">Topics</a>
    <a href="{base}nodes" data-nav="nodes">Nodes</a>
    <a href="{base}counter" data-nav="counter">Counter</a>
    <a href="{base}lookup" data-nav="lookup">Lookup</a>
  </nav>
  <span class="meta">v{version} &middot; {host}</span>
</header>
<div id="warning" class="alert" hidden></div>
<main id="main"><p class="muted">Loading&hellip;</p></main>
<div id="modal" class="modal" hidden>
  <div class="dialog" role="dialog" aria-modal="true">
    <p id="modal-text"></p>
    <div class="buttons">
      <button id="modal-cancel" class="btn">Cancel</button>
      <button id="modal-ok" class="btn danger">Confirm</button>
    </div>
  </div>
</div>
<script id="config" type="application/json">{config}</script>
<script src="{base}static/app.js?v={assets}"></script>
</body>
</html>
"""


def render_index(options: AdminOptions, is_admin: bool, assets: str) -> str:
    """The page shell; ``assets`` is the assets' content hash, so browsers may cache them
    for good and still fetch new ones after an upgrade."""
    base = options.base_path.rstrip("/") + "/"
    config = {
        "base": base, "version": NSQ_VERSION, "is_admin": is_admin,
        "graphite_url": options.graphite_url, "proxy_graphite": options.proxy_graphite,
        "statsd_prefix": options.statsd_prefix, "statsd_counter_format": options.statsd_counter_format,
        "statsd_gauge_format": options.statsd_gauge_format,
        "statsd_interval": options.statsd_interval // 1_000_000_000,
        "lookupd": list(options.lookupd_http_addresses), "nsqd": list(options.nsqd_http_addresses),
        "refresh_ms": max(1000, min(5000, options.stats_sample_interval // 1_000_000)),
    }
    # "</" cannot end the script block early: orjson escapes nothing, so do it here.
    blob = orjson.dumps(config).decode().replace("</", "<\\/")
    return _SHELL.format(base=html.escape(base), version=NSQ_VERSION, host=html.escape(socket.gethostname()),
                         config=blob, assets=html.escape(assets))
