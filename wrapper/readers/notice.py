"""Noticing the catalog change: the one way `hctx top`, `hctx watch` and the board learn that an
agent's record or claim was replaced, and the one loop they follow the catalog by (`follow`).

File events come from watchfiles (inotify on Linux), watched in a thread of their own;
each batch is turned into the agents it names. Beside them, a whole re-read is asked for at the
start, once the file watching is armed (whatever changed before it was is caught by that read),
every `reread_s` seconds whatever the files do (staleness is time-based, and an event may be
missed), and for a change no agent's path explains. What a slow reader has not taken yet is
coalesced: it takes every agent named since, once, and at most one whole re-read.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

from guard.constants import AGENTS_DIR_NAME, REPLICATED_RECORD_NAMES

if TYPE_CHECKING:  # trio and watchfiles load when a follower runs, not with every `hctx`
    import threading

    from watchfiles import Change

__all__ = [
    "ARM_PROBE_MS",
    "Agent",
    "Changes",
    "InParts",
    "Noticed",
    "agent_of",
    "catalog_changes",
    "follow",
]

# How long one wait for file events lasts before watchfiles says "nothing yet": its first answer
# proves the watching armed, and a stop is seen within a `step` of it however long this is.
ARM_PROBE_MS = 500

Agent = tuple[str, str]  # (host, identity)
_Found = TypeVar("_Found")
_Part = TypeVar("_Part", covariant=True)


@dataclass(frozen=True, slots=True)
class Changes:
    """What changed since the reader last took: `agents` whose record or claim was replaced (or
    removed), and whether to read the `whole` catalog instead of (or beside) them."""

    agents: frozenset[Agent]
    whole: bool


def _is_record(path: str) -> bool:
    return os.path.basename(path) in REPLICATED_RECORD_NAMES


def agent_of(catalog: Path, path: str) -> Agent | None:
    """(host, identity) of a record path watchfiles reported; None for any other path."""
    try:
        parts = Path(path).relative_to(catalog).parts
    except ValueError:
        return None
    if len(parts) != 4 or parts[0] != AGENTS_DIR_NAME or parts[3] not in REPLICATED_RECORD_NAMES:
        return None
    return parts[1], parts[2]


def _noticed(catalog: Path, path: str) -> Agent | bool:
    """What a changed path asks for: its agent (a record, or the agent's directory itself: a new
    agent's record may land before its directory is watched), True for a whole re-read (a host
    directory, a record name anywhere else), False for nothing (any other file)."""
    if _is_record(path):
        return agent_of(catalog, path) or True
    try:
        parts = Path(path).relative_to(catalog).parts
    except ValueError:
        return False
    if not parts or parts[0] != AGENTS_DIR_NAME or len(parts) > 3:
        return False
    return (parts[1], parts[2]) if len(parts) == 3 else True


class Noticed:
    """The changes not yet taken, and the reader's side: `async for changes in noticed`."""

    def __init__(self) -> None:
        import trio

        self.armed = trio.Event()  # the file watching is in place (or failed, and said so)
        self._agents: set[Agent] = set()
        self._whole = True  # the first read
        self._news = trio.Event()
        self._news.set()

    def post(self, agents: Iterable[Agent] = (), *, whole: bool = False) -> None:
        before = len(self._agents)
        self._agents.update(agents)
        if whole or len(self._agents) != before:
            self._whole = self._whole or whole
            self._news.set()

    @property
    def pending(self) -> bool:
        """Whether `take` would return at once (a reader between two parts of its own work asks)."""
        return self._news.is_set()

    async def take(self) -> Changes:
        import trio

        await self._news.wait()
        self._news = trio.Event()
        taken = Changes(frozenset(self._agents), self._whole)
        self._agents, self._whole = set(), False
        return taken

    def __aiter__(self) -> Noticed:
        return self

    async def __anext__(self) -> Changes:
        return await self.take()


def _warn(message: str) -> None:
    print(f"hctx: {message}", file=sys.stderr, flush=True)


async def _follow_files(
    catalog: Path,
    noticed: Noticed,
    stop: threading.Event,
    *,
    debounce_ms: int,
    step_ms: int,
    warn: Callable[[str], None],
) -> None:
    """The file events, watched in a thread of their own that hands each batch to the loop without
    waiting for it: the watcher is armed again the moment a batch is out. (watchfiles' `awatch`
    arms it again only once the loop has taken the batch and started a worker thread for the next
    wait; a loop busy sending to a thousand pages took 0.1-0.3 s to do so, and every change
    written meanwhile waited for the wait after it: 0.5-1 s from a write to its notice.)"""
    import trio
    from watchfiles import watch

    token = trio.lowlevel.current_trio_token()

    def arrived(batch: set[tuple[Change, str]]) -> None:  # on the loop, in the order the batches came
        if not noticed.armed.is_set():
            noticed.armed.set()
            noticed.post(whole=True)  # what changed before the watching was in place
        asked = {_noticed(catalog, path) for _, path in batch}
        noticed.post((agent for agent in asked if isinstance(agent, tuple)), whole=True in asked)

    def watching() -> None:
        # No watch_filter: a batch of only other files (the sidecars' logs) is still an answer, so
        # the first one proves the watching armed however busy the tree is.
        changes = watch(
            catalog, watch_filter=None, stop_event=stop, debounce=debounce_ms, step=step_ms,
            rust_timeout=ARM_PROBE_MS, yield_on_timeout=True, raise_interrupt=False,
        )  # fmt: skip
        for batch in changes:
            try:
                token.run_sync_soon(arrived, batch)
            except trio.RunFinishedError:  # the loop is gone: nobody to tell
                return

    try:
        # Abandoned on cancel (it cannot be cancelled): `stop`, set first, ends it within a step.
        await trio.to_thread.run_sync(watching, abandon_on_cancel=True)
    except OSError as exc:  # no inotify left (fs.inotify.max_user_watches), a catalog gone
        warn(f"cannot watch {catalog} for changes ({exc}); reading it again every re-read only")
        noticed.armed.set()


async def _reread_every(seconds: float, noticed: Noticed) -> None:
    import trio

    while True:
        await trio.sleep(seconds)
        noticed.post(whole=True)


@asynccontextmanager
async def catalog_changes(
    catalog: Path,
    *,
    reread_s: float,
    debounce_ms: int = 400,
    step_ms: int = 50,
    warn: Callable[[str], None] = _warn,
) -> AsyncIterator[Noticed]:
    """The catalog's changes while the block runs: a whole re-read first, then each batch of file
    events as the agents they name (watchfiles waits `step_ms` of quiet, at most `debounce_ms`,
    before it reports a batch), and a whole re-read every `reread_s` and once the watching is armed.
    Leaving the block stops the watching within `step_ms`."""
    import threading

    import trio

    noticed = Noticed()
    stop = threading.Event()  # set on the loop, read by the watching thread
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: _follow_files(catalog, noticed, stop, debounce_ms=debounce_ms, step_ms=step_ms,
                                                 warn=warn))  # fmt: skip
        nursery.start_soon(_reread_every, reread_s, noticed)
        try:
            yield noticed
        finally:
            stop.set()  # the watching thread sees it within a step; it cannot be cancelled
            nursery.cancel_scope.cancel()


class InParts(Protocol[_Part]):
    """A reader whose whole read goes in parts (the board: at 10,000 agents one whole read held the
    changed agents' reads up ~0.7 s): `begin` asks for a whole read, `part` reads its next part,
    both in the worker thread; `under_way` (on the loop) says whether a part is left."""

    @property
    def under_way(self) -> bool: ...

    def begin(self, started: float) -> _Part: ...

    def part(self, started: float) -> _Part: ...


async def follow(
    catalog: Path,
    read: Callable[[Changes, float], _Found],
    then: Callable[[_Found], object],
    *,
    reread_s: float,
    debounce_ms: int = 400,
    step_ms: int = 50,
    pace_s: float = 0.0,
    held: AbstractAsyncContextManager[object] | None = None,
    armed: Callable[[], object] = lambda: None,
    warn: Callable[[str], None] = _warn,
    parts: InParts[_Found] | None = None,
) -> None:
    """Follow the catalog until cancelled: each batch of `catalog_changes` is read by `read` in a
    worker thread (so a catalog of thousands of agents never holds up the loop), one read at a time
    (so one RosterCache serves them all), and what it found is handed to `then` on the loop.
    `read` is also told when its read began, on trio's clock (of two reads of one agent, the later
    one's wins). `held`: a lock the read and `then` hold together (the top view projects its frames
    from the cache the read fills). `pace_s`: at least this long between two reads, however busy the
    catalog. `armed`: called once the file watching is in place. `parts`: a whole read is begun
    there instead (the named agents still go to `read`), and read a part at a time whenever no
    change waits: a change noticed meanwhile is read before the next part."""
    import trio

    async def when_armed(noticed: Noticed) -> None:
        await noticed.armed.wait()
        armed()

    async def reading(step: Callable[[float], _Found]) -> None:
        async with held or nullcontext():
            then(await trio.to_thread.run_sync(step, trio.current_time()))

    async with catalog_changes(catalog, reread_s=reread_s, debounce_ms=debounce_ms, step_ms=step_ms,
                               warn=warn) as noticed, trio.open_nursery() as nursery:  # fmt: skip
        nursery.start_soon(when_armed, noticed)
        while True:
            if parts is not None and parts.under_way and not noticed.pending:
                await reading(parts.part)
                continue
            changes = await noticed.take()
            if parts is None or not changes.whole:
                await reading(partial(read, changes))
            else:
                if changes.agents:
                    await reading(partial(read, Changes(changes.agents, whole=False)))
                await reading(parts.begin)
            if pace_s:
                await trio.sleep(pace_s)
