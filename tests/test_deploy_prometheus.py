"""deploy/prometheus and deploy/grafana, checked by Prometheus itself.

- ``promtool check config`` / ``check rules`` accept the scrape config and the rules, and
  ``promtool test rules`` runs the rules' own unit tests (each alert fires on its case);
- a real Prometheus (Debian's ``prometheus``) with that config and those rules scrapes a real
  two-shard node under traffic: every metric the rules name is scraped, every rule evaluates
  without error, and every query of the Grafana dashboard returns data.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from testbed.harness import Daemon, remove_segments, scaled, wait_for
from tests.support.rawclient import RawClient

ROOT = Path(__file__).resolve().parent.parent
PROMETHEUS = ROOT / "deploy" / "prometheus"
RULES = PROMETHEUS / "rules" / "pynsqd.rules.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "pynsqd-dashboard.json"

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    shutil.which("promtool") is None or shutil.which("prometheus") is None,
    reason="Prometheus is not installed (Debian package prometheus; scripts/setup installs it as root)")]


def promtool(*args: str, cwd: Path = PROMETHEUS) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, cwd=cwd, timeout=scaled(120))


def test_promtool_checks_config_and_rules() -> None:
    done = promtool("check", "config", "prometheus.yml")
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr
    done = promtool("check", "rules", str(RULES))
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr


def test_promtool_unit_tests_every_alert() -> None:
    done = promtool("test", "rules", "pynsqd.rules.test.yml", cwd=RULES.parent)
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr
    tested = set(re.findall(r"alertname: (\w+)", (RULES.parent / "pynsqd.rules.test.yml").read_text()))
    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r}
    assert alerts == tested, "every alert has a unit test"


# --- a real Prometheus scraping a real node --------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target of the dashboard, Grafana's variables filled in
    as Grafana does for "All" (the variables' allValue) and a rate interval for 1 s scrapes."""
    doc = json.loads(DASHBOARD.read_text())
    out = []
    for panel in doc["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$__rate_interval", "10s")
            expr = expr.replace("$instance", ".+").replace("$topic", ".+")
            out.append((panel["title"], expr))
    for var in doc["templating"]["list"]:
        if var["type"] == "query":
            m = re.fullmatch(r"label_values\((.*), (\w+)\)", var["definition"])
            assert m is not None, var["definition"]
            out.append((f"variable {var['name']}", m.group(1).replace("$instance", ".+")))
    return out


def rule_metric_names() -> set[str]:
    """The scraped metrics the rules read (not the recording rules' own ``nsq:`` names)."""
    names: set[str] = set()
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            names |= set(re.findall(r"\b(nsq_[a-z0-9_]+|up)\b", rule["expr"]))
    return names


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Daemon]:
    (tmp_path / "data").mkdir()
    daemon = Daemon("pynsqd.supervisor", ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                                          f"--data-path={tmp_path / 'data'}", "--shards=2",
                                          "--e2e-processing-latency-percentile=0.99",
                                          "--e2e-processing-latency-window-time=1m"])
    try:
        yield daemon.start()
    finally:
        daemon.stop()
        remove_segments([daemon])


@pytest.fixture
def prometheus(tmp_path: Path, node: Daemon) -> Iterator[str]:
    """Prometheus on a free port with deploy/prometheus/prometheus.yml and its rules, scraping
    ``node`` every second (the only changes: intervals, and where the files are)."""
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config["rule_files"] = [str(PROMETHEUS / f) for f in config["rule_files"]]
    targets = tmp_path / "nsqd.yml"
    host, port = node.http
    targets.write_text(yaml.safe_dump([{"targets": [f"{host}:{port}"]}]))
    (job,) = config["scrape_configs"]
    job["file_sd_configs"] = [{"files": [str(targets)]}]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    address = f"127.0.0.1:{free_port()}"
    log = open(tmp_path / "prometheus.log", "wb")
    proc = subprocess.Popen(["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address={address}"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://{address}"
    try:
        def ready() -> bool:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-3000:]
            try:
                return httpx.get(f"{url}/-/ready", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False
        wait_for(ready, 60, interval=0.2, what="Prometheus ready")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(scaled(30))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def query(url: str, expr: str) -> list[Any]:
    reply = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert reply["status"] == "success", (expr, reply)
    return list(reply["data"]["result"])


def test_real_prometheus_scrapes_a_node_and_every_dashboard_query_has_data(node: Daemon, prometheus: str) -> None:
    producer = RawClient(node.tcp)  # a TCP producer that stays connected: nsq_client_published_messages
    consumers = []
    for topic in ("orders", "clicks"):  # two topics: one per shard
        consumer = RawClient(node.tcp)
        producer.send(f"PUB {topic}\n".encode() + (1).to_bytes(4, "big") + b"x")
        producer.expect_ok()
        consumer.subscribe(topic, "archive", rdy=1000)
        consumers.append(consumer)
    queries = dashboard_queries()
    names = rule_metric_names()
    missing: list[str] = []

    def traffic_then_check() -> bool:
        for topic, consumer in zip(("orders", "clicks"), consumers):
            producer.send(f"PUB {topic}\n".encode() + (5).to_bytes(4, "big") + b"hello")
            producer.expect_ok()
            httpx.post(f"{node.http_url}/pub", params={"topic": topic}, content=b"over http")
            for _ in range(2):
                consumer.send(b"FIN " + consumer.read_message().id + b"\n")
        missing[:] = [name for name in sorted(names) if not query(prometheus, f"count({name})")]
        missing.extend(f"{title}: {expr}" for title, expr in queries if not query(prometheus, expr))
        return not missing

    try:
        wait_for(traffic_then_check, 90, interval=0.5, what="data for every rule metric and dashboard query")
    except AssertionError as exc:
        raise AssertionError(f"no data for: {missing}") from exc
    finally:
        producer.close()
        for consumer in consumers:
            consumer.close()
    rules = httpx.get(f"{prometheus}/api/v1/rules", timeout=10).json()["data"]["groups"]
    evaluated = [r for g in rules for r in g["rules"]]
    assert len(evaluated) == sum(len(g["rules"]) for g in yaml.safe_load(RULES.read_text())["groups"])
    assert all(r["health"] == "ok" for r in evaluated), [(r["name"], r.get("lastError")) for r in evaluated]
    # the node's own storage figures are the file systems' (the disk alerts read them)
    data = query(prometheus, 'nsq_filesystem_size_bytes{volume="data"}')
    assert data and float(data[0]["value"][1]) > 0
    assert query(prometheus, 'nsq:filesystem_used:ratio{volume="shm"} >= 0 <= 1')
    # nothing alerts on a healthy node
    assert query(prometheus, "ALERTS") == []


def test_dashboard_is_well_formed() -> None:
    doc = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    for panel in doc["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"] and all(t["expr"].strip() for t in panel["targets"]), panel["title"]
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24, panel["title"]
