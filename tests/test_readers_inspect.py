"""`hctx inspect ID`: the raw record as stored, the claim and its history, the incarnation check,
the projection and the log tail, each labelled; and the readers against a real `hctx wrap`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from readers_catalog import HOST, HOUR, MINUTE, NOW, agent_path, hctx, put_claim, put_record

from guard.layout import log_path
from wrapper.readers import render
from wrapper.readers.render import render_inspection
from wrapper.readers.roster import collect_inspection, incarnation_verdict, launches_within


def dead(pid: int) -> bool:
    return False


def inspect(catalog: Path, identity: str = "alpha", now: int = NOW) -> str:
    return render_inspection(collect_inspection(catalog, HOST, identity, now, here=HOST, alive=dead))


def history(*stamps: int) -> list[dict[str, object]]:
    return [{"incarnation": f"old-{index}", "claimedAtMs": stamp, "wrapperPid": 100 + index}
            for index, stamp in enumerate(stamps, start=1)]  # fmt: skip


def sections(text: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    current = ""
    for line in text.splitlines():
        if line.startswith("== "):
            current = line[3:].split(":")[0].split(" (")[0]
            found[current] = [line]
        elif current:
            found[current].append(line)
    return found


def test_sections_are_labelled_and_the_raw_record_is_verbatim(tmp_path: Path) -> None:
    path = put_record(tmp_path, "alpha", incarnation="inc-now", writtenAtMs=1788000100007)
    put_claim(tmp_path, "alpha", incarnation="inc-now")
    text = inspect(tmp_path)
    parts = sections(text)
    assert list(parts) == ["record as stored", "harness-state claim", "projection", "log"]
    record_part = parts["record as stored"]
    assert record_part[0] == f"== record as stored: {path}"
    assert record_part[1] == "  " + path.read_text().rstrip("\n")  # the bytes as stored, untouched
    assert "  incarnation   inc-now" in record_part
    assert "  writtenAtMs   1788000100007 (2026-08-29T10:41:40.007Z)" in record_part
    assert "  observedAtMs  1788000100000 (2026-08-29T10:41:40.000Z)" in record_part
    projection = "\n".join(line[2:] for line in parts["projection"][1:-2])
    projected = json.loads(projection)
    assert projected["ageMs"] == 4210 and "incarnation" not in projected and "writtenAtMs" not in projected
    assert parts["projection"][-2] == "  ctx:33% ⟳3  92k/258k"


def test_current_incarnation_is_named_current(tmp_path: Path) -> None:
    put_record(tmp_path, "alpha", incarnation="inc-now")
    put_claim(tmp_path, "alpha", incarnation="inc-now", history=history(NOW - MINUTE))
    assert "  incarnation check: current: the record comes from the incarnation the claim names" in inspect(tmp_path)


def test_straggler_from_an_earlier_incarnation_is_named_as_such(tmp_path: Path) -> None:
    put_record(tmp_path, "alpha", incarnation="old-2")
    put_claim(tmp_path, "alpha", incarnation="inc-now", history=history(NOW - MINUTE, NOW - 2 * MINUTE))
    text = inspect(tmp_path)
    assert "  incarnation check: straggler from an earlier incarnation (2 launches ago, pid 102); " in text


def test_incarnation_outside_claim_and_history(tmp_path: Path) -> None:
    put_record(tmp_path, "alpha", incarnation="who-knows")
    put_claim(tmp_path, "alpha", incarnation="inc-now")
    assert "neither the claim's nor in its history" in inspect(tmp_path)
    assert incarnation_verdict(None, None) == "no record to compare"


def test_no_claim_and_garbled_claim(tmp_path: Path) -> None:
    put_record(tmp_path, "alpha")
    text = inspect(tmp_path)
    assert "no readable claim to compare against" in text
    assert sections(text)["harness-state claim"][1] == "  (no file)"
    put_claim(tmp_path, "alpha", raw=b"{garbled")
    assert sections(inspect(tmp_path))["harness-state claim"][1].startswith("  ! harness-state claim refused: ")


def test_claim_history_and_launches_in_the_last_hour(tmp_path: Path) -> None:
    put_record(tmp_path, "alpha")
    stamps = (NOW - MINUTE, NOW - 30 * MINUTE, NOW - HOUR, NOW - HOUR - 1, NOW - 5 * HOUR)
    put_claim(tmp_path, "alpha", incarnation="inc-now", claimedAtMs=NOW - 10_000, wrapperPid=77,
              desiredState="running", history=history(*stamps))  # fmt: skip
    claim_part = sections(inspect(tmp_path))["harness-state claim"]
    assert "  launches in the last hour: 4" in claim_part  # now, -1m, -30m, -60m; not -60m-1ms nor -5h
    assert "  history (5 earlier claims, newest first):" in claim_part
    assert "  wrapperPid    77" in claim_part
    assert "  desiredState  running (as written; derived now: running)" in claim_part
    assert sum(line.startswith("    old-") for line in claim_part) == 5
    assert launches_within(None, NOW) is None


def test_log_tail_is_the_last_lines_of_the_agents_log(tmp_path: Path) -> None:
    put_record(tmp_path, "alpha")
    logs = tmp_path / ".st2" / "logs"
    logs.mkdir(parents=True)
    lines = [json.dumps({"event": "write", "n": index}) for index in range(500)]
    log_path(tmp_path, HOST, "alpha").write_text("\n".join(lines) + "\n")
    log_part = sections(inspect(tmp_path))["log"]
    assert log_part[0] == f"== log: {log_path(tmp_path, HOST, 'alpha')} (last 20 lines)"
    assert log_part[1:] == [f"  {line}" for line in lines[-20:]]


def test_log_tail_of_a_huge_log_reads_only_its_end(tmp_path: Path) -> None:
    put_record(tmp_path, "alpha")
    logs = tmp_path / ".st2" / "logs"
    logs.mkdir(parents=True)
    with open(log_path(tmp_path, HOST, "alpha"), "wb") as handle:
        handle.truncate(2 * 1024**3)  # sparse zeros
        handle.seek(0, 2)
        handle.write(b'\n{"event": "exit"}\n')
    tail = sections(inspect(tmp_path))["log"]
    assert tail[-1] == '  {"event": "exit"}'
    assert all("\x00" not in line for line in tail)


def test_log_that_is_a_symlink_or_missing(tmp_path: Path) -> None:
    put_record(tmp_path, "alpha")
    assert sections(inspect(tmp_path))["log"][1] == "  (no log file)"
    logs = tmp_path / ".st2" / "logs"
    logs.mkdir(parents=True)
    log_path(tmp_path, HOST, "alpha").symlink_to("/etc/passwd")
    assert sections(inspect(tmp_path))["log"][1] == "  ! log is a symlink; not followed"


def test_refused_record_shows_its_bytes_and_why(tmp_path: Path) -> None:
    put_record(tmp_path, "alpha", raw=b'{"schema": "com.example.harness-context.v1"}\n')
    part = sections(inspect(tmp_path))["record as stored"]
    assert part[1] == '  {"schema": "com.example.harness-context.v1"}'
    assert part[2].startswith("  ! context record refused: schema 'com.example.harness-context.v1'")


def test_long_refused_record_is_shown_bounded(tmp_path: Path) -> None:
    put_record(tmp_path, "alpha", raw=b"x" * 10_000)
    part = sections(inspect(tmp_path))["record as stored"]
    assert part[1] == "  " + "x" * render.RAW_SHOWN_BYTES
    assert part[2] == f"  … ({10_000 - render.RAW_SHOWN_BYTES} more bytes not shown)"


def test_inspect_cli_unknown_agent_and_labels(tmp_path: Path) -> None:
    put_record(tmp_path, "alpha")
    done = hctx("inspect", "nobody", "--catalog", str(tmp_path))
    assert (done.returncode, done.stdout) == (1, "") and "no agent nobody" in done.stderr
    done = hctx("inspect", f"{HOST}/alpha", "--catalog", str(tmp_path))
    assert done.returncode == 0
    assert done.stdout.startswith(f"agent {HOST}/alpha\n")
    agent_path(tmp_path, "empty")
    done = hctx("inspect", "empty", "--catalog", str(tmp_path))
    assert done.returncode == 0 and "  (no file)" in done.stdout


# --- against the real wrapper ----------------------------------------------------------------------

wrapping = pytest.importorskip("wrapping")


def test_inspect_a_real_crash_loop(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog"
    frame = wrapping.context_frame(10, 100, 10.0)
    argv = wrapping.wrap_argv(
        catalog, "looper", "pi", sys.executable, "-c", wrapping.STANDIN + "\nsys.exit(1)\n", frame,
        extra=("--restart", "on-failure", "--max-restarts", "3", "--restart-delay", "0.01",
               "--restart-delay-max", "0.02"),
    )  # fmt: skip
    assert wrapping.run(argv, timeout=60).returncode == 1
    done = hctx("inspect", "looper", "--catalog", str(catalog), "--host", wrapping.HOST)
    assert done.returncode == 0, done.stderr
    parts = sections(done.stdout)
    assert "  launches in the last hour: 4" in parts["harness-state claim"]
    assert "  history (3 earlier claims, newest first):" in parts["harness-state claim"]
    assert any(line.startswith("  incarnation check: current") for line in parts["record as stored"])
    assert any('"event": "exit"' in line for line in parts["log"]), parts["log"]
    state = json.loads((catalog / "agents" / wrapping.HOST / "looper" / "harness-state").read_text())
    assert f"  incarnation   {state['incarnation']}" in parts["harness-state claim"]


def test_agents_sees_a_live_wrapper_as_running_and_a_finished_one_as_its_claim(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog"
    ready = tmp_path / "ready"
    script = f"import time; open({str(ready)!r}, 'w').close(); time.sleep(60)"
    wrapper = subprocess.Popen(wrapping.wrap_argv(catalog, "live", "pi", sys.executable, "-c", script),
                               env=wrapping.env())  # fmt: skip
    try:
        wrapping.wait_for(ready.exists, what="harness start")
        done = hctx("agents", "live", "--json", "--catalog", str(catalog), "--host", wrapping.HOST)
        assert json.loads(done.stdout)["desiredState"] == "running"
        assert json.loads(done.stdout)["harness"] == "pi"
        done = hctx("agents", "live", "--json", "--catalog", str(catalog), "--host", "not-this-one")
        assert json.loads(done.stdout)["desiredState"] == "running"  # the claim itself says running
    finally:
        wrapper.terminate()
        wrapper.wait(timeout=10)
    done = hctx("agents", "live", "--json", "--catalog", str(catalog), "--host", wrapping.HOST)
    assert json.loads(done.stdout)["desiredState"] == "stopped"


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"compactAtTokens": 160_000, "autoCompaction": True}, "at 160000 tokens, by the harness's own settings"),
        ({"compactAtTokens": None, "autoCompaction": False}, "auto-compaction off (the harness's own settings)"),
        ({"compactAtTokens": None, "autoCompaction": None}, "point not stated by the harness"),
    ],
)
def test_inspect_says_where_the_harness_compacts_and_why_a_null_is_null(
    tmp_path: Path, fields: dict[str, object], said: str
) -> None:
    put_record(tmp_path, "alpha", **fields)
    assert f"  compaction    {said}" in sections(inspect(tmp_path))["record as stored"]
