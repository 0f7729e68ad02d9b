"""The interactive Codex seat: follow the rollout file the wrapped TUI writes.

The TUI (`codex`, `codex exec`, anything but `app-server`) offers no stream to tap, but it writes
every `token_count` event to `$CODEX_HOME/sessions/YYYY/MM/DD/rollout-<time>-<thread>.jsonl`. This
transport follows the rollout the wrapped Codex itself holds open for writing: the wrapper names
itself as `rootPid`, and the first rollout a process below it (the `codex` node launcher's native
binary) holds open for writing (`/proc/<pid>/fdinfo` flags) names the codex process, the holder
nearest the root; from then on only that process's rollouts are this seat's, whichever seat in the
same directory is newer, and never a file a tool it runs opens (`exec 3<OTHER`, or even for
appending). A rollout that process opens that it did not hold at the last look (the TUI's `/new`,
a `/resume`, a file closed and opened again) takes over; a closed one stays followed. A rollout started before
the launch (`codex resume`) is followed from its end, after its newest reading, as the app-server
replays one on resume: its history is not this launch's. Without `rootPid`, the newest rollout
whose `session_meta` is stamped at or after the launch and names the launch's cwd is followed.
Either way it is followed as it grows, its bytes through the `rollout` wire's decoder
(`sidecar.harnesses.codex.transcript.RolloutDecoder`), whose lines make the very typed events the app-server's
messages decode to, so the record is the one the app-server path would publish.

    config = {"mode": "rollout", "codexHome": "/home/u/.codex", "cwd": "/work/repo", "startedAtMs": 1795994906000,
              "rootPid": 4242}

Polling at POLL_MIN_S until a rollout is found, then with back-off to POLL_MAX_S while nothing changes.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

import trio
import trio.lowlevel

from guard.procs import proc_stat
from sidecar.harnesses.codex.events import ROLLOUT
from sidecar.harnesses.codex.producer import Rollout
from sidecar.harnesses.codex.transcript import (
    RolloutDecoder,
    is_subagent_source,
    read_codex_tail,
    rollout_event,
    tail_events,
)
from sidecar.producer import instant_ms
from sidecar.spec import Stream, Streams
from sidecar.transcripts import BackwardLines

__all__ = [
    "LAUNCH_SLACK_MS",
    "POLL_MAX_S",
    "POLL_MIN_S",
    "READ_CHUNK",
    "RESCAN_EVERY_S",
    "SESSION_META_LIMIT",
    "Candidate",
    "RolloutFollower",
    "find_rollout",
    "follow_rollout",
    "held_rollouts",
    "read_from",
    "read_session_meta",
]

log = logging.getLogger(__name__)

POLL_MIN_S: Final = 0.2
POLL_MAX_S: Final = 2.0
# How often, while following one rollout, the sessions tree is looked at for a newer one.
RESCAN_EVERY_S: Final = 5.0
READ_CHUNK: Final = 1024 * 1024
# Codex stamps session_meta a little after the process starts; a clock step or a coarse mtime
# should not make the launch's own rollout look older than the launch.
LAUNCH_SLACK_MS: Final = 5_000
# session_meta carries the base instructions, tens of kilobytes; its line is read up to this much.
SESSION_META_LIMIT: Final = 4 * 1024 * 1024
_FILE_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True)
class Candidate:
    path: Path
    thread_id: str
    started_at_ms: int


def _date_dirs(sessions: Path, started_at_ms: int, now_ms: int) -> list[Path]:
    """The YYYY/MM/DD directories a rollout of this launch can be in (local or UTC dates, either
    side of midnight), instead of walking months of history on every poll."""
    start = datetime.fromtimestamp(started_at_ms / 1000, tz=UTC) - timedelta(days=1)
    end = datetime.fromtimestamp(now_ms / 1000, tz=UTC) + timedelta(days=1)
    days: list[Path] = []
    day = start
    while day.date() <= end.date():
        days.append(sessions / f"{day.year:04d}" / f"{day.month:02d}" / f"{day.day:02d}")
        day += timedelta(days=1)
    return days


def read_session_meta(path: Path) -> dict[str, Any] | None:
    """The first line's `session_meta` payload, or None (not yet written, not a rollout, hostile)."""
    try:
        fd = os.open(path, _FILE_FLAGS)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        head = os.pread(fd, SESSION_META_LIMIT, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    newline = head.find(b"\n")
    if newline < 0:
        return None  # the first line is still being written (or is larger than any header)
    event = rollout_event(head[:newline], 0, "")
    if event is None or event.session is None:
        return None
    return event.session.model_dump()


def find_rollout(config: Rollout, now_ms: int, rejected: set[Path]) -> Candidate | None:
    """The newest rollout of this launch: session_meta stamped at or after the launch (less slack),
    in the launch's cwd when one is configured, and not a subagent's own thread."""
    sessions = Path(config.codex_home) / "sessions"
    oldest = config.started_at_ms - LAUNCH_SLACK_MS
    best: Candidate | None = None
    for directory in _date_dirs(sessions, config.started_at_ms, now_ms):
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        for name in names:
            path = directory / name
            if path in rejected or not (name.startswith("rollout-") and name.endswith(".jsonl")):
                continue
            try:
                if path.lstat().st_mtime_ns // 1_000_000 < oldest:
                    continue  # untouched since before the launch: not ours, but may be written to later
            except OSError:
                continue
            meta = read_session_meta(path)
            if meta is None:
                continue  # perhaps not written yet: looked at again next time
            started = instant_ms(meta.get("timestamp"))
            if started is None or started < oldest or is_subagent_source(meta.get("source")):
                rejected.add(path)
                continue
            if config.cwd is not None and meta.get("cwd") != config.cwd:
                rejected.add(path)
                continue
            if best is None or started > best.started_at_ms:
                best = Candidate(path, str(meta.get("id") or ""), started)
    return best


def held_rollouts(root_pid: int | None, sessions: Path, writer: int | None = None) -> dict[Path, tuple[int, int]]:
    """The rollout files under `sessions` held open *for writing* by `root_pid` or a descendant (any
    process, for None), each with its holder nearest the root (depth, pid); only `writer`'s, when given. A tool
    the harness runs that opens another session's rollout to read it (`exec 3<FILE`) holds nothing
    here; this process's own reads aside. Processes that end while looked at are skipped."""
    pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    tree = _descendants(root_pid, pids) if root_pid is not None else dict.fromkeys(pids, 0)
    prefix = os.path.realpath(sessions) + os.sep
    held: dict[Path, tuple[int, int]] = {}
    for pid, depth in tree.items():
        if pid == os.getpid() or (writer is not None and pid != writer):
            continue
        for target in _written_files(pid):
            name = os.path.basename(target)
            if target.startswith(prefix) and name.startswith("rollout-") and name.endswith(".jsonl"):
                path = Path(target)
                if path not in held or (depth, pid) < held[path]:
                    held[path] = (depth, pid)
    return held


def _descendants(root_pid: int, pids: list[int]) -> dict[int, int]:
    """`root_pid` and every process below it, by the parents `/proc/<pid>/stat` names, with their depth."""
    children: dict[int, list[int]] = {}
    for pid in pids:
        if (proc := proc_stat(pid)) is not None:
            children.setdefault(proc.parent, []).append(pid)
    found: dict[int, int] = {}
    pending = [(root_pid, 0)]
    while pending:
        pid, depth = pending.pop()
        if pid not in found:  # a pid reused while looked at must not loop
            found[pid] = depth
            pending.extend((child, depth + 1) for child in children.get(pid, []))
    return found


def _written_files(pid: int) -> list[str]:
    """What `pid`'s descriptors open for writing name (their flags in /proc/<pid>/fdinfo)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return []
    targets = []
    for fd in fds:
        try:
            with open(f"/proc/{pid}/fdinfo/{fd}", "rb") as info:
                flags = next((line.split()[1] for line in info if line.startswith(b"flags:")), b"0")
            if int(flags, 8) & os.O_ACCMODE == os.O_RDONLY:
                continue
            targets.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except (OSError, ValueError, IndexError):
            continue
    return targets


class RolloutFollower:
    """Following one rollout: its thread and how far into it. Its bytes are the `rollout` wire's:
    `RolloutDecoder` frames their lines and makes the Codex producer's typed events."""

    def __init__(self, thread_id: str, offset: int = 0) -> None:
        self.thread_id = thread_id
        self.decoder = RolloutDecoder(thread_id, offset=offset)

    @property
    def offset(self) -> int:
        """Of the next byte to be fed."""
        return self.decoder.offset

    def feed(self, data: bytes) -> list[object]:
        """Events for every line `data` completes; a partial last line waits for its newline."""
        return self.decoder.receive_data(data)


def read_from(path: Path, offset: int) -> tuple[bytes, int] | None:
    """(new bytes from `offset`, file size), or None when the file is gone or not regular."""
    try:
        fd = os.open(path, _FILE_FLAGS)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        if info.st_size <= offset:
            return b"", info.st_size
        return os.pread(fd, min(READ_CHUNK, info.st_size - offset), offset), info.st_size
    except OSError:
        return None
    finally:
        os.close(fd)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class _Seat:
    """The follow loop's state: which rollout, how far into it."""

    settings: Rollout
    streams: Streams
    rejected: set[Path] = field(default_factory=set)
    held: set[Path] = field(default_factory=set)  # the rollouts the harness held at the last look
    # The codex process itself (pid, start time): the nearest holder of the first rollout followed.
    # Only its own rollouts are followed after that, never a file a tool it runs has open.
    writer: tuple[int, int] | None = None
    path: Path | None = None
    follower: RolloutFollower | None = None
    stream: Stream | None = None  # the follower's bytes through its decoder, each event submitted

    def rescan(self) -> None:
        if self.settings.root_pid is None:
            found = find_rollout(self.settings, _now_ms(), self.rejected)
        else:
            found = self._newly_held(self.settings.root_pid)
        if found is not None and found.path != self.path:
            self._follow(found)

    def _follow(self, found: Candidate) -> None:
        log.info("following rollout %s", found.path, extra={"event": "rollout-followed", "path": str(found.path)})
        thread = found.thread_id or found.path.stem
        offset = 0
        if found.started_at_ms < self.settings.started_at_ms - LAUNCH_SLACK_MS:
            offset = self._resume(found.path, thread)
        self.path = found.path
        self._start(RolloutFollower(thread, offset))

    def _start(self, follower: RolloutFollower) -> None:
        self.follower = follower
        self.stream = self.streams.open(ROLLOUT, follower.decoder)

    def _sessions(self) -> Path:
        return Path(self.settings.codex_home) / "sessions"

    def _newly_held(self, root_pid: int) -> Candidate | None:
        """The newest-started rollout the codex process opened for writing since the last look, not a
        subagent's; before the first, the one nearest the root of the harness's tree is that process."""
        writer = self.writer
        if writer is not None and ((proc := proc_stat(writer[0])) is None or proc.started != writer[1]):
            writer = None  # it ended (a relaunched codex below the same wrapper): found again
        holders = held_rollouts(root_pid, self._sessions(), None if writer is None else writer[0])
        if writer is None and holders:
            nearest = min(holders.values())[1]
            holders = {path: holder for path, holder in holders.items() if holder[1] == nearest}
        held = set(holders)
        newest: Candidate | None = None
        for path in held - self.held:
            meta = read_session_meta(path)
            if meta is None:
                held.discard(path)  # its header is not written yet: looked at again next time
                continue
            started = instant_ms(meta.get("timestamp"))
            if started is None or is_subagent_source(meta.get("source")):
                continue
            if newest is None or started > newest.started_at_ms:
                newest = Candidate(path, str(meta.get("id") or ""), started)
        if writer is None and newest is not None and (proc := proc_stat(pid := holders[newest.path][1])) is not None:
            self.writer = (pid, proc.started)
        self.held = held
        return newest

    def _resume(self, path: Path, thread_id: str) -> int:
        """A rollout of an earlier session: its newest reading now, then only what is appended from
        the offset returned (0 when the file could not be read: then all of it)."""
        try:
            fd = os.open(path, _FILE_FLAGS)
        except OSError:
            return 0
        try:
            size = os.fstat(fd).st_size
            last = os.pread(fd, min(size, READ_CHUNK), max(size - READ_CHUNK, 0))
            end = size - len(last) + last.rfind(b"\n") + 1  # a line still being written is read whole, later
            lines = BackwardLines(lambda offset, length: os.pread(fd, length, offset), end)
            tail = read_codex_tail(lines, thread_id)
        except OSError:
            return 0
        finally:
            os.close(fd)
        for _, event in tail_events(tail):
            self.streams.submit(event)
        return end

    def read_some(self) -> bool | None:
        """Submit what one read of the rollout completes; None when there was nothing new."""
        if self.path is None or self.follower is None or self.stream is None:
            return None
        chunk = read_from(self.path, self.follower.offset)
        if chunk is None:
            return None
        data, size = chunk
        if size < self.follower.offset:  # truncated or replaced: start over
            self._start(RolloutFollower(self.follower.thread_id))
            return True
        if not data:
            return None
        self.stream.receive_data(data)
        return True

    def drain(self) -> None:
        """Everything written so far, synchronously: the last turn of a seat that just ended."""
        if self.path is None:
            self.rescan()
        if self.path is None and self.settings.root_pid is not None:
            # A session over before a look saw its rollout held (a `codex exec` of a fraction of a
            # second): the launch's rule, over the rollouts no live process holds, so another seat's
            # running session is never taken for this one.
            found = find_rollout(self.settings, _now_ms(), self.rejected | set(held_rollouts(None, self._sessions())))
            if found is not None:
                self._follow(found)
        while self.read_some():
            pass


async def follow_rollout(settings: Rollout, streams: Streams) -> None:
    """Find this launch's rollout and submit the Codex events its lines make, until cancelled.

    When cancelled (the session ended), whatever the rollout gained since the last poll is still
    read and submitted before returning: a `codex exec` that ends a second after its only turn
    must not lose that turn to the poll interval.
    """
    seat = _Seat(settings, streams)
    delay = POLL_MIN_S
    next_rescan = 0.0
    try:
        while True:
            if seat.path is None or trio.current_time() >= next_rescan:
                next_rescan = trio.current_time() + RESCAN_EVERY_S
                seat.rescan()
            progressed = False
            while seat.read_some():
                progressed = True
                await trio.lowlevel.checkpoint()  # a long backlog must not starve the write loop
            delay = POLL_MIN_S if progressed or seat.path is None else min(delay * 2, POLL_MAX_S)
            await trio.sleep(delay)
    finally:
        seat.drain()  # no checkpoint in it, so it runs to the end even under cancellation
