/* nsqadmin pages: a small hand-written script, no build step.
 *
 * The server sends the same HTML shell for every page; this script reads the path, fetches
 * the page's data from nsqadmin's /api and renders it. Each page has a static frame (title,
 * graph, forms: drawn once) and a live part (numbers and tables) redrawn every refresh_ms.
 * Actions (pause, unpause, empty, delete, tombstone, create) ask for confirmation in a modal
 * and then call the API; while the modal is open the live part is not redrawn.
 */
(function () {
  "use strict";
  var CFG = JSON.parse(document.getElementById("config").textContent);
  var BASE = CFG.base;
  var main = document.getElementById("main");
  var warningBar = document.getElementById("warning");
  var modal = document.getElementById("modal");
  var modalOpen = false;
  var timer = null;

  // --- formatting -----------------------------------------------------------------------
  function esc(s) {
    return String(s === undefined || s === null ? "" : s).replace(/[&<>"']/g, function (c) {
      return {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c];
    });
  }
  var GROUPED = new Intl.NumberFormat("en-US", {maximumFractionDigits: 0});  // one formatter: cheap per call
  function num(n) { return GROUPED.format(Number(n || 0)); }
  function rate(r) {
    r = Number(r || 0);
    return r < 100 ? r.toFixed(1) : GROUPED.format(Math.round(r));
  }
  function duration(ns) {
    var s = Math.floor(ns / 1e9), out = "";
    var d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60);
    if (d) out += d + "d";
    if (h || d) out += h + "h";
    if (m || h || d) out += m + "m";
    return out + (s % 60) + "s";
  }
  function latency(e2e) {
    if (!e2e || !e2e.percentiles || !e2e.percentiles.length) return '<span class="muted">–</span>';
    return e2e.percentiles.map(function (p) {
      var v = p.average, unit = "ns";
      if (v >= 1e9) { v /= 1e9; unit = "s"; } else if (v >= 1e6) { v /= 1e6; unit = "ms"; }
      else if (v >= 1e3) { v /= 1e3; unit = "µs"; }
      return '<span class="pct">p' + esc(+(p.quantile * 100).toFixed(2)) + " " + v.toFixed(1) + unit + "</span>";
    }).join(" ");
  }
  function url(path) { return BASE + path; }
  function enc(s) { return encodeURIComponent(s); }
  function stat(name, value, text) {
    return '<td class="n" data-stat="' + name + '" data-value="' + esc(value) + '">' +
      (text === undefined ? num(value) : text) + "</td>";
  }
  function badge(paused) { return paused ? ' <span class="badge paused">paused</span>' : ""; }
  // A table of class "grid": a header cell per name, the rows, or one muted row saying `empty`.
  function grid(heads, rows, empty, foot, cls) {
    return '<table class="grid' + (cls ? " " + cls : "") + '"><thead><tr>' +
      heads.map(function (h) { return "<th>" + h + "</th>"; }).join("") + "</tr></thead><tbody>" +
      (rows.join("") || '<tr><td colspan="' + heads.length + '" class="muted">' + empty + "</td></tr>") +
      "</tbody>" + (foot || "") + "</table>";
  }

  // A channel's queue figures and client count, one cell each (QUEUE_HEADS, then "Clients"),
  // from any object that has them: a channel, a channel on one node, a channel's total.
  function channelCells(c) {
    return stat("depth", c.depth) + stat("memory_depth", c.memory_depth) + stat("backend_depth", c.backend_depth) +
      stat("in_flight_count", c.in_flight_count) + stat("deferred_count", c.deferred_count) +
      stat("requeue_count", c.requeue_count) + stat("timeout_count", c.timeout_count) +
      stat("message_count", c.message_count) + stat("client_count", c.client_count);
  }

  // The columns of a node's or channel's queue figures, as every per-node table starts them.
  var QUEUE_HEADS = ["Depth", "Memory", "Disk", "In flight", "Deferred", "Requeued", "Timed out", "Messages"];

  function card(label, value, name, text) {
    return '<div class="card"><div class="label">' + esc(label) + '</div><div class="value" data-stat="' +
      name + '" data-value="' + esc(value) + '">' + (text === undefined ? num(value) : text) + "</div></div>";
  }

  // --- API ------------------------------------------------------------------------------
  function api(path, options) {
    return fetch(url("api/" + path), options || {}).then(function (r) {
      return r.text().then(function (text) {
        var body = {};
        try { body = text ? JSON.parse(text) : {}; } catch (e) { body = {message: text}; }
        if (!r.ok) throw new Error(body.message || ("HTTP " + r.status));
        return body;
      });
    });
  }
  function showWarnings(list) {
    var msgs = list.filter(function (m) { return m; });
    warningBar.hidden = !msgs.length;
    warningBar.textContent = msgs.join("\n");
  }
  function flash(text, bad) {
    var el = document.createElement("div");
    el.className = "flash" + (bad ? " bad" : "");
    el.textContent = text;
    document.body.appendChild(el);
    setTimeout(function () { el.remove(); }, 4000);
  }

  // --- confirmation modal and actions ---------------------------------------------------
  function confirmBox(text) {
    return new Promise(function (resolve) {
      document.getElementById("modal-text").textContent = text;
      modal.hidden = false;
      modalOpen = true;
      var ok = document.getElementById("modal-ok"), cancel = document.getElementById("modal-cancel");
      function done(answer) {
        modal.hidden = true;
        modalOpen = false;
        ok.onclick = cancel.onclick = null;
        resolve(answer);
      }
      ok.onclick = function () { done(true); };
      cancel.onclick = function () { done(false); };
    });
  }

  function runAction(btn) {
    var d = btn.dataset, topic = d.topic, channel = d.channel || "";
    var what = channel ? "channel " + topic + "/" + channel : "topic " + topic;
    var path = "topics/" + enc(topic) + (channel ? "/" + enc(channel) : "");
    var request, question, after = null;
    if (d.action === "delete") {
      question = "Delete " + what + "? Its messages are lost.";
      request = {method: "DELETE"};
      after = channel ? "topics/" + enc(topic) : "topics";
    } else if (d.action === "tombstone") {
      question = "Tombstone " + d.node + " for topic " + topic + "? The topic is deleted on that node.";
      path = "nodes/" + enc(d.node);
      request = {method: "DELETE", body: JSON.stringify({topic: topic})};
    } else {
      question = d.action.charAt(0).toUpperCase() + d.action.slice(1) + " " + what + "?" +
        (d.action === "empty" ? " Every queued message is dropped." : "");
      request = {method: "POST", body: JSON.stringify({action: d.action})};
    }
    confirmBox(question).then(function (yes) {
      if (!yes) return;
      request.headers = {"Content-Type": "application/json"};
      api(path, request).then(function (res) {
        flash(res.message || ("Done: " + d.action + " " + what), !!res.message);
        if (after) { location.href = url(after); } else { refresh(); }
      }, function (err) { flash(err.message, true); });
    });
  }
  document.addEventListener("click", function (ev) {
    var btn = ev.target.closest("button[data-action]");
    if (btn) { ev.preventDefault(); runAction(btn); }
  });

  function actionButtons(topic, channel, paused) {
    if (!CFG.is_admin) return "";
    var attrs = ' data-topic="' + esc(topic) + '"' + (channel ? ' data-channel="' + esc(channel) + '"' : "");
    return '<div class="actions">' +
      '<button class="btn" data-action="' + (paused ? "unpause" : "pause") + '"' + attrs + ">" +
      (paused ? "Unpause" : "Pause") + "</button>" +
      '<button class="btn warn" data-action="empty"' + attrs + ">Empty</button>" +
      '<button class="btn danger" data-action="delete"' + attrs + ">Delete</button></div>";
  }

  // --- rate graph (from nsqadmin's own sampling) ----------------------------------------
  function graph(points, label) {
    var W = 640, H = 150, P = 4;
    if (!points || points.length < 2) {
      return '<div class="graph empty">collecting samples for ' + esc(label) + "&hellip;</div>";
    }
    var t0 = points[0][0], t1 = points[points.length - 1][0];
    var peak = Math.max.apply(null, points.map(function (p) { return p[1]; }));
    var max = Math.max(peak, 1);
    var xy = points.map(function (p) {
      var x = P + (W - 2 * P) * (t1 > t0 ? (p[0] - t0) / (t1 - t0) : 1);
      var y = H - P - (H - 2 * P) * p[1] / max;
      return x.toFixed(1) + "," + y.toFixed(1);
    });
    var area = "M" + xy[0].split(",")[0] + "," + (H - P) + " L" + xy.join(" L") + " L" +
      xy[xy.length - 1].split(",")[0] + "," + (H - P) + " Z";
    var span = Math.round(t1 - t0);
    return '<div class="graph"><div class="graph-head"><span>' + esc(label) + '</span><span class="now" data-stat="rate">' +
      rate(points[points.length - 1][1]) + ' msg/s</span></div><svg viewBox="0 0 ' + W + " " + H +
      '" preserveAspectRatio="none"><path class="area" d="' + area + '"/><polyline class="line" points="' +
      xy.join(" ") + '"/></svg><div class="graph-foot"><span>−' + span + 's</span><span>peak ' + rate(peak) +
      ' msg/s</span><span>now</span></div></div>';
  }
  function sparkline(points) {
    if (!points || points.length < 2) return "";
    var W = 90, H = 22;
    var max = Math.max.apply(null, points.map(function (p) { return p[1]; }).concat([1]));
    var xy = points.map(function (p, i) {
      return (W * i / (points.length - 1)).toFixed(1) + "," + (H - 1 - (H - 2) * p[1] / max).toFixed(1);
    });
    return '<svg class="spark" viewBox="0 0 ' + W + " " + H + '"><polyline points="' + xy.join(" ") + '"/></svg>';
  }
  function graphite(topic, channel) {
    if (!CFG.graphite_url) return "";
    var host = CFG.statsd_prefix.replace("%s", "*");
    var key = host + ".topic." + topic + (channel ? ".channel." + channel : "") + ".message_count";
    var counter = CFG.statsd_counter_format ? CFG.statsd_counter_format.replace("%s", key) : key;
    var target = "summarize(sumSeries(" + counter + '),"' + CFG.statsd_interval + 'sec","sum")';
    var src = (CFG.proxy_graphite ? url("render") : CFG.graphite_url + "/render") +
      "?from=-2h&width=640&height=150&hideLegend=true&target=" + enc(target);
    return '<div class="graph graphite"><div class="graph-head"><span>graphite: message_count</span></div>' +
      '<img alt="graphite graph" src="' + esc(src) + '"></div>';
  }

  // --- pages ----------------------------------------------------------------------------
  var pages = {};

  pages.topics = {
    nav: "topics",
    frame: function () {
      return '<div class="head"><h1>Topics</h1><input id="filter" class="filter" placeholder="filter topics"></div>' +
        '<div id="live"></div>';
    },
    load: function () { return Promise.all([api("topics"), api("rates")]); },
    render: function (res) {
      var topics = res[0].topics, summary = res[1].topics || {};
      var f = (document.getElementById("filter") || {}).value || "";
      var rows = topics.filter(function (t) { return t.indexOf(f) >= 0; }).map(function (t) {
        var s = summary[t] || {};
        return '<tr data-topic="' + esc(t) + '"><td><a href="' + url("topics/" + enc(t)) + '">' + esc(t) +
          "</a>" + badge(s.paused) + "</td>" + stat("depth", s.depth) + stat("in_flight_count", s.in_flight_count) +
          stat("message_count", s.message_count) + stat("rate", s.rate || 0, rate(s.rate)) +
          stat("channels", s.channels) + stat("nodes", s.nodes) + "</tr>";
      });
      showWarnings([res[0].message, res[1].message]);
      return grid(["Topic", "Depth", "In flight", "Messages", "msg/s", "Channels", "Nodes"], rows, "no topics");
    }
  };

  pages.topic = {
    nav: "topics",
    frame: function (p) {
      return '<div class="crumbs"><a href="' + url("topics") + '">Topics</a> / </div>' +
        '<div class="head"><h1>' + esc(p.topic) + '</h1><span id="state"></span><div id="buttons"></div></div>' +
        '<div id="graph"></div>' + graphite(p.topic) + '<div id="live"></div>';
    },
    load: function (p) { return Promise.all([api("topics/" + enc(p.topic)), api("rates?topic=" + enc(p.topic))]); },
    render: function (res, p) {
      var t = res[0], rates = res[1];
      showWarnings([t.message]);
      document.getElementById("buttons").innerHTML = actionButtons(p.topic, "", t.paused);
      document.getElementById("state").innerHTML = badge(t.paused);
      document.getElementById("graph").innerHTML = graph(rates.topic, "messages published per second");
      var EXTRA = ["in_flight_count", "deferred_count", "requeue_count", "timeout_count"];
      function channelSums(channels) {  // a topic's in-flight, deferred, ... are its channels' sums
        return EXTRA.map(function (k) {
          var v = (channels || []).reduce(function (acc, c) { return acc + c[k]; }, 0);
          return stat(k, v);
        }).join("");
      }
      var nodes = (t.nodes || []).map(function (n) {
        var tomb = CFG.is_admin ? '<button class="btn small" data-action="tombstone" data-topic="' + esc(p.topic) +
          '" data-node="' + esc(n.node) + '">Tombstone</button>' : "";
        return '<tr data-node="' + esc(n.node) + '"><td><a href="' + url("nodes/" + enc(n.node)) + '">' +
          esc(n.hostname || n.node) + '</a> <span class="muted">' + esc(n.node) + "</span>" + badge(n.paused) +
          "</td>" + stat("depth", n.depth) + stat("memory_depth", n.memory_depth) +
          stat("backend_depth", n.backend_depth) + channelSums(n.channels) + stat("message_count", n.message_count) +
          '<td class="lat">' + latency(n.e2e_processing_latency) + "</td><td>" + tomb + "</td></tr>";
      });
      var channels = (t.channels || []).map(function (c) {
        return '<tr data-channel="' + esc(c.channel_name) + '"><td><a href="' +
          url("topics/" + enc(p.topic) + "/" + enc(c.channel_name)) + '">' + esc(c.channel_name) + "</a>" +
          badge(c.paused) + "</td>" + channelCells(c) + "<td>" + sparkline((rates.channels || {})[c.channel_name]) +
          '</td><td class="lat">' + latency(c.e2e_processing_latency) + "</td></tr>";
      });
      return '<div class="cards">' + card("Depth", t.depth, "depth") + card("In memory", t.memory_depth, "memory_depth") +
        card("On disk", t.backend_depth, "backend_depth") + card("Messages", t.message_count, "message_count") +
        card("Channels", (t.channels || []).length, "channels") + "</div>" +
        "<h2>Nodes</h2>" + grid(["Node"].concat(QUEUE_HEADS, ["E2E latency", ""]), nodes, "no producers",
          '<tfoot><tr data-node="*"><td>Total</td>' + stat("depth", t.depth) +
          stat("memory_depth", t.memory_depth) + stat("backend_depth", t.backend_depth) + channelSums(t.channels) +
          stat("message_count", t.message_count) + '<td class="lat">' + latency(t.e2e_processing_latency) +
          "</td><td></td></tr></tfoot>") +
        "<h2>Channels</h2>" + grid(["Channel"].concat(QUEUE_HEADS, ["Clients", "Rate", "E2E latency"]), channels,
          "no channels");
    }
  };

  pages.channel = {
    nav: "topics",
    frame: function (p) {
      return '<div class="crumbs"><a href="' + url("topics") + '">Topics</a> / <a href="' +
        url("topics/" + enc(p.topic)) + '">' + esc(p.topic) + "</a> / </div>" +
        '<div class="head"><h1>' + esc(p.channel) + '</h1><span id="state"></span><div id="buttons"></div></div>' +
        '<div id="graph"></div>' + graphite(p.topic, p.channel) + '<div id="live"></div>';
    },
    load: function (p) {
      return Promise.all([api("topics/" + enc(p.topic) + "/" + enc(p.channel)), api("rates?topic=" + enc(p.topic))]);
    },
    render: function (res, p) {
      var c = res[0], rates = res[1];
      showWarnings([c.message]);
      document.getElementById("buttons").innerHTML = actionButtons(p.topic, p.channel, c.paused);
      document.getElementById("state").innerHTML = badge(c.paused);
      document.getElementById("graph").innerHTML = graph((rates.channels || {})[p.channel],
        "messages delivered per second");
      var nodes = (c.nodes || []).map(function (n) {
        return '<tr data-node="' + esc(n.node) + '"><td><a href="' + url("nodes/" + enc(n.node)) + '">' +
          esc(n.hostname || n.node) + '</a> <span class="muted">' + esc(n.node) + "</span>" + badge(n.paused) +
          "</td>" + channelCells(n) + '<td class="lat">' + latency(n.e2e_processing_latency) + "</td></tr>";
      });
      var clients = (c.clients || []).map(function (k) {
        var comp = [k.deflate ? "deflate" : "", k.snappy ? "snappy" : ""].filter(Boolean).join(", ") || "none";
        var tls = k.tls ? esc(k.tls_version || "TLS") : "no";
        return '<tr data-client="' + esc(k.client_id) + '"><td>' + esc(k.node) + "</td><td>" + esc(k.client_id) +
          "</td><td>" + esc(k.hostname) + '<div class="muted">' + esc(k.remote_address) + "</div></td><td>" +
          esc(k.user_agent) + "</td><td>" + esc(k.version) + '</td><td data-stat="tls">' + tls +
          '</td><td data-stat="compression">' + comp + "</td>" + stat("ready_count", k.ready_count) +
          stat("in_flight_count", k.in_flight_count) + stat("finish_count", k.finish_count) +
          stat("requeue_count", k.requeue_count) + stat("message_count", k.message_count) +
          stat("connected", k.connected, duration(k.connected)) + "</tr>";
      });
      return '<div class="cards">' + card("Depth", c.depth, "depth") + card("In flight", c.in_flight_count, "in_flight_count") +
        card("Deferred", c.deferred_count, "deferred_count") + card("Requeued", c.requeue_count, "requeue_count") +
        card("Timed out", c.timeout_count, "timeout_count") + card("Messages", c.message_count, "message_count") +
        card("Clients", c.client_count, "client_count") + "</div>" +
        "<h2>Nodes</h2>" + grid(["Node"].concat(QUEUE_HEADS, ["Clients", "E2E latency"]), nodes, "no producers",
          '<tfoot><tr data-node="*"><td>Total</td>' + channelCells(c) + '<td class="lat">' +
          latency(c.e2e_processing_latency) + "</td></tr></tfoot>") +
        "<h2>Clients</h2>" + grid(["Node", "Client ID", "Host", "User agent", "Version", "TLS", "Compression", "RDY",
          "In flight", "Finished", "Requeued", "Messages", "Connected"], clients, "no clients");
    }
  };

  pages.nodes = {
    nav: "nodes",
    frame: function () {
      var up = CFG.lookupd.length ? "nsqlookupd: " + CFG.lookupd.map(esc).join(", ") : "nsqd: " + CFG.nsqd.map(esc).join(", ");
      return '<div class="head"><h1>Nodes</h1><span class="muted">' + up + '</span></div><div id="live"></div>';
    },
    load: function () { return api("nodes"); },
    render: function (res) {
      showWarnings([res.message]);
      var rows = res.nodes.map(function (n) {
        var address = n.broadcast_address + ":" + n.http_port;
        var chips = n.topics.map(function (t) {
          return '<a class="chip' + (t.tombstoned ? ' dead" title="tombstoned' : "") + '" href="' +
            url("topics/" + enc(t.topic)) + '">' + esc(t.topic) + "</a>";
        }).join(" ");
        return '<tr data-node="' + esc(address) + '"><td><a href="' + url("nodes/" + enc(address)) + '">' +
          esc(n.hostname) + "</a></td><td>" + esc(n.broadcast_address) + "</td>" + stat("tcp_port", n.tcp_port, n.tcp_port) +
          stat("http_port", n.http_port, n.http_port) + "<td>" + esc(n.version) +
          (n.out_of_date ? ' <span class="badge paused">out of date</span>' : "") + "</td>" +
          stat("topics", n.topics.length) + '<td class="chips">' + chips + "</td></tr>";
      });
      return grid(["Hostname", "Broadcast address", "TCP port", "HTTP port", "Version", "Topics", ""], rows,
        "no nodes");
    }
  };

  pages.node = {
    nav: "nodes",
    frame: function (p) {
      return '<div class="crumbs"><a href="' + url("nodes") + '">Nodes</a> / </div><div class="head"><h1>' +
        esc(p.node) + '</h1></div><div id="live"></div>';
    },
    load: function (p) { return api("nodes/" + enc(p.node)); },
    render: function (res) {
      showWarnings([res.message]);
      var rows = [];
      res.topics.forEach(function (t) {
        rows.push('<tr class="topic" data-topic="' + esc(t.topic_name) + '"><td><a href="' +
          url("topics/" + enc(t.topic_name)) + '">' + esc(t.topic_name) + "</a>" + badge(t.paused) + "</td>" +
          stat("depth", t.depth) + stat("memory_depth", t.memory_depth) + stat("backend_depth", t.backend_depth) +
          "<td></td><td></td><td></td><td></td>" + stat("message_count", t.message_count) + "<td></td></tr>");
        t.channels.forEach(function (c) {
          rows.push('<tr class="sub" data-channel="' + esc(t.topic_name + "/" + c.channel_name) + '"><td><a href="' +
            url("topics/" + enc(t.topic_name) + "/" + enc(c.channel_name)) + '">' + esc(c.channel_name) + "</a>" +
            badge(c.paused) + "</td>" + channelCells(c) + "</tr>");
        });
      });
      return '<div class="cards">' + card("Messages", res.total_messages, "total_messages") +
        card("Clients", res.total_clients, "total_clients") + card("Topics", res.topics.length, "topics") + "</div>" +
        grid(["Topic / channel"].concat(QUEUE_HEADS, ["Clients"]), rows, "no topics");
    }
  };

  var lastCount = null;
  pages.counter = {
    nav: "counter",
    frame: function () {
      return '<div class="head"><h1>Counter</h1><span class="muted">messages handled by every channel of the cluster</span></div><div id="live"></div>';
    },
    load: function () { return api("counter"); },
    render: function (res) {
      showWarnings([res.message]);
      var total = 0, now = Date.now() / 1000;
      Object.keys(res.stats).forEach(function (k) { total += res.stats[k].message_count; });
      var r = lastCount && now > lastCount[0] ? Math.max(0, (total - lastCount[1]) / (now - lastCount[0])) : 0;
      lastCount = [now, total];
      var per = {};
      Object.keys(res.stats).forEach(function (k) {
        var s = res.stats[k], key = s.topic_name + "/" + s.channel_name;
        per[key] = (per[key] || 0) + s.message_count;
      });
      var rows = Object.keys(per).sort().map(function (k) {
        return '<tr data-channel="' + esc(k) + '"><td>' + esc(k) + "</td>" + stat("message_count", per[k]) +
          '<td class="bar-cell"><div class="share" style="width:' + (total ? (100 * per[k] / total).toFixed(1) : 0) +
          '%"></div></td></tr>';
      });
      return '<div class="counter"><div class="big" data-stat="total" data-value="' + total + '">' + num(total) +
        '</div><div class="muted">messages processed</div><div class="rate" data-stat="rate">' + rate(r) +
        " msg/s</div></div>" + (rows.length ? grid(["Topic / channel", "Messages", "Share"], rows, "") : "");
    }
  };

  pages.lookup = {
    nav: "lookup",
    frame: function () {
      var form = CFG.is_admin ? '<form id="create" class="create"><h2>Create a topic or channel</h2>' +
        '<input name="topic" placeholder="topic" required> <input name="channel" placeholder="channel (optional)"> ' +
        '<button class="btn primary" type="submit">Create</button><p class="muted">Registers the topic (and channel) ' +
        "with every nsqlookupd, so nsqd nodes create it when the topic first appears on them.</p></form>" : "";
      return '<div class="head"><h1>Lookup</h1><span class="muted">nsqlookupd: ' +
        (CFG.lookupd.map(esc).join(", ") || "none (nsqd mode)") + "</span></div>" + form + '<div id="live"></div>';
    },
    load: function () { return Promise.all([api("topics"), api("topics?inactive=true")]); },
    render: function (res) {
      showWarnings([res[0].message]);
      var inactive = res[1].topics || {};
      var names = Object.keys(inactive).sort();
      var rows = names.map(function (t) {
        var chans = (inactive[t] || []).map(function (c) {
          return '<span class="chip">' + esc(c) + (CFG.is_admin ? ' <button class="x" data-action="delete" data-topic="' +
            esc(t) + '" data-channel="' + esc(c) + '" title="delete channel">×</button>' : "") + "</span>";
        }).join(" ");
        return '<tr data-topic="' + esc(t) + '"><td>' + esc(t) + "</td><td>" + (chans || '<span class="muted">–</span>') +
          "</td><td>" + (CFG.is_admin ? '<button class="btn small danger" data-action="delete" data-topic="' + esc(t) +
          '">Delete</button>' : "") + "</td></tr>";
      });
      var all = res[0].topics.map(function (t) { return '<a class="chip" href="' + url("topics/" + enc(t)) + '">' + esc(t) + "</a>"; });
      return "<h2>Topics without producers</h2>" + grid(["Topic", "Channels", ""], rows, "none", "", "plain") +
        '<h2>All topics</h2><div class="chips">' + (all.join(" ") || '<span class="muted">none</span>') + "</div>";
    }
  };

  // Numeric columns are right-aligned; their headers follow the first row's cells.
  function alignHeaders(root) {
    root.querySelectorAll("table.grid").forEach(function (table) {
      var row = table.querySelector("tbody tr");
      if (!row) return;
      table.querySelectorAll("thead th").forEach(function (th, i) {
        var td = row.children[i];
        th.classList.toggle("n", !!td && td.classList.contains("n"));
      });
    });
  }

  // --- routing and refresh --------------------------------------------------------------
  function parse() {
    var rest = location.pathname.slice(BASE.length).replace(/\/+$/, "");
    var parts = rest ? rest.split("/").map(decodeURIComponent) : [];
    if (!parts.length || (parts[0] === "topics" && parts.length === 1)) return ["topics", {}];
    if (parts[0] === "topics" && parts.length === 2) return ["topic", {topic: parts[1]}];
    if (parts[0] === "topics") return ["channel", {topic: parts[1], channel: parts[2]}];
    if (parts[0] === "nodes" && parts.length === 2) return ["node", {node: parts[1]}];
    return [parts[0], {}];
  }
  var route = parse(), page = pages[route[0]] || pages.topics, params = route[1];

  function refresh() {
    if (modalOpen) return;
    page.load(params).then(function (data) {
      var live = document.getElementById("live");
      if (live && !modalOpen) {
        live.innerHTML = page.render(data, params);
        alignHeaders(main);
      }
      document.body.dataset.loaded = String(Number(document.body.dataset.loaded || 0) + 1);
    }, function (err) {
      showWarnings([err.message]);
      document.body.dataset.loaded = String(Number(document.body.dataset.loaded || 0) + 1);
    });
  }

  main.innerHTML = page.frame(params);
  var navLink = document.querySelector('[data-nav="' + page.nav + '"]');
  if (navLink) navLink.classList.add("active");
  var filter = document.getElementById("filter");
  if (filter) filter.addEventListener("input", refresh);
  var form = document.getElementById("create");
  if (form) {
    form.addEventListener("submit", function (ev) {
      ev.preventDefault();
      var body = {topic: form.topic.value.trim(), channel: form.channel.value.trim()};
      api("topics", {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)})
        .then(function (res) {
          flash(res.message || "Created " + body.topic + (body.channel ? "/" + body.channel : ""), !!res.message);
          form.reset();
          refresh();
        }, function (err) { flash(err.message, true); });
    });
  }
  refresh();
  timer = setInterval(refresh, CFG.refresh_ms);
  window.nsqadmin = {refresh: refresh, timer: timer};
})();
