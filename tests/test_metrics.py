"""`hctx metrics`: every number of a record is its series, a withheld one is no series, a refused
record exports nothing and is counted, and the exposition is served (HTTP, TLS) or written
(atomically, repeatedly) from the catalog as it is at that moment."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
from pathlib import Path
from typing import Any

import pytest
from guard_factory import wire
from hostile import numbers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from readers_catalog import HOST, HOUR, NOW, hctx, put_claim, put_record
from test_readers_hostile import BAD_RECORDS, JUNK_CATALOG_NAMES, junk_catalog

from guard.projection import headroom_tokens
from tests.prometheus_tools import dead, exporter_of, exposition, get, of, parse, start_exporter, stop
from tests.wrapping import wait_for
from wrapper.readers.metrics import DEFAULT_LISTEN, READINGS, listen_address
from wrapper.readers.metrics import exposition as render
from wrapper.readers.roster import collect_roster


def scrape(catalog: Path, now: int = NOW) -> dict[str, Any]:
    return parse(exposition(catalog, now, HOST))


# The spec's Exposure example (tests/guard_factory.py) as series: model and cost are null there.
SPEC_SERIES = {
    "hctx_context_used_tokens": 92283,
    "hctx_context_window_tokens": 258400,
    "hctx_context_used_percent": 33,
    "hctx_context_compactions_total": 3,
    "hctx_context_last_compaction_timestamp_seconds": 1788000097.29,
    "hctx_session_tokens_total": 2235329,
    "hctx_context_observed_timestamp_seconds": 1788000100.0,
    "hctx_rate_limit_used_percent:five_hour": 31,
    "hctx_rate_limit_used_percent:seven_day": 55,
    "hctx_context_stale": 0,
    "hctx_agent_running": 1,
}


def test_every_number_of_the_record_is_its_series_and_nothing_else(tmp_path: Path) -> None:
    put_record(tmp_path, "alice")
    put_claim(tmp_path, "alice", desiredState="running")
    samples = scrape(tmp_path)
    assert of(samples, "alice") == SPEC_SERIES
    labels = {dict(key[1]).get("harness") for key in samples if dict(key[1]).get("agent") == "alice"}
    assert labels == {"codex"}
    assert samples["hctx_catalog_agents", ()] == 1 and samples["hctx_catalog_unreadable", ()] == 0


def test_the_compaction_point_and_its_headroom_are_gauges_only_where_the_harness_states_one(tmp_path: Path) -> None:
    put_record(tmp_path, "alice", compactAtTokens=160_000)
    put_claim(tmp_path, "alice", desiredState="running")
    samples = scrape(tmp_path)
    assert of(samples, "alice") == {
        **SPEC_SERIES, "hctx_context_compact_at_tokens": 160_000, "hctx_context_headroom_tokens": 160_000 - 92283,
    }  # fmt: skip
    put_record(tmp_path, "alice", compactAtTokens=160_000, usedTokens=None)  # no reading: no headroom
    assert "hctx_context_headroom_tokens" not in of(scrape(tmp_path), "alice")


def test_the_prompt_cache_is_its_gauges_each_only_where_the_harness_states_it(tmp_path: Path) -> None:
    """Issue 37: warm 0/1, when it goes cold, what a re-cache writes; no sample for a figure not stated,
    and none at all for a harness that states no cache (the spec example)."""
    cache = {"warm": True, "ttl": "5m", "expiresAtMs": NOW + 192_500, "recacheTokensIfCold": 754_995}
    put_record(tmp_path, "alice", harness="claude", promptCache=cache)
    put_claim(tmp_path, "alice", desiredState="running")
    put_record(tmp_path, "cold", harness="claude", promptCache={"warm": False, "expiresAtMs": None})
    put_record(tmp_path, "bob")
    samples = scrape(tmp_path)
    assert of(samples, "alice") == {
        **SPEC_SERIES, "hctx_prompt_cache_warm": 1, "hctx_prompt_cache_recache_tokens": 754_995,
        "hctx_prompt_cache_expires_timestamp_seconds": (NOW + 192_500) / 1000,
    }  # fmt: skip
    cold = of(samples, "cold")
    assert cold["hctx_prompt_cache_warm"] == 0
    assert "hctx_prompt_cache_expires_timestamp_seconds" not in cold and "hctx_prompt_cache_recache_tokens" not in cold
    assert not any(name.startswith("hctx_prompt_cache") for name in of(samples, "bob"))


NULLABLE = {
    "compactAtTokens": ["hctx_context_compact_at_tokens"],
    "usedTokens": ["hctx_context_used_tokens"],
    "windowTokens": ["hctx_context_window_tokens"],
    "usedPercent": ["hctx_context_used_percent"],
    "sessionTotalTokens": ["hctx_session_tokens_total"],
    "lastCompactionMs": ["hctx_context_last_compaction_timestamp_seconds"],
    "rateLimits": ["hctx_rate_limit_used_percent:five_hour", "hctx_rate_limit_used_percent:seven_day"],
}


@pytest.mark.parametrize("key", sorted(NULLABLE))
def test_a_withheld_value_is_no_sample_never_a_zero(tmp_path: Path, key: str) -> None:
    put_record(tmp_path, "alice", **{key: None})
    put_claim(tmp_path, "alice", desiredState="running")
    expected = {name: value for name, value in SPEC_SERIES.items() if name not in NULLABLE[key]}
    assert of(scrape(tmp_path), "alice") == expected


def test_one_withheld_rate_window_leaves_the_other(tmp_path: Path) -> None:
    put_record(tmp_path, "alice", rateLimits={"fiveHour": None, "sevenDay": 55})
    series = of(scrape(tmp_path), "alice")
    assert "hctx_rate_limit_used_percent:five_hour" not in series
    assert series["hctx_rate_limit_used_percent:seven_day"] == 55


def test_model_and_cost_an_overrun_and_a_stale_reading(tmp_path: Path) -> None:
    put_record(tmp_path, "pi", harness="pi", usedPercent=113.75, costUsd=36.8, model="fake-32k",
               observedAtMs=NOW - HOUR)  # fmt: skip
    samples = scrape(tmp_path)
    series = of(samples, "pi")
    assert series["hctx_context_used_percent"] == 113.75  # never clamped
    assert series["hctx_session_cost_usd_total"] == 36.8
    assert series["hctx_context_stale"] == 1 and series["hctx_context_used_tokens"] == 92283
    info = [dict(labels) for name, labels in samples if name == "hctx_model_info"]
    assert info == [{"agent": "pi", "harness": "pi", "host": HOST, "model": "fake-32k"}]
    assert samples["hctx_model_info", tuple(sorted(info[0].items()))] == 1
    assert all("model" not in dict(labels) for name, labels in samples if name != "hctx_model_info")


def test_a_model_json_spells_but_utf_8_cannot_is_a_refused_record_not_a_crash(tmp_path: Path) -> None:
    put_record(tmp_path, "odd", raw=json.dumps(wire(model='\ud800\n"x')).encode())
    put_record(tmp_path, "good")
    out = tmp_path / "hctx.prom"
    done = hctx("metrics", "--catalog", str(tmp_path), "--host", HOST, "--textfile", str(out))
    assert done.returncode == 0 and "Traceback" not in done.stderr
    samples = parse(out.read_text())
    assert of(samples, "odd") == {} and of(samples, "good")["hctx_context_used_tokens"] == 92283
    assert samples["hctx_catalog_unreadable", ()] == 1 and "lone surrogate" in done.stderr


def test_a_relaunch_claim_leaves_the_agent_no_reading_series(tmp_path: Path) -> None:
    """The claim removed the record: the agent is there (running), its previous fill is not."""
    put_claim(tmp_path, "alice", desiredState="running")
    samples = scrape(tmp_path)
    assert of(samples, "alice") == {"hctx_agent_running": 1}
    assert samples["hctx_catalog_agents", ()] == 1 and samples["hctx_catalog_unreadable", ()] == 0


@pytest.mark.parametrize("name", sorted(BAD_RECORDS))
def test_a_refused_record_exports_nothing_and_is_counted(tmp_path: Path, name: str) -> None:
    put_record(tmp_path, "bad", raw=BAD_RECORDS[name])
    put_record(tmp_path, "good")
    samples = scrape(tmp_path)
    assert of(samples, "bad") == {}
    assert of(samples, "good")["hctx_context_used_tokens"] == 92283
    assert samples["hctx_catalog_unreadable", ()] == 1 and samples["hctx_catalog_agents", ()] == 2


FIELDS = st.fixed_dictionaries(
    {},
    optional={key: numbers for key in ("usedTokens", "windowTokens", "usedPercent", "costUsd", "compactions",
                                       "sessionTotalTokens", "lastCompactionMs", "observedAtMs", "compactAtTokens")}
    | {"rateLimits": st.none() | st.fixed_dictionaries({}, optional={"fiveHour": numbers, "sevenDay": numbers})},
)  # fmt: skip
FLAGS = {"hctx_context_stale", "hctx_agent_running"}


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(fields=FIELDS)
def test_no_series_value_is_other_than_the_records_own(tmp_path: Path, fields: dict[str, Any]) -> None:
    catalog = tmp_path / str(time.monotonic_ns())
    put_record(catalog, "x", **fields)
    raw = wire(**fields)
    (row,) = collect_roster(catalog, NOW, here=HOST, alive=dead).rows
    series = of(scrape(catalog), "x")
    if row.context is None:
        assert series == {}
        return
    for family, key, divisor in READINGS:
        value = (
            headroom_tokens(raw["compactAtTokens"], raw["usedTokens"]) if key == "headroomTokens" else raw[key]
        )  # derived, as the reader does
        assert series.get(family.sample) == (None if value is None else value / divisor), family.sample
    for window in ("fiveHour", "sevenDay"):
        published = (raw["rateLimits"] or {}).get(window)
        label = {"fiveHour": "five_hour", "sevenDay": "seven_day"}[window]
        assert series.get(f"hctx_rate_limit_used_percent:{label}") == published
    assert {name for name in series if name in FLAGS} == {"hctx_context_stale"}


def test_a_junk_catalog_as_a_process_gives_no_traceback_and_no_number(tmp_path: Path) -> None:
    catalog, out = tmp_path / "catalog", tmp_path / "hctx.prom"
    junk_catalog(catalog)
    done = hctx("metrics", "--catalog", str(catalog), "--host", HOST, "--textfile", str(out))
    assert done.returncode == 0 and "Traceback" not in done.stderr
    samples = parse(out.read_text())
    refused = (*JUNK_CATALOG_NAMES, "ahead", "dir", "fifo", "link")
    for name in refused:
        assert of(samples, name) == {}, name
        assert f"box/{name}: context record" in done.stderr, name
    assert of(samples, "good")["hctx_context_used_tokens"] == 92283
    assert samples["hctx_catalog_unreadable", ()] == len(refused)
    assert samples["hctx_catalog_readable", ()] == 1


def test_an_unreadable_catalog_is_readable_0_and_nothing_else_warned_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "catalog").write_text("not a directory")
    exporter = exporter_of(tmp_path / "catalog", NOW, HOST)
    for _ in range(2):
        samples = {name: value for (name, _), value in parse(render(exporter)).items() if name.startswith("hctx_c")}
        assert samples == {"hctx_catalog_readable": 0}
    assert capsys.readouterr().err.count("cannot read the catalog") == 1


def test_a_missing_catalog_reads_0_until_it_appears(tmp_path: Path) -> None:
    """Like the other readers, a catalog that does not exist is an error naming it, not an empty fleet;
    an exporter started before its first agent reads the catalog once there is one."""
    catalog = tmp_path / "catalog"
    process, url = start_exporter(catalog, HOST, tmp_path / "exporter.log", "--listen", "127.0.0.1:0")
    try:
        assert {key: value for key, value in parse(get(url)).items() if key[0].startswith("hctx_c")} == {
            ("hctx_catalog_readable", ()): 0
        }
        assert f"{catalog} does not exist (from --catalog)" in (tmp_path / "exporter.log").read_text()
        put_record(catalog, "alice", observedAtMs=int(time.time() * 1000))
        samples = parse(get(url))
        assert samples["hctx_catalog_readable", ()] == 1
        assert of(samples, "alice")["hctx_context_used_tokens"] == 92283
    finally:
        stop(process)


def test_the_textfile_is_replaced_atomically(tmp_path: Path) -> None:
    put_record(tmp_path / "catalog", "alice", observedAtMs=NOW)
    target = tmp_path / "out" / "hctx.prom"
    target.parent.mkdir()
    target.write_text("old\n")
    with open(target) as before:
        done = hctx("metrics", "--catalog", str(tmp_path / "catalog"), "--textfile", str(target))
        assert done.returncode == 0, done.stderr
        assert before.read() == "old\n"  # the old file was renamed over, never truncated in place
    assert of(parse(target.read_text()), "alice")["hctx_context_used_tokens"] == 92283
    assert os.listdir(target.parent) == ["hctx.prom"]  # no temporary file left beside it
    missing = hctx("metrics", "--catalog", str(tmp_path / "catalog"), "--textfile", str(tmp_path / "no" / "x.prom"))
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    # The directory that is missing, never prometheus_client's temporary file name (issue 27).
    assert missing.stderr == f"hctx metrics: cannot write {tmp_path}/no/x.prom: no directory {tmp_path}/no\n"


def test_interval_rewrites_the_textfile_from_the_catalog_as_it_is(tmp_path: Path) -> None:
    catalog, target = tmp_path / "catalog", tmp_path / "hctx.prom"
    put_record(catalog, "alice", observedAtMs=int(time.time() * 1000))
    argv = [sys.executable, "-m", "wrapper.cli", "metrics", "--catalog", str(catalog), "--textfile", str(target)]
    process = subprocess.Popen([*argv, "--interval", "0.2"], env=os.environ | {"PYTHONPATH": str(Path.cwd())})
    try:
        wait_for(lambda: target.exists() and "alice" in target.read_text(), timeout=20, what="the first write")
        put_record(catalog, "bob", observedAtMs=int(time.time() * 1000), usedTokens=7)
        wait_for(lambda: of(parse(target.read_text()), "bob").get("hctx_context_used_tokens") == 7,
                 timeout=20, what="bob in a later write")  # fmt: skip
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_served_over_http_and_read_at_every_scrape(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog"
    record = put_record(catalog, "alice", observedAtMs=int(time.time() * 1000))
    process, url = start_exporter(catalog, HOST, tmp_path / "exporter.log", "--listen", "127.0.0.1:0")
    try:
        assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
        assert of(parse(get(url)), "alice")["hctx_context_used_tokens"] == 92283
        record.unlink()  # what a relaunch claim does
        assert of(parse(get(url)), "alice") == {}
    finally:
        stop(process)


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)


def _certificates(directory: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, both signed by the CA."""
    names = {name: directory / name for name in ("ca.key", "ca.pem", "server.key", "server.pem",
                                                  "client.key", "client.pem", "san.ext")}  # fmt: skip
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=hctx test CA",
             "-keyout", names["ca.key"], "-out", names["ca.pem"])  # fmt: skip
    names["san.ext"].write_text("subjectAltName=IP:127.0.0.1\n")
    for who in ("server", "client"):
        request = directory / f"{who}.csr"
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={who}", "-keyout", names[f"{who}.key"],
                 "-out", request)  # fmt: skip
        _openssl("x509", "-req", "-in", request, "-CA", names["ca.pem"], "-CAkey", names["ca.key"], "-days", "1",
                 "-CAcreateserial", "-extfile", names["san.ext"], "-out", names[f"{who}.pem"])  # fmt: skip
    return names


def test_tls_with_required_client_certificates(tmp_path: Path) -> None:
    certs = _certificates(tmp_path)
    put_record(tmp_path / "catalog", "alice", observedAtMs=int(time.time() * 1000))
    process, url = start_exporter(
        tmp_path / "catalog", HOST, tmp_path / "exporter.log", "--listen", "127.0.0.1:0",
        "--tls-cert", str(certs["server.pem"]), "--tls-key", str(certs["server.key"]),
        "--tls-client-ca", str(certs["ca.pem"]),
    )  # fmt: skip
    try:
        assert url.startswith("https://127.0.0.1:")
        trusted = ssl.create_default_context(cafile=certs["ca.pem"])
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
            get(url, context=trusted)  # no client certificate: refused
        trusted.load_cert_chain(certs["client.pem"], certs["client.key"])
        assert of(parse(get(url, context=trusted)), "alice")["hctx_context_used_tokens"] == 92283
    finally:
        stop(process)


@pytest.mark.parametrize(
    "args",
    [
        ["--interval", "5"],
        ["--textfile", "x.prom", "--listen", "127.0.0.1:1"],
        ["--tls-cert", "c.pem"],
        ["--tls-client-ca", "ca.pem"],
    ],
)
def test_contradictory_options_are_refused(tmp_path: Path, args: list[str]) -> None:
    done = hctx("metrics", "--catalog", str(tmp_path), *args)
    assert done.returncode == 2 and done.stderr.startswith("hctx metrics: ") and not (tmp_path / "x.prom").exists()


def test_missing_tls_files_are_each_named_and_nothing_says_listen(tmp_path: Path) -> None:
    (tmp_path / "host.pem").write_text("not a certificate\n")
    args = ["metrics", "--catalog", str(tmp_path), "--listen", "127.0.0.1:0"]
    done = hctx(*args, "--tls-cert", "host.pem", "--tls-key", "host.key", "--tls-client-ca", "ca.pem")
    assert done.returncode == 2
    assert done.stderr == ("hctx metrics: cannot serve HTTPS: --tls-cert host.pem: No such file or directory; "
                           "--tls-key host.key: No such file or directory; "
                           "--tls-client-ca ca.pem: No such file or directory\n")  # fmt: skip
    pem = str(tmp_path / "host.pem")
    junk = hctx(*args, "--tls-cert", pem, "--tls-key", pem)  # there, but no certificate
    assert junk.returncode == 2 and junk.stderr.startswith("hctx metrics: cannot serve HTTPS: ")
    assert pem in junk.stderr and "listen" not in junk.stderr and "Traceback" not in junk.stderr


def test_a_taken_port_is_a_message_not_a_traceback(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = hctx("metrics", "--catalog", str(tmp_path), "--listen", f"127.0.0.1:{port}")
    assert done.returncode == 2 and "cannot listen on 127.0.0.1" in done.stderr and "Traceback" not in done.stderr


def test_listen_defaults_to_loopback_and_every_interface_is_explicit() -> None:
    assert DEFAULT_LISTEN == ("127.0.0.1", 9478)
    assert listen_address("0.0.0.0:9478") == ("0.0.0.0", 9478)
    assert listen_address("[::1]:9") == ("::1", 9)
    for text in (":9478", "9478", "host:", "host:70000", "host:x"):
        with pytest.raises(argparse.ArgumentTypeError):
            listen_address(text)


def test_other_commands_do_not_load_prometheus_client() -> None:
    probe = "import sys, wrapper.cli; wrapper.cli.build_parser(); print(json.dumps('prometheus_client' in sys.modules))"
    done = subprocess.run([sys.executable, "-c", "import json; " + probe], capture_output=True, text=True,
                          env=os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parent.parent)})  # fmt: skip
    assert json.loads(done.stdout) is False, done.stderr


# --- the server: paths, formats, bounds -----------------------------------------------------------


def _raw(url: str, request: bytes, timeout: float = 10) -> bytes:
    """One raw exchange on a fresh connection: what came back before the server closed it."""
    import socket
    import urllib.parse

    where = urllib.parse.urlsplit(url)
    with socket.create_connection((where.hostname, where.port), timeout=timeout) as sock:
        sock.sendall(request)
        chunks = []
        with contextlib.suppress(ConnectionResetError):  # closed with our bytes unread: a reset
            while chunk := sock.recv(65536):
                chunks.append(chunk)
    return b"".join(chunks)


def test_metrics_at_metrics_a_page_at_the_root_and_404_elsewhere(tmp_path: Path) -> None:
    import gzip
    import urllib.request

    put_record(tmp_path / "catalog", "alice", observedAtMs=int(time.time() * 1000))
    process, url = start_exporter(tmp_path / "catalog", HOST, tmp_path / "exporter.log", "--listen", "127.0.0.1:0")
    root = url.removesuffix("/metrics")
    try:
        page = get(root + "/")
        assert "<title>hctx metrics</title>" in page and 'href="/metrics"' in page
        for path in ("/foo", "/metrics/x", "/metricsx"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                get(root + path)
            assert refused.value.code == 404, path
        with pytest.raises(urllib.error.HTTPError) as post:
            urllib.request.urlopen(urllib.request.Request(url, data=b"x", method="POST"), timeout=10)
        assert post.value.code == 405 and post.value.headers["Allow"] == "GET, HEAD"
        # Text format 0.0.4 unless OpenMetrics is asked for, as Prometheus does; gzip when accepted.
        with urllib.request.urlopen(url, timeout=10) as plain:
            assert plain.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
            text = plain.read().decode()
        assert "# TYPE hctx_model_info gauge" in text and not text.endswith("# EOF\n")
        ask = {"Accept": "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
               "Accept-Encoding": "gzip"}  # fmt: skip
        with urllib.request.urlopen(urllib.request.Request(url, headers=ask), timeout=10) as negotiated:
            assert negotiated.headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
            assert negotiated.headers["Content-Encoding"] == "gzip"
            body = gzip.decompress(negotiated.read()).decode()  # two gzip members, read as one stream
        assert "# TYPE hctx_model info" in body and "# TYPE hctx_session_tokens counter" in body
        assert body.endswith("# EOF\n") and body.count("# EOF") == 1
        assert of(parse(body), "alice") == of(parse(text), "alice") != {}
        head = _raw(url, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ") and head.endswith(b"\r\n\r\n")  # headers, no body
    finally:
        stop(process)


def test_held_connections_are_closed_and_never_starve_a_scrape(tmp_path: Path) -> None:
    """Past --max-connections the connection waiting longest is closed; a head that never ends is
    closed at --header-timeout; a kept-alive connection at --idle-timeout; a scrape gets through."""
    import socket
    import urllib.parse

    put_record(tmp_path / "catalog", "alice", observedAtMs=int(time.time() * 1000))
    process, url = start_exporter(tmp_path / "catalog", HOST, tmp_path / "exporter.log", "--listen", "127.0.0.1:0",
                                  "--max-connections", "4", "--header-timeout", "1", "--idle-timeout", "2")  # fmt: skip
    where = urllib.parse.urlsplit(url)
    try:
        held = [socket.create_connection((where.hostname, where.port), timeout=10) for _ in range(8)]
        for sock in held[4:]:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never finished
        assert of(parse(get(url)), "alice")["hctx_context_used_tokens"] == 92283  # a ninth, served
        started = time.monotonic()
        for sock in held:
            assert sock.recv(100) == b""  # closed by the exporter: evicted, or at the header timeout
        assert time.monotonic() - started < 5
        kept = _raw(url, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", timeout=10)  # keep-alive, then silence
        assert kept.startswith(b"HTTP/1.1 200 ") and b"hctx metrics" in kept  # closed at the idle timeout
        huge = _raw(url, b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 40_000 + b"\r\n\r\n")
        assert not huge.startswith(b"HTTP/1.1 200")  # a head past 16 KiB is not served
        assert process.poll() is None
    finally:
        stop(process)


def test_a_scrape_reads_only_the_agents_whose_files_changed(tmp_path: Path) -> None:
    from guard.catalog import RACY_NS

    catalog = tmp_path / "catalog"
    for agent in ("a", "b", "c"):
        put_record(catalog, agent)
        put_claim(catalog, agent, desiredState="running")
        for name in ("harness-context", "harness-state"):
            os.utime(catalog / "agents" / HOST / agent / name, ns=(time.time_ns() - 2 * RACY_NS,) * 2)
    exporter = exporter_of(catalog, NOW, HOST)
    reads = lambda: parse(render(exporter))[("hctx_exporter_records_read_total", ())]  # noqa: E731
    assert reads() == 3
    assert reads() == 3 and exporter.agents_text(False, False) is exporter.agents_text(False, False)
    put_record(catalog, "b", usedTokens=7)
    samples = parse(render(exporter))
    assert samples[("hctx_exporter_records_read_total", ())] == 4
    assert of(samples, "b")["hctx_context_used_tokens"] == 7 and of(samples, "a")["hctx_context_used_tokens"] == 92283
    (catalog / "agents" / HOST / "c" / "harness-context").unlink()
    assert "hctx_context_used_tokens" not in of(parse(render(exporter)), "c")


@given(st.one_of(st.integers(-(10**18), 10**18), st.floats(allow_nan=True, allow_infinity=True)))
def test_values_are_spelled_as_prometheus_client_spells_them(value: float) -> None:
    from prometheus_client.utils import floatToGoString

    from wrapper.readers.metrics import number_text

    assert number_text(value) == floatToGoString(value)


def test_a_response_the_client_never_reads_is_abandoned_at_the_idle_timeout(tmp_path: Path) -> None:
    """Hypercorn's sends have no deadline of their own: a client that asks for a large exposition
    and never reads it would hold its connection, and the response's bytes, for ever."""
    import urllib.parse

    from scripts.bench_roster import build_catalog

    build_catalog(tmp_path / "catalog", 6000, int(time.time() * 1000))
    process, url = start_exporter(tmp_path / "catalog", "alpha", tmp_path / "exporter.log", "--listen", "127.0.0.1:0",
                                  "--idle-timeout", "2")  # fmt: skip
    where = urllib.parse.urlsplit(url)
    try:
        whole = len(get(url).encode())
        # Past what the sockets hold: the server's send buffer (tcp_wmem's 4 MiB at most), the client's 8 KiB.
        assert whole > int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2]) + 1024 * 1024
        with socket.socket() as slow:
            slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            slow.connect((where.hostname, where.port))
            slow.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            # The first read's time, then the idle timeout, pass unread; a minute is a liveness bound.
            wait_for(lambda: server_end_closed(slow), timeout=60, what="the server to abandon the response")
            assert get(url).count("hctx_context_used_tokens{") == 6000  # the server still serves
            slow.settimeout(30)
            taken = 0
            with contextlib.suppress(ConnectionResetError):
                while chunk := slow.recv(1 << 20):
                    taken += len(chunk)
        assert taken < whole  # closed, not kept open until it was read
        assert process.poll() is None
    finally:
        stop(process)


def server_end_closed(client: socket.socket) -> bool:
    """Whether the server closed its end of `client`'s TCP connection, as /proc/net/tcp says: that
    end is past ESTABLISHED (FIN_WAIT1, its FIN queued behind the bytes the client has not read) or
    gone. The client's own end sees no FIN until it reads those bytes."""
    client_port, server_port = client.getsockname()[1], client.getpeername()[1]
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, remote, state = line.split()[1:4]
            if int(local.rsplit(":", 1)[1], 16) == server_port and int(remote.rsplit(":", 1)[1], 16) == client_port:
                return state != "01"  # TCP_ESTABLISHED
    return True


def test_a_body_past_64_kib_is_refused_and_a_head_past_16_kib_too(tmp_path: Path) -> None:
    process, url = start_exporter(tmp_path, HOST, tmp_path / "exporter.log", "--listen", "127.0.0.1:0")
    try:
        post = b"POST /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n\r\n"
        small = _raw(url, post % 10 + b"x" * 10)
        assert small.startswith(b"HTTP/1.1 405 ")
        large = _raw(url, post % 70_000 + b"x" * 70_000)
        assert large.startswith(b"HTTP/1.1 413 ") and b"connection: close" in large.lower()
        pad = b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Pad: "
        assert _raw(url, pad + b"a" * (16 * 1024 - len(pad) - 4) + b"\r\n\r\n").startswith(b"HTTP/1.1 200 ")
        assert _raw(url, pad + b"a" * (16 * 1024 - len(pad) - 3) + b"\r\n\r\n").startswith(b"HTTP/1.1 431 ")
    finally:
        stop(process)
