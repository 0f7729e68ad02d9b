"""The sidecar process: channel, transport, write loop and parent watch in one nursery."""

from __future__ import annotations

import logging
import math
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from guard.policy import Write, WriteGuard
from guard.record import Harness
from guard.store import AgentDir, sweep_staging, write_context
from sidecar import channel
from sidecar.pipeline import Pipeline
from sidecar.producers import producer_for
from sidecar.producers.base import Frame
from sidecar.transports import transport_for

log = logging.getLogger("sidecar")

FRAME_QUEUE = 1024
# After the harness is gone, frames already on their way (a last hook process) still land; a
# client that keeps its connection open past this is cut off.
SHUTDOWN_DRAIN_S = 2.0


@dataclass(frozen=True)
class SidecarConfig:
    catalog: Path
    host: str
    agent: str
    harness: Harness
    incarnation: str
    channel: Path
    lifeline_fd: int | None = None
    ready_fd: int | None = None
    transport: dict[str, Any] = field(default_factory=dict)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Writer:
    """The only holder of the agent's lock and staging directory in this process."""

    def __init__(self, config: SidecarConfig) -> None:
        self.agent_dir = AgentDir(config.catalog, config.host, config.agent)
        if swept := sweep_staging(config.catalog):
            log.info("removed %d staging files of dead writers", swept, extra={"event": "staging-swept"})
        guard = WriteGuard(config.agent, config.incarnation)
        self.pipeline = Pipeline(producer_for(config.harness), guard)

    def commit(self, writes: list[Write]) -> None:
        for write in writes:
            try:
                record = write_context(self.agent_dir, write.record)
            except OSError as exc:
                # Forget what was written so the next reading is written afresh: nothing lost,
                # nothing re-stamped.
                self.pipeline.guard.last = None
                log.error("write failed: %s", exc, extra={"event": "write-failed", "reason": write.reason})
                continue
            log.info(
                "wrote %s",
                write.reason,
                extra={
                    "event": "write",
                    "reason": write.reason,
                    "usedTokens": record.used_tokens,
                    "windowTokens": record.window_tokens,
                    "usedPercent": record.used_percent,
                    "compactions": record.compactions,
                    "observedAtMs": record.observed_at_ms,
                    "writtenAtMs": record.written_at_ms,
                },
            )

    async def run(self, frames: trio.MemoryReceiveChannel[Frame]) -> None:
        """Feed frames as they come; sleep until the heartbeat is due when nothing comes."""
        guard = self.pipeline.guard
        async with frames:
            while True:
                due = guard.heartbeat_due_ms()
                deadline = math.inf if due is None else trio.current_time() + (due - now_ms()) / 1000
                with trio.move_on_at(deadline):
                    try:
                        frame = await frames.receive()
                    except trio.EndOfChannel:
                        return
                    self.commit(self.pipeline.feed(frame, now_ms()))
                    continue
                self.commit(self.pipeline.tick(now_ms()))


async def wait_for_eof(fd: int) -> None:
    """Returns when the other end of the lifeline pipe is closed: the wrapper exited or died."""
    os.set_blocking(fd, False)
    while True:
        await trio.lowlevel.wait_readable(fd)
        try:
            if not os.read(fd, 4096):
                return
        except BlockingIOError:
            continue


async def run_sidecar(config: SidecarConfig) -> None:
    writer = Writer(config)
    send, receive = trio.open_memory_channel[Frame](FRAME_QUEUE)

    def submit(frame: Frame) -> None:
        try:
            send.send_nowait(frame)
        except trio.WouldBlock:
            log.warning("frame dropped: queue full", extra={"event": "frame-dropped", "why": "queue full"})
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            log.info("frame after shutdown dropped", extra={"event": "frame-dropped", "why": "shutdown"})

    log.info(
        "sidecar started",
        extra={"event": "start", "harness": config.harness, "incarnation": config.incarnation,
               "pid": os.getpid(), "channel": str(config.channel)},
    )  # fmt: skip
    async with trio.open_nursery() as outer:
        outer.start_soon(writer.run, receive)
        async with trio.open_nursery() as inputs:
            transport = transport_for(config.harness)
            if transport is not None:
                inputs.start_soon(transport, config.transport, submit)
            session_over = trio.Event()
            async with trio.open_nursery() as channel_nursery:
                await channel_nursery.start(channel.serve, config.channel, submit, session_over)
                _signal_ready(config.ready_fd)
                await _until_session_ends(config.lifeline_fd)
                session_over.set()
                channel_nursery.cancel_scope.deadline = trio.current_time() + SHUTDOWN_DRAIN_S
            inputs.cancel_scope.cancel()
        await send.aclose()
    log.info("sidecar exiting", extra={"event": "exit", "dropped": writer.pipeline.dropped})


def _signal_ready(fd: int | None) -> None:
    if fd is not None:
        os.write(fd, b"ready\n")
        os.close(fd)


async def _until_session_ends(lifeline_fd: int | None) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGHUP, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:

            async def on_signal() -> None:
                async for signum in signals:
                    log.info("signal %s", signal.Signals(signum).name, extra={"event": "signal"})
                    nursery.cancel_scope.cancel()

            nursery.start_soon(on_signal)
            if lifeline_fd is not None:
                await wait_for_eof(lifeline_fd)
                log.info("wrapper gone", extra={"event": "lifeline-closed"})
                nursery.cancel_scope.cancel()
