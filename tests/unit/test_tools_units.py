"""The utilities' pure parts: destination choice, pacing, file naming and rotation, option
mapping, JSON filters, nsq_stat's sums and columns."""

from __future__ import annotations

import gzip
import io
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest
import trustme

from pynsqd.client import TLSOptions
from pynsqd.options import UsageError
from pynsqd.tools.common import consumer_options, producer_options
from pynsqd.tools.filelog import FileLog, FileLogConfig
from pynsqd.tools.nsq_stat import channel_totals, format_row
from pynsqd.tools.nsq_to_nsq import Options as NsqToNsqOptions
from pynsqd.tools.nsq_to_nsq import transform
from pynsqd.tools.to_nsq import REPORT_EVERY, Pacer, Progress
from pynsqd.tools.upstream import INITIAL_RETRY, Upstreams


def test_round_robin_multicast_and_hostpool_failover() -> None:
    rr = Upstreams(["a", "b", "c"], "round-robin")
    assert [rr.pick(0)[0] for _ in range(6)] == ["a", "b", "c", "a", "b", "c"]
    assert Upstreams(["a", "b"], "multicast").pick(0) == ["a", "b"]
    hp = Upstreams(["a", "b"], "hostpool")
    assert hp.pick(0) == ["a"]
    hp.failure("a", now=10)
    assert hp.pick(11) == ["b"]
    assert hp.pick(10 + INITIAL_RETRY) == ["a"]  # retried after the interval
    hp.failure("a", now=100)
    hp.failure("b", now=100)
    assert hp.pick(101) == ["b"]  # all dead: the one back soonest (a's retry doubled)
    with pytest.raises(ValueError):
        Upstreams(["a"], "random")


def test_to_nsq_progress_never_looks_like_the_final_count() -> None:
    """Progress while reading says "so far", only when the count moved; the final count is one line."""
    progress = Progress(now=0.0)
    assert progress.line(REPORT_EVERY - 1, 10) is None
    assert progress.line(REPORT_EVERY, 299) == "299 messages published so far"
    assert progress.line(2 * REPORT_EVERY + 1, 299) is None  # nothing new to say
    assert progress.final(300) == "published 300 messages"


def test_pacer_in_virtual_time() -> None:
    pacer = Pacer(rate=4, start=0.0)
    now, sent = 0.0, []
    for _ in range(9):
        now += pacer.delay(now)
        sent.append(now)
    assert sent == [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0]
    assert Pacer(rate=0, start=0).delay(5.0) == 0.0


def test_filelog_names_rev_and_size_rotation(tmp_path: Path) -> None:
    cfg = FileLogConfig(output_dir=str(tmp_path / "out"), filename_format="<TOPIC>.<HOST><REV>.<DATETIME>.log",
                        datetime_format="%Y", host_identifier="<SHORT_HOST>-x", rotate_size=10)
    log = FileLog("t", cfg)
    now = time.time()
    year = time.strftime("%Y", time.localtime(now))
    short = os.uname().nodename.split(".")[0]
    log.write(b"12345", now)
    assert not log.needs_rotation(now)
    log.write(b"6789", now)
    assert log.needs_rotation(now)  # 10 bytes with newlines
    assert os.listdir(cfg.output_dir) == [f".t.{short}-x.{year}.log.tmp"]  # hidden while in progress
    first = log.close(now)
    log.write(b"again", now)
    second = log.close(now)
    assert first and second
    assert [os.path.basename(first), os.path.basename(second)] == [f"t.{short}-x.{year}.log",
                                                                   f"t.{short}-x-1.{year}.log"]
    assert Path(first).read_bytes() == b"12345\n6789\n" and Path(second).read_bytes() == b"again\n"
    assert sorted(os.listdir(cfg.output_dir)) == sorted(os.path.basename(p) for p in (first, second))


def test_filelog_gzip_sync_is_readable_and_time_rotation(tmp_path: Path) -> None:
    cfg = FileLogConfig(output_dir=str(tmp_path), filename_format="<TOPIC><REV>.log", gzip=True,
                        rotate_interval=60, skip_empty_files=True)
    log = FileLog("g", cfg)
    log.write(b"a", 1000.0)
    log.sync()
    synced = (tmp_path / ".g.log.gz.tmp").read_bytes()  # a synced gzip stream reads back so far
    assert gzip.GzipFile(fileobj=io.BytesIO(synced)).read1(100) == b"a\n"
    assert not log.needs_rotation(1059.0) and log.needs_rotation(1060.0)
    final = log.close(1060.0)
    assert final is not None and final.endswith("g.log.gz")
    assert gzip.decompress(Path(final).read_bytes()) == b"a\n"
    log.open(1061.0)
    assert log.close(1062.0) is None  # empty and skip-empty-files: nothing left behind
    assert os.listdir(tmp_path) == ["g.log.gz"]


def test_consumer_opt_mapping() -> None:
    kw = consumer_options(["max_attempts,10", "lookupd_poll_interval,15s", "heartbeat_interval,5s",
                           "backoff_multiplier,250ms", "tls_v1,false", "read_timeout,60s"])
    assert kw["max_attempts"] == 10 and kw["lookupd_poll_interval"] == 15.0 and kw["backoff_multiplier"] == 0.25
    assert kw["identity"].heartbeat_interval == 5000
    assert kw["tls_v1"] is False and "tls_options" not in kw
    with pytest.raises(UsageError, match="unknown option"):
        consumer_options(["nope,1"])
    with pytest.raises(UsageError, match="invalid value"):
        consumer_options(["max_attempts,many"])


def test_consumer_opt_tls_compression_and_auth(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    trustme.CA().cert_pem.write_to_path(str(ca))
    kw = consumer_options(["tls_v1", f"tls_root_ca_file,{ca}", "tls_insecure_skip_verify,true",
                           "tls_min_version,tls1.2", "deflate,true", "deflate_level,3", "auth_secret,s3cr,et"])
    assert kw["tls_v1"] is True and kw["deflate"] is True and kw["deflate_level"] == 3
    assert kw["tls_options"] == TLSOptions(root_ca_file=str(ca), insecure_skip_verify=True, min_version="tls1.2")
    assert kw["auth_secret"] == "s3cr,et"  # the value is everything after the first comma
    assert consumer_options(["snappy,false", "deflate,true"])["snappy"] is False
    for pairs, match in [(["snappy", "deflate"], "snappy and deflate"), (["deflate_level,10"], r"\[1,9\]"),
                         (["tls_v1", "tls_root_ca_file,/nonexistent"], "tls_root_ca_file"),
                         (["tls_v1", f"tls_cert,{ca}"], "tls_cert and tls_key"),
                         (["tls_v1", "tls_min_version,ssl3.0"], "tls_min_version"),
                         (["snappy,maybe"], "invalid value")]:
        with pytest.raises(UsageError, match=match):
            consumer_options(pairs)
    pkw = producer_options(["max_attempts,3", "snappy", "dial_timeout,2s", "client_id,me"])
    assert set(pkw) == {"snappy", "connect_timeout", "identity"} and pkw["identity"].client_id == "me"


def test_json_filters() -> None:
    opts = NsqToNsqOptions(require_json_field="k", require_json_value="yes", whitelist_json_fields=["a"])
    assert transform(b'{"k": "yes", "a": 1, "b": 2}', opts) == b'{"a":1}'
    assert transform(b'{"k": "no", "a": 1}', opts) is None
    assert transform(b'{"a": 1}', opts) is None
    assert transform(b"not json", opts) is None
    assert transform(b"anything", NsqToNsqOptions()) == b"anything"
    flags = NsqToNsqOptions(require_json_field="ok", require_json_value="true")
    assert transform(b'{"ok": true}', flags) == b'{"ok": true}'


def test_nsq_stat_sums_nodes_and_formats_columns() -> None:
    node = {"topics": [{"topic_name": "t", "channels": [
        {"channel_name": "c", "depth": 10, "backend_depth": 4, "in_flight_count": 2, "deferred_count": 1,
         "requeue_count": 5, "timeout_count": 1, "message_count": 100, "client_count": 2},
        {"channel_name": "other", "depth": 99}]}]}
    totals = channel_totals([node, node, None], "t", "c")
    assert totals is not None
    assert totals["depth"] == 20 and totals["memory_depth"] == 12 and totals["backend_depth"] == 8
    # NSQ v1.3's "%7d %7d | %7d %7d %7d %5d %5d | %7d %7d %12d %7d": ingress is the message_count
    # difference per second of --interval, egress that minus the depth difference, truncated
    before = {**totals, "message_count": 100, "depth": 27}
    assert format_row(totals, before, 2.0) == \
        "     50      53 |      20      12       8     4     2 |      10       2          200       4"
    assert format_row(totals, {**before, "depth": 10}, 3.0).startswith("     33      30 |")
    assert channel_totals([node], "t", "nosuch") is None


def test_filelog_work_dir_on_another_file_system(tmp_path: Path) -> None:
    if not os.path.isdir("/dev/shm") or os.stat("/dev/shm").st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on a file system other than the test's tmp dir")
    work = tempfile.mkdtemp(dir="/dev/shm", prefix="pynsqd-test-")
    try:
        log = FileLog("x", FileLogConfig(output_dir=str(tmp_path), work_dir=work, filename_format="<TOPIC><REV>.log"))
        log.write(b"line", 0.0)
        final = log.close(0.0)
        assert final == str(tmp_path / "x.log") and Path(final).read_bytes() == b"line\n"
        assert os.listdir(work) == [] and os.listdir(tmp_path) == ["x.log"]
    finally:
        shutil.rmtree(work)
