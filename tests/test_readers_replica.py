"""A catalog that is a Syncthing replica: Syncthing's own files are passed over without a word, a
conflict copy is never the record, hosts that arrived from elsewhere read like this one, and a host
whose clock runs ahead is named by `hctx doctor` instead of its agents silently vanishing."""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Callable
from pathlib import Path

import pytest
from readers_catalog import HOST, MINUTE, NOW, agent_path, hctx, put_claim, put_record

from guard.catalog import iter_hosts, iter_identities
from guard.errors import CatalogError
from wrapper.readers.render import doctor_advisories
from wrapper.readers.roster import collect_roster

# doctor adds a setup line per harness it finds installed (issue 36): these tests read its other lines.
pytestmark = pytest.mark.usefixtures("harnessless_home")

CONFLICT = "harness-context.sync-conflict-20261201-091500-WBMBBOK"


def dead(pid: int) -> bool:
    return False


def alive(pid: int) -> bool:
    return True


def replica(catalog: Path) -> Path:
    """Two hosts' agents, as a Syncthing replica holds them; returns `<catalog>/agents`."""
    put_record(catalog, "alice", usedPercent=40)
    put_record(catalog, "bob", host="far", usedPercent=90, usedTokens=232_560)
    put_claim(catalog, "bob", host="far", desiredState="running", wrapperPid=os.getpid())
    return catalog / "agents"


# Everything Syncthing itself may put in the tree it syncs, each as the kind of entry it makes.
def _marker(agents: Path) -> None:
    (agents / ".stfolder").mkdir()


def _old_marker_file(agents: Path) -> None:
    (agents / ".stfolder").write_bytes(b"")


def _ignore_file(agents: Path) -> None:
    (agents / ".stignore").write_text("!/*/*/harness-context\n*\n")


def _versions(agents: Path) -> None:
    (agents / ".stversions" / "far" / "bob").mkdir(parents=True)


def _receiving_at_every_level(agents: Path) -> None:
    for directory in (agents, agents / "far", agents / "far" / "bob"):
        (directory / ".syncthing.harness-context.tmp").write_bytes(b'{"schema": "st2.harn')
    (agents / ".syncthing.0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.tmp").write_bytes(b"")


def _windows_temporary(agents: Path) -> None:
    (agents / "far" / "~syncthing~harness-state.tmp").write_bytes(b"{")


def _conflict_copies(agents: Path) -> None:
    (agents / "far" / "bob.sync-conflict-20261201-091500-WBMBBOK").write_bytes(b"{}")
    (agents / "far" / "notes.sync-conflict-20261201-091500-WBMBBOK.txt").write_bytes(b"")


SYNCTHING_ENTRIES: dict[str, Callable[[Path], None]] = {
    "folder-marker": _marker,
    "folder-marker-as-a-file": _old_marker_file,
    "ignore-file": _ignore_file,
    "versions-directory": _versions,
    "temporaries-while-receiving": _receiving_at_every_level,
    "windows-temporary": _windows_temporary,
    "conflict-copies": _conflict_copies,
}


@pytest.mark.parametrize("entry", list(SYNCTHING_ENTRIES))
def test_syncthings_own_files_give_no_warning_no_row_and_no_refusal(tmp_path: Path, entry: str) -> None:
    agents = replica(tmp_path)
    SYNCTHING_ENTRIES[entry](agents)
    result = collect_roster(tmp_path, NOW, here=HOST, alive=dead)
    assert result.all_warnings() == []
    assert [(row.host, row.identity, row.context and row.context.used_percent) for row in result.rows] == [
        (HOST, "alice", 40), ("far", "bob", 90),
    ]  # fmt: skip
    # The store's walkers, strict by design, are not refused by them either.
    assert iter_hosts(tmp_path) == [HOST, "far"]
    assert iter_identities(tmp_path, "far") == ["bob"]


def test_every_reader_is_silent_on_a_replica_holding_all_of_syncthings_files(tmp_path: Path) -> None:
    agents = replica(tmp_path)
    for make in SYNCTHING_ENTRIES.values():
        if make is not _old_marker_file:
            make(agents)
    listed = hctx("agents", "--json", "--catalog", str(tmp_path), "--host", HOST)
    assert (listed.returncode, listed.stderr) == (0, "")
    assert [(row["host"], row["identity"]) for row in json.loads(listed.stdout)] == [(HOST, "alice"), ("far", "bob")]
    for command in (["agents"], ["top", "--once"], ["doctor"]):
        result = hctx(*command, "--catalog", str(tmp_path), "--host", HOST)
        assert (result.returncode, result.stderr) == (0, ""), command
        assert "far/bob" in result.stdout or "far" in result.stdout.split(), command


def test_a_conflict_copy_is_never_the_record(tmp_path: Path) -> None:
    put_record(tmp_path, "kept", usedPercent=12)
    (agent_path(tmp_path, "kept") / CONFLICT).write_text(json.dumps({**json.loads(
        (agent_path(tmp_path, "kept") / "harness-context").read_text()), "usedPercent": 99}))  # fmt: skip
    only_copy = agent_path(tmp_path, "lost")
    (only_copy / CONFLICT).write_bytes((agent_path(tmp_path, "kept") / CONFLICT).read_bytes())
    rows = {row.identity: row for row in collect_roster(tmp_path, NOW, here=HOST, alive=dead).rows}
    assert rows["kept"].context is not None and rows["kept"].context.used_percent == 12
    assert (rows["lost"].context, rows["lost"].problem) == (None, None)  # no record: "never observed"


def test_a_conflict_named_directory_is_not_an_agent(tmp_path: Path) -> None:
    put_record(tmp_path, "bob")
    put_record(tmp_path, "bob.sync-conflict-20261201-091500-WBMBBOK")
    result = collect_roster(tmp_path, NOW, here=HOST, alive=dead)
    assert [row.identity for row in result.rows] == ["bob"]
    assert len(result.warnings) == 1 and "bob.sync-conflict-" in result.warnings[0]
    with pytest.raises(CatalogError, match="not a valid name"):
        iter_identities(tmp_path, "bob.sync-conflict-20261201-091500-WBMBBOK")


def _symlinked_temporary(agents: Path) -> None:
    (agents / HOST / ".syncthing.alice.tmp").symlink_to("alice")


def _fifo_temporary(agents: Path) -> None:
    os.mkfifo(agents / HOST / ".syncthing.harness-context.tmp")


def _temporary_directory(agents: Path) -> None:
    (agents / HOST / ".syncthing.x.tmp").mkdir()


def _socket_conflict(agents: Path) -> None:
    sock = socket.socket(socket.AF_UNIX)
    with contextlib.closing(sock), contextlib.chdir(agents / HOST):  # the full path is over sun_path's bound
        sock.bind("a.sync-conflict-20261201-091500-WBMBBOK")


def _symlinked_marker(agents: Path) -> None:
    (agents / ".stfolder").symlink_to(HOST)


def _marker_inside_out(agents: Path) -> None:
    (agents / ".stignore").mkdir()


def _near_miss(name: str) -> Callable[[Path], None]:
    def make(agents: Path) -> None:
        (agents / HOST / name).write_bytes(b"")

    return make


JUNK: dict[str, Callable[[Path], None]] = {
    "symlinked-temporary": _symlinked_temporary,
    "fifo-temporary": _fifo_temporary,
    "temporary-directory": _temporary_directory,
    "socket-conflict-copy": _socket_conflict,
    "symlinked-marker": _symlinked_marker,
    "ignore-file-as-a-directory": _marker_inside_out,
    "temporary-without-suffix": _near_miss(".syncthing.harness-context"),
    "temporary-without-name": _near_miss(".syncthing..tmp"),
    "conflict-without-device": _near_miss("a.sync-conflict-20261201-091500"),
    "conflict-short-date": _near_miss("a.sync-conflict-2026121-091500-WBMBBOK"),
    "conflict-lowercase-device": _near_miss("a.sync-conflict-20261201-091500-wbmbbok"),
    "marker-near-miss": _near_miss(".stfolders"),
    "generic-dotfile": _near_miss(".DS_Store"),
}


@pytest.mark.parametrize("entry", list(JUNK))
def test_other_junk_is_still_named_in_a_warning(tmp_path: Path, entry: str) -> None:
    agents = replica(tmp_path)
    JUNK[entry](agents)
    result = collect_roster(tmp_path, NOW, here=HOST, alive=dead)
    assert [(row.host, row.identity) for row in result.rows] == [(HOST, "alice"), ("far", "bob")]
    assert len(result.warnings) == 1 and "unexpected entry" in result.warnings[0]
    with pytest.raises(CatalogError, match="unexpected entry"):
        [iter_identities(tmp_path, host) for host in iter_hosts(tmp_path)]


def test_a_fifo_temporary_never_hangs_a_reader_process(tmp_path: Path) -> None:
    agents = replica(tmp_path)
    _fifo_temporary(agents)
    os.mkfifo(agents / "far" / "bob" / ".syncthing.harness-context.tmp")  # inside an agent: never opened
    result = hctx("agents", "--json", "--catalog", str(tmp_path), "--host", HOST, timeout=10)
    assert result.returncode == 0
    assert result.stderr.count("warning") == 1 and ".syncthing.harness-context.tmp" in result.stderr


def test_every_reader_shows_the_host_of_every_row(tmp_path: Path) -> None:
    replica(tmp_path)
    put_record(tmp_path, "alice", host="far", usedPercent=85)
    agents = hctx("agents", "--catalog", str(tmp_path), "--host", HOST)
    assert [line.split()[:2] for line in agents.stdout.splitlines()[1:]] == [
        [HOST, "alice"], ["far", "alice"], ["far", "bob"],
    ]  # fmt: skip
    top = hctx("top", "--once", "--catalog", str(tmp_path), "--host", HOST, env={"COLUMNS": "200"})
    shown = [line.split()[0] for line in top.stdout.splitlines()[3:] if "/" in line]
    assert sorted(shown) == [f"{HOST}/alice", "far/alice", "far/bob"]
    doctor = hctx("doctor", "--catalog", str(tmp_path), "--host", HOST)
    assert [line.split()[1] for line in doctor.stdout.splitlines()] == ["far/alice:", "far/bob:", "far/bob:"]


def test_the_pid_probe_is_never_applied_to_another_hosts_pid(tmp_path: Path) -> None:
    replica(tmp_path)  # far/bob's claim names a pid alive here: ours
    put_claim(tmp_path, "alice", desiredState="stopped", wrapperPid=os.getpid())
    probed: list[int] = []

    def probe(pid: int) -> bool:
        probed.append(pid)
        return True

    rows = {row.name: row for row in collect_roster(tmp_path, NOW, here=HOST, alive=probe).rows}
    assert (rows[f"{HOST}/alice"].desired_state, rows["far/bob"].desired_state) == ("running", "running")
    assert probed == [os.getpid()]  # alice's only: bob's "running" is what his claim says
    put_claim(tmp_path, "bob", host="far", desiredState="stopped", wrapperPid=os.getpid())
    rows = {row.name: row for row in collect_roster(tmp_path, NOW, here=HOST, alive=alive).rows}
    assert rows["far/bob"].desired_state == "stopped"


def test_a_host_whose_clock_runs_ahead_is_named_by_doctor_with_how_far(tmp_path: Path) -> None:
    put_record(tmp_path, "alice", usedPercent=40)
    put_record(tmp_path, "x", host="fast", usedPercent=99.0, observedAtMs=NOW + 3 * MINUTE + 5_000)  # no fill line
    put_record(tmp_path, "y", host="fast", observedAtMs=NOW + 90_000)
    put_record(tmp_path, "z", host="fast", observedAtMs=NOW + 60_000)  # at the bound: still trusted
    result = collect_roster(tmp_path, NOW, here=HOST, alive=dead)
    rows = {row.name: row for row in result.rows}
    assert (rows["fast/x"].context, rows["fast/y"].context) == (None, None)  # the spec: null
    assert rows["fast/z"].context is not None and rows["fast/z"].context.age_ms == 0
    assert doctor_advisories(result) == [
        "advisory: host fast: clock ahead of this host's by at least 3m05s (185000 ms), past the 1m00s skew "
        "bound; context read as absent for fast/x, fast/y"
    ]


def test_doctor_names_the_fast_host_as_a_process_and_still_exits_zero(tmp_path: Path) -> None:
    put_record(tmp_path, "x", host="fast", observedAtMs=4_000_000_000_000)
    result = hctx("doctor", "--catalog", str(tmp_path), "--host", HOST)
    assert result.returncode == 0
    (line,) = result.stdout.splitlines()
    assert line.startswith("advisory: host fast: clock ahead of this host's by at least ")
    assert line.endswith("context read as absent for fast/x")
