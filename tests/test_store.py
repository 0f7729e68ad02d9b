"""The store (HC-R05): layout, staging outside `agents/`, refusals, monotonic stamps, walkers."""

from __future__ import annotations

import errno
import fcntl
import os
import select
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from guard_factory import record

import guard.store as store
import guard.walk as walk
from guard.atomic import sweep_staging, write_agent_file
from guard.catalog import iter_hosts, iter_identities
from guard.errors import CatalogError
from guard.layout import AgentDir, check_name, staging_dir
from guard.projection import read_context
from guard.record import parse_record
from guard.store import remove_context, write_context
from tests.conftest import REPO

AGENT_FILES = {"harness-context", ".harness-context.lock"}


@pytest.fixture
def catalog(tmp_path: Path) -> Path:
    root = tmp_path / "catalog"
    root.mkdir()
    return root


def _agent(catalog: Path, identity: str = "alice", host: str = "h1") -> AgentDir:
    return AgentDir(catalog, host, identity)


def _files_under(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*")}


# --- layout and round trip -------------------------------------------------------------------


def test_write_then_read_round_trips_at_the_canonical_path(catalog: Path) -> None:
    written = write_context(_agent(catalog), record(agent="alice"))
    path = catalog / "agents" / "h1" / "alice" / "harness-context"
    assert _agent(catalog).context_path == path
    data = path.read_bytes()
    assert data == written.to_json().encode()
    assert data.endswith(b"\n")
    assert parse_record(data) == written == record(agent="alice")
    assert read_context(str(path), written.observed_at_ms) is not None
    assert (path.parent / ".harness-context.lock").is_file()
    assert set(os.listdir(path.parent)) == AGENT_FILES


def test_staging_happens_outside_agents_and_nothing_else_appears_there(
    catalog: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_replace = os.replace
    seen: list[tuple[str, str, str, bytes]] = []

    def spy(src: str, dst: str, *, src_dir_fd: int, dst_dir_fd: int) -> None:
        src_dir = os.readlink(f"/proc/self/fd/{src_dir_fd}")
        dst_dir = os.readlink(f"/proc/self/fd/{dst_dir_fd}")
        staged = os.open(src, os.O_RDONLY, dir_fd=src_dir_fd)
        try:
            content = os.read(staged, 1 << 20)
        finally:
            os.close(staged)
        seen.append((src_dir, dst_dir, dst, content))
        assert _files_under(catalog / "agents") <= {"h1", "h1/alice", *(f"h1/alice/{n}" for n in AGENT_FILES)}
        real_replace(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)

    if not Path("/proc/self/fd").is_dir():
        pytest.skip("needs /proc to name a directory descriptor")
    monkeypatch.setattr(os, "replace", spy)
    for n in range(3):
        write_context(_agent(catalog), record(used_tokens=n))
    assert [(s, d, name) for s, d, name, _ in seen] == [
        (str(catalog / ".st2" / "harness-context-staging"), str(catalog / "agents" / "h1" / "alice"), "harness-context")
    ] * 3
    assert [parse_record(content).used_tokens for *_, content in seen] == [0, 1, 2]
    assert staging_dir(catalog) == catalog / ".st2" / "harness-context-staging"
    assert os.listdir(staging_dir(catalog)) == []  # nothing left behind


def test_many_writes_leave_only_the_record_and_its_lock(catalog: Path) -> None:
    for n in range(50):
        write_context(_agent(catalog), record(used_tokens=n, written_at_ms=n))
    assert _files_under(catalog / "agents") == {"h1", "h1/alice", *(f"h1/alice/{n}" for n in AGENT_FILES)}
    assert os.listdir(staging_dir(catalog)) == []


def test_harness_state_is_staged_the_same_way(catalog: Path) -> None:
    write_agent_file(_agent(catalog), "harness-state", b'{"schema": "st2.harness-state.v1"}\n')
    assert (catalog / "agents/h1/alice/harness-state").read_bytes() == b'{"schema": "st2.harness-state.v1"}\n'
    assert os.listdir(staging_dir(catalog)) == []


@pytest.mark.parametrize("fail", ["replace", "fsync"])
def test_a_failed_write_cleans_up_and_keeps_the_previous_record(
    catalog: Path, monkeypatch: pytest.MonkeyPatch, fail: str
) -> None:
    before = write_context(_agent(catalog), record(used_tokens=1, written_at_ms=1))

    def broken(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.EIO, "injected failure")

    monkeypatch.setattr(os, fail, broken)
    with pytest.raises(OSError, match="injected"):
        write_context(_agent(catalog), record(used_tokens=2, written_at_ms=2))
    monkeypatch.undo()
    assert os.listdir(staging_dir(catalog)) == []
    assert parse_record(_agent(catalog).context_path.read_bytes()) == before
    assert set(os.listdir(_agent(catalog).path)) == AGENT_FILES


# --- writtenAtMs strictly monotonic per record, across writers -------------------------------


@pytest.mark.parametrize(
    ("on_disk", "ours", "expected"), [(5_000, 10, 5_001), (5_000, 5_000, 5_001), (5_000, 9_000, 9_000)]
)
def test_written_at_is_raised_above_another_writers_record(
    catalog: Path, on_disk: int, ours: int, expected: int
) -> None:
    write_context(_agent(catalog), record(incarnation="old-session", written_at_ms=on_disk))
    written = write_context(_agent(catalog), record(incarnation="new-session", written_at_ms=ours))
    assert written.written_at_ms == expected
    assert written.incarnation == "new-session"
    assert parse_record(_agent(catalog).context_path.read_bytes()) == written


def test_unreadable_previous_record_does_not_block_the_write(catalog: Path) -> None:
    agent = _agent(catalog)
    write_context(agent, record(written_at_ms=1))
    agent.context_path.write_bytes(b"{ torn")
    written = write_context(agent, record(written_at_ms=7))
    assert written.written_at_ms == 7
    assert parse_record(agent.context_path.read_bytes()) == written


def test_same_millisecond_writes_stay_distinct(catalog: Path) -> None:
    stamps = [write_context(_agent(catalog), record(used_tokens=n, written_at_ms=100)).written_at_ms for n in range(5)]
    assert stamps == [100, 101, 102, 103, 104]


# --- removal (the relaunch claim) ------------------------------------------------------------


def test_remove_context_makes_readers_see_null(catalog: Path) -> None:
    agent = _agent(catalog)
    written = write_context(agent, record())
    assert remove_context(agent) is True
    assert not agent.context_path.exists()
    assert read_context(str(agent.context_path), written.observed_at_ms) is None
    assert remove_context(agent) is False
    assert (agent.path / ".harness-context.lock").exists()


def test_remove_context_on_a_fresh_catalog_is_a_no_op(catalog: Path) -> None:
    assert remove_context(_agent(catalog)) is False


# --- the lock --------------------------------------------------------------------------------


def test_writers_serialize_on_the_lock_file(catalog: Path) -> None:
    agent = _agent(catalog)
    write_context(agent, record(used_tokens=1, written_at_ms=1))
    child = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(REPO)!r}); sys.path.insert(0, {str(REPO / "tests")!r})
        from pathlib import Path
        from guard.store import AgentDir, write_context
        from guard_factory import record
        print("writing", flush=True)
        write_context(AgentDir(Path({str(catalog)!r}), "h1", "alice"), record(used_tokens=2, written_at_ms=2))
        """
    )
    lock = os.open(agent.path / ".harness-context.lock", os.O_RDWR)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        writer = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
        try:
            assert writer.stdout is not None
            assert select.select([writer.stdout], [], [], 30)[0], "the writer never started"
            assert writer.stdout.readline() == "writing\n"
            time.sleep(0.5)
            assert writer.poll() is None, "the writer did not wait for the lock"
            assert parse_record(agent.context_path.read_bytes()).used_tokens == 1
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
        assert writer.wait(timeout=30) == 0
    finally:
        os.close(lock)
    assert parse_record(agent.context_path.read_bytes()).used_tokens == 2


# --- refusals: a clear CatalogError, never a fallback ----------------------------------------


def _symlink_agents(catalog: Path) -> Path:
    (catalog / "elsewhere").mkdir()
    (catalog / "agents").symlink_to("elsewhere")
    return catalog / "elsewhere"


def _symlink_host(catalog: Path) -> Path:
    (catalog / "agents" / "real-host").mkdir(parents=True)
    (catalog / "agents" / "h1").symlink_to("real-host")
    return catalog / "agents" / "real-host"


def _symlink_identity(catalog: Path) -> Path:
    (catalog / "agents" / "h1" / "real-alice").mkdir(parents=True)
    (catalog / "agents" / "h1" / "alice").symlink_to("real-alice")
    return catalog / "agents" / "h1" / "real-alice"


def _symlink_control(catalog: Path) -> Path:
    (catalog / "control-elsewhere").mkdir()
    (catalog / ".st2").symlink_to("control-elsewhere")
    return catalog / "control-elsewhere"


def _symlink_staging(catalog: Path) -> Path:
    (catalog / ".st2" / "real-staging").mkdir(parents=True)
    (catalog / ".st2" / "harness-context-staging").symlink_to("real-staging")
    return catalog / ".st2" / "real-staging"


def _agents_is_a_file(catalog: Path) -> Path:
    (catalog / "agents").write_text("not a directory")
    return catalog / "elsewhere-unused"


def _identity_dangling_symlink(catalog: Path) -> Path:
    (catalog / "agents" / "h1").mkdir(parents=True)
    (catalog / "agents" / "h1" / "alice").symlink_to("missing")
    return catalog / "agents" / "h1" / "missing"


def _staging_is_a_file(catalog: Path) -> Path:
    (catalog / ".st2").mkdir()
    (catalog / ".st2" / "harness-context-staging").write_text("")
    return catalog / "elsewhere-unused"


BAD_LAYOUTS: dict[str, tuple[Callable[[Path], Path], str]] = {
    "agents-symlink": (_symlink_agents, "agents"),
    "host-symlink": (_symlink_host, "h1"),
    "identity-symlink": (_symlink_identity, "alice"),
    "identity-dangling-symlink": (_identity_dangling_symlink, "alice"),
    "control-dir-symlink": (_symlink_control, ".st2"),
    "staging-symlink": (_symlink_staging, "harness-context-staging"),
    "agents-is-a-file": (_agents_is_a_file, "agents"),
    "staging-is-a-file": (_staging_is_a_file, "harness-context-staging"),
}


@pytest.mark.parametrize("layout", list(BAD_LAYOUTS))
@pytest.mark.parametrize("operation", ["write", "remove", "state"])
def test_symlinked_or_non_directory_ancestry_is_refused(catalog: Path, layout: str, operation: str) -> None:
    prepare, named = BAD_LAYOUTS[layout]
    target = prepare(catalog)
    agent = _agent(catalog)
    with pytest.raises(CatalogError) as refused:
        if operation == "write":
            write_context(agent, record())
        elif operation == "remove":
            remove_context(agent)
        else:
            write_agent_file(agent, "harness-state", b"{}\n")
    message = str(refused.value)
    assert named in message and str(catalog) in message
    assert "not a real directory" in message
    # Nothing was written through the symlink, nor anywhere else.
    if target.exists():
        assert not any(p.name in {"harness-context", "harness-state"} for p in target.rglob("*"))
    assert not any(p.name in {"harness-context", "harness-state"} for p in catalog.rglob("*") if p.is_file())


def test_different_devices_are_refused_without_writing(catalog: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agent = _agent(catalog)
    before = write_context(agent, record(used_tokens=1, written_at_ms=1))
    real_device = walk.device_of

    def staging_on_another_device(fd: int) -> int:
        on_staging = os.path.samestat(os.fstat(fd), os.stat(staging_dir(catalog)))
        return real_device(fd) + (1 if on_staging else 0)

    monkeypatch.setattr(walk, "device_of", staging_on_another_device)
    with pytest.raises(CatalogError, match="different filesystems"):
        write_context(agent, record(used_tokens=2, written_at_ms=2))
    with pytest.raises(CatalogError, match="different filesystems"):
        write_agent_file(agent, "harness-state", b"{}\n")
    assert parse_record(agent.context_path.read_bytes()) == before
    assert os.listdir(staging_dir(catalog)) == []
    assert set(os.listdir(agent.path)) == AGENT_FILES


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "../x", ".hidden", "-flag", "a\x00b", "x" * 129, "sp ace"])
def test_host_and_identity_names_are_one_plain_component(catalog: Path, name: str) -> None:
    with pytest.raises(CatalogError):
        AgentDir(catalog, name, "alice")
    with pytest.raises(CatalogError):
        AgentDir(catalog, "h1", name)
    with pytest.raises(CatalogError):
        check_name("identity", name)


# --- identity walkers: exactly the legacy staging file is passed over ------------------------


def _populated(catalog: Path) -> Path:
    for identity in ("alice", "bob"):
        write_context(_agent(catalog, identity), record(agent=identity))
    return catalog / "agents" / "h1"


def test_walkers_list_hosts_and_identities(catalog: Path) -> None:
    _populated(catalog)
    write_context(_agent(catalog, "carol", host="h2"), record(agent="carol"))
    assert iter_hosts(catalog) == ["h1", "h2"]
    assert iter_identities(catalog, "h1") == ["alice", "bob"]
    assert iter_identities(catalog, "h2") == ["carol"]


def test_walkers_on_an_empty_catalog_find_nothing(catalog: Path) -> None:
    assert iter_hosts(catalog) == []
    assert iter_identities(catalog, "h1") == []


@pytest.mark.parametrize("name", [".harness-context.tmp-1234-0", ".harness-context.tmp-4194304-18446744073709551616"])
def test_identity_walker_passes_over_the_exact_legacy_staging_file(catalog: Path, name: str) -> None:
    host_dir = _populated(catalog)
    (host_dir / name).write_bytes(b'{"partial": ')
    assert iter_identities(catalog, "h1") == ["alice", "bob"]
    assert (host_dir / name).read_bytes() == b'{"partial": '  # left untouched for a live old writer


def _legacy_dir(host_dir: Path) -> None:
    (host_dir / ".harness-context.tmp-12-34").mkdir()


def _legacy_symlink(host_dir: Path) -> None:
    (host_dir / "target").write_text("")
    (host_dir / ".harness-context.tmp-12-34").symlink_to("target")


def _legacy_symlink_only(host_dir: Path) -> None:
    (host_dir / ".harness-context.tmp-12-34").symlink_to("alice/harness-context")


def _legacy_fifo(host_dir: Path) -> None:
    os.mkfifo(host_dir / ".harness-context.tmp-12-34")


def _near_miss(name: str) -> Callable[[Path], None]:
    def make(host_dir: Path) -> None:
        (host_dir / name).write_text("")

    return make


def _symlinked_identity(host_dir: Path) -> None:
    (host_dir / "mallory").symlink_to("alice")


def _fifo(host_dir: Path) -> None:
    os.mkfifo(host_dir / "pipe")


def _socket(host_dir: Path) -> None:
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(host_dir / "sock"))
    finally:
        sock.close()


def _dot_dir(host_dir: Path) -> None:
    (host_dir / ".cache").mkdir()


STRICT_ENTRIES: dict[str, Callable[[Path], None]] = {
    "legacy-name-directory": _legacy_dir,
    "legacy-name-symlink-to-file": _legacy_symlink,
    "legacy-name-symlink-into-agent": _legacy_symlink_only,
    "legacy-name-fifo": _legacy_fifo,
    "near-miss-letter": _near_miss(".harness-context.tmp-12-x"),
    "near-miss-one-number": _near_miss(".harness-context.tmp-12"),
    "near-miss-negative": _near_miss(".harness-context.tmp--12-3"),
    "near-miss-suffix": _near_miss(".harness-context.tmp-12-3.bak"),
    "near-miss-no-dot": _near_miss("harness-context.tmp-12-3"),
    "near-miss-new-staging-style": _near_miss("harness-context.123.abcdef"),
    "generic-dotfile": _near_miss(".DS_Store"),
    "generic-file": _near_miss("notes.txt"),
    "dot-directory": _dot_dir,
    "symlinked-identity": _symlinked_identity,
    "fifo": _fifo,
    "unix-socket": _socket,
}


@pytest.mark.parametrize("entry", list(STRICT_ENTRIES))
def test_identity_walker_stays_strict_on_everything_else(catalog: Path, entry: str) -> None:
    host_dir = _populated(catalog)
    STRICT_ENTRIES[entry](host_dir)
    with pytest.raises(CatalogError, match="unexpected entry"):
        iter_identities(catalog, "h1")


def test_host_walker_does_not_pass_over_the_legacy_name(catalog: Path) -> None:
    _populated(catalog)
    (catalog / "agents" / ".harness-context.tmp-12-34").write_text("")
    with pytest.raises(CatalogError):
        iter_hosts(catalog)


def test_host_walker_refuses_a_symlinked_host(catalog: Path) -> None:
    _populated(catalog)
    (catalog / "agents" / "h9").symlink_to("h1")
    with pytest.raises(CatalogError):
        iter_hosts(catalog)


@pytest.mark.parametrize("walk", ["hosts", "identities"])
def test_walkers_refuse_symlinked_ancestry(catalog: Path, walk: str) -> None:
    (catalog / "elsewhere" / "h1" / "alice").mkdir(parents=True)
    (catalog / "agents").symlink_to("elsewhere")
    with pytest.raises(CatalogError):
        if walk == "hosts":
            iter_hosts(catalog)
        else:
            iter_identities(catalog, "h1")


def test_identity_walker_refuses_a_symlinked_host(catalog: Path) -> None:
    host_dir = _populated(catalog)
    (host_dir.parent / "h9").symlink_to("h1")
    with pytest.raises(CatalogError):
        iter_identities(catalog, "h9")


def test_staging_files_of_dead_writers_are_swept_and_a_live_writers_are_kept(tmp_path: Path) -> None:
    store.write_context(AgentDir(tmp_path, "h", "a"), record())
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    staging = staging_dir(tmp_path)
    (staging / f"harness-context.{int(dead.stdout)}.0a1b2c").write_text("torn")
    (staging / f"harness-context.{os.getpid()}.0a1b2c").write_text("in flight")
    (staging / "unrelated-name").write_text("not ours to judge")
    assert sweep_staging(tmp_path) == 1
    assert sorted(p.name for p in staging.iterdir()) == sorted(
        [f"harness-context.{os.getpid()}.0a1b2c", "unrelated-name"]
    )


def test_a_symlinked_catalog_root_is_the_users_choice_and_is_written_through(tmp_path: Path) -> None:
    real = tmp_path / "real-catalog"
    real.mkdir()
    (tmp_path / "catalog").symlink_to(real)
    store.write_context(AgentDir(tmp_path / "catalog", "h", "a"), record())
    assert (real / "agents" / "h" / "a" / "harness-context").is_file()
    assert read_context(tmp_path / "catalog" / "agents" / "h" / "a" / "harness-context", 1788000100000) is not None


def test_proc_stat_reads_parent_and_start_past_a_name_with_parentheses(tmp_path: Path) -> None:
    import subprocess
    import sys

    from guard.procs import proc_stat

    odd = tmp_path / "a) (b"  # the command name in /proc/<pid>/stat may hold ") ("
    odd.symlink_to(sys.executable)
    child = subprocess.Popen([str(odd), "-c", "import time; time.sleep(5)"])
    try:
        stat = proc_stat(child.pid)
        assert stat is not None and stat.parent == os.getpid() and stat.state in {"R", "S"}
        assert stat == proc_stat(child.pid)  # the start time names this process
        assert proc_stat(os.getpid()) != stat
    finally:
        child.kill()
        child.wait()
    assert proc_stat(child.pid) is None or proc_stat(child.pid) != stat


def test_the_store_is_split_by_job_and_each_name_is_its_own_modules() -> None:
    """guard.store was names, defaults, log layout, /proc probing, locks and atomic replace in one
    module; each job has its own now, and each module exports only what it defines: a reader finds
    a name where it lives, not through a module re-exporting another's."""
    import importlib
    import inspect

    jobs = ("store", "layout", "procs", "walk", "locks", "atomic")
    for job in jobs:
        module = importlib.import_module(f"guard.{job}")
        for name in module.__all__:
            value = getattr(module, name)
            if inspect.isfunction(value) or inspect.isclass(value):
                assert value.__module__ == module.__name__, (job, name, value.__module__)
    assert store.__all__ == ["append_log_line", "remove_context", "write_context"]
