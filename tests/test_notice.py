"""wrapper.readers.notice, the one way `hctx top`, `hctx watch` and the board notice the catalog change; and
the readers it drives reading only what changed (the board's and top's RosterCache)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
import trio
from readers_catalog import HOST, put_record

from wrapper.readers.notice import Changes, Noticed, catalog_changes
from wrapper.readers.roster import now_ms

DEADLINE_S = 30  # generous: the machine may be loaded; nothing here asserts a duration but the stop


async def _until(noticed: Noticed, wanted: object) -> list[Changes]:
    """Every batch taken until one holds `wanted` (an agent, or "whole")."""
    taken = []
    with trio.fail_after(DEADLINE_S):
        async for changes in noticed:
            taken.append(changes)
            if (wanted == "whole" and changes.whole) or wanted in changes.agents:
                return taken
    raise AssertionError("the changes ended")


async def test_the_first_read_is_whole_and_another_once_the_watching_is_armed(tmp_path: Path) -> None:
    put_record(tmp_path, "a")
    async with catalog_changes(tmp_path, reread_s=600) as noticed:
        first = await noticed.take()
        assert first.whole and not noticed.armed.is_set()  # at once, before the watching is in place
        with trio.fail_after(DEADLINE_S):
            await noticed.armed.wait()
        assert (await noticed.take()).whole  # what changed while it was being set up


async def test_a_replaced_record_names_its_agent_and_nothing_else(tmp_path: Path) -> None:
    put_record(tmp_path, "a")
    put_record(tmp_path, "b")
    async with catalog_changes(tmp_path, reread_s=600, debounce_ms=200, step_ms=20) as noticed:
        await noticed.armed.wait()
        await noticed.take()
        staged = tmp_path / "agents" / HOST / "b" / ".staged"
        staged.write_text("{}\n")  # a staging file is no record: it names nobody
        (tmp_path / ".st2").mkdir()
        (tmp_path / ".st2" / "log").write_text("x\n")
        os.replace(staged, tmp_path / "agents" / HOST / "b" / "harness-context")
        taken = await _until(noticed, (HOST, "b"))
    assert all(not changes.whole and changes.agents == {(HOST, "b")} for changes in taken)


async def test_a_new_agent_is_named_though_its_record_lands_before_its_directory_is_watched(tmp_path: Path) -> None:
    """mkdir then write at once, as a first claim does: the directory's own event names the agent."""
    put_record(tmp_path, "a")
    async with catalog_changes(tmp_path, reread_s=600, debounce_ms=200, step_ms=20) as noticed:
        await noticed.armed.wait()
        await noticed.take()
        for n in range(20):
            put_record(tmp_path, f"new-{n}")
        named: set[tuple[str, str]] = set()
        with trio.fail_after(DEADLINE_S):
            while len(named) < 20:
                changes = await noticed.take()
                assert not changes.whole
                named |= changes.agents
    assert named == {(HOST, f"new-{n}") for n in range(20)}


async def test_the_whole_reread_comes_on_time_however_busy_the_records_are(tmp_path: Path) -> None:
    """A record replaced every 20 ms never leaves watchfiles a quiet `reread_s`: the re-read (the
    only way staleness is found) is a clock of its own, not a timeout of the file watching."""
    put_record(tmp_path, "a")
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            put_record(tmp_path, "a", usedPercent=float(time.monotonic_ns() % 100))
            time.sleep(0.02)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.to_thread.run_sync, churn)
        try:
            async with catalog_changes(tmp_path, reread_s=0.5, debounce_ms=200, step_ms=50) as noticed:
                await noticed.armed.wait()
                await noticed.take()
                wholes, started = 0, trio.current_time()
                with trio.fail_after(DEADLINE_S):
                    while wholes < 3:
                        wholes += (await noticed.take()).whole
                elapsed = trio.current_time() - started
        finally:
            stop.set()
    assert elapsed >= 1.0  # three of them, half a second apart


async def test_leaving_stops_the_watching_at_once_whatever_the_reread(tmp_path: Path) -> None:
    put_record(tmp_path, "a")
    async with catalog_changes(tmp_path, reread_s=600) as noticed:
        await noticed.armed.wait()
        started = trio.current_time()
    assert trio.current_time() - started < 5  # a step (50 ms), not the re-read's 600 s


async def test_a_slow_reader_takes_each_agent_once_and_one_whole_reread() -> None:
    noticed = Noticed()
    assert await noticed.take() == Changes(frozenset(), True)  # the first read
    noticed.post([(HOST, "a"), (HOST, "b")])
    noticed.post([(HOST, "a")], whole=True)
    noticed.post([(HOST, "c")])
    assert await noticed.take() == Changes(frozenset({(HOST, "a"), (HOST, "b"), (HOST, "c")}), True)
    noticed.post([])  # nothing: no news
    with trio.move_on_after(0.1) as waited:
        await noticed.take()
    assert waited.cancelled_caught


async def test_a_catalog_that_cannot_be_watched_is_said_and_still_reread(tmp_path: Path) -> None:
    said: list[str] = []
    async with catalog_changes(tmp_path / "gone", reread_s=0.2, warn=said.append) as noticed:
        with trio.fail_after(DEADLINE_S):
            await noticed.armed.wait()
            await noticed.take()
            assert (await noticed.take()).whole
    assert len(said) == 1 and "cannot watch" in said[0] and "gone" in said[0]


# ---------------------------------------------------------------------------------------------
# What the noticed changes make the readers read


def test_the_board_reads_only_the_agents_whose_files_changed(tmp_path: Path) -> None:
    from wrapper.readers.web.feed import Board

    stamp = now_ms() - 5000
    for agent in ("a", "b", "c"):
        put_record(tmp_path, agent, observedAtMs=stamp, writtenAtMs=stamp)
    time.sleep(1.1)  # past the racy second: a file that new is read again at every look
    board = Board(tmp_path, HOST)
    found, _ = board.read_whole(0.0)
    assert sorted(r.row.identity for r in found) == ["a", "b", "c"]
    reads = board._cache.cache.reads
    put_record(tmp_path, "b", usedPercent=91.0, observedAtMs=stamp + 1, writtenAtMs=stamp + 1)
    changed, gone = board.read_agents(frozenset({(HOST, "b"), (HOST, "nobody")}), 1.0)
    assert [(r.row.identity, r.row.context and r.row.context.used_percent) for r in changed] == [("b", 91.0)]
    assert gone == {f"{HOST}/nobody"} and board._cache.cache.reads == reads + 1
    time.sleep(1.1)
    again, _ = board.read_whole(2.0)  # the periodic re-read: every row, and `a` and `c` not read again
    assert len(again) == 3 and board._cache.cache.reads == reads + 2  # `b` once more: it was read racy


def test_top_reads_only_what_changed_and_ticks_the_ages_reading_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from wrapper.readers import top
    from wrapper.readers.top import Screen, View

    clock = [now_ms()]  # top's own: the ages are the clock's, however slow the reads before them
    monkeypatch.setattr(top, "now_ms", lambda: clock[0])
    stamp = clock[0] - 5000
    for agent in ("a", "b"):
        put_record(tmp_path, agent, usedPercent=20.0, observedAtMs=stamp, writtenAtMs=stamp)
    screen = Screen(tmp_path, HOST, False, View())
    screen.read(Changes(frozenset(), whole=True))
    reads = screen.cache.cache.reads
    put_record(tmp_path, "a", usedPercent=97.0, observedAtMs=stamp + 1, writtenAtMs=stamp + 1)
    screen.read(Changes(frozenset({(HOST, "a")}), whole=False))
    assert screen.cache.cache.reads == reads + 1
    frame = "\n".join(screen.frame(132, 30))
    assert "97%" in frame and " 5s " in frame
    clock[0] += 1000
    later = "\n".join(screen.frame(132, 30))  # the ages' tick: projected again, nothing read
    assert " 6s " in later and screen.cache.cache.reads == reads + 1


async def test_follow_reads_each_batch_in_a_worker_thread_one_at_a_time_and_hands_it_on_the_loop(
    tmp_path: Path,
) -> None:
    """The readers' one loop: `read` off the loop (a big catalog never holds it up), never two at
    once (one RosterCache serves them), told when it began; `then` on the loop, in order; `armed`
    once the watching is in place."""
    from wrapper.readers.notice import follow

    put_record(tmp_path, "a")
    loop_thread = threading.get_ident()
    reading, overlapped = threading.Lock(), []
    began: list[float] = []
    took: list[tuple[Changes, int]] = []
    armed, named_b = trio.Event(), trio.Event()

    def read(changes: Changes, started: float) -> tuple[Changes, int]:
        if not reading.acquire(blocking=False):
            overlapped.append(changes)
        began.append(started)
        time.sleep(0.05)
        reading.release()
        return changes, threading.get_ident()

    def then(found: tuple[Changes, int]) -> None:
        assert threading.get_ident() == loop_thread
        took.append(found)
        if (HOST, "b") in found[0].agents:
            named_b.set()

    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: follow(tmp_path, read, then, reread_s=0.1, debounce_ms=200, step_ms=20,
                                              armed=armed.set))  # fmt: skip
            await armed.wait()
            put_record(tmp_path, "b")
            await named_b.wait()
            nursery.cancel_scope.cancel()
    assert took[0][0].whole  # the first read is whole
    assert all(thread != loop_thread for _, thread in took)
    assert overlapped == [] and began == sorted(began) and len(began) >= len(took) >= 3


def test_top_watch_and_the_board_follow_the_catalog_by_the_one_loop() -> None:
    """Each reader hands `follow` its read; none opens the catalog's changes or watches files itself."""
    import ast

    root = Path(__file__).resolve().parent.parent / "wrapper" / "readers"
    for name in ("top.py", "watch.py", "web/feed.py"):
        nodes = list(ast.walk(ast.parse((root / name).read_text())))
        imported = {
            (node.module, alias.name) for node in nodes if isinstance(node, ast.ImportFrom) for alias in node.names
        }
        modules = {module for module, _ in imported} | {
            alias.name for node in nodes if isinstance(node, ast.Import) for alias in node.names
        }
        assert ("wrapper.readers.notice", "follow") in imported, name
        assert ("wrapper.readers.notice", "catalog_changes") not in imported and "watchfiles" not in modules, name


async def test_a_change_written_while_the_loop_is_held_is_noticed_as_soon_as_it_is_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watcher runs in a thread of its own and is armed again the moment it hands a batch over,
    however long the loop takes to look at it (awatch armed it again only once the loop had taken
    the batch: under 1,000 pages a change written meanwhile waited a whole debounce more). Records
    replaced every few ms keep the watcher's batches a whole `debounce_ms` long, as 100 writes a
    second do."""
    # The loop is held well past a debounce, so `b`'s batch is handed over while it is held; once
    # free, `b` is noticed well within a debounce, where awatch took a whole one more. A batch ends
    # at a step without events: 250 ms, so a loaded machine pausing the churn does not end it early.
    debounce_ms, step_ms, hold_s, bound_s = 3000, 250, 8.0, 2.4
    for name in ("a", "b"):
        put_record(tmp_path, name)
    stop = threading.Event()
    freed: list[float] = []
    original = Noticed.post

    def churn() -> None:  # a new path each time: a batch of the same paths stops growing, and ends
        for n in range(20_000):
            if stop.is_set():
                return
            put_record(tmp_path, f"churn-{n}")
            time.sleep(0.004)

    def held_post(self: Noticed, agents: object = (), *, whole: bool = False) -> None:
        named = set(agents)  # type: ignore[call-overload]
        original(self, named, whole=whole)
        if (HOST, "a") in named and not freed:
            threading.Timer(0.3, put_record, (tmp_path, "b")).start()  # written while the loop is held
            time.sleep(hold_s)  # the loop held, as by a round of sends to a thousand pages
            freed.append(time.monotonic())

    monkeypatch.setattr(Noticed, "post", held_post)
    threading.Thread(target=churn, daemon=True).start()
    try:
        async with catalog_changes(tmp_path, reread_s=600, debounce_ms=debounce_ms, step_ms=step_ms) as noticed:
            with trio.fail_after(DEADLINE_S):
                await noticed.armed.wait()
            put_record(tmp_path, "a")
            await _until(noticed, (HOST, "b"))  # `a` is taken first, or with it once the loop is free
            late = time.monotonic() - freed[0]
    finally:
        stop.set()
    assert late < bound_s  # awatch: a whole debounce and more after the loop was free
