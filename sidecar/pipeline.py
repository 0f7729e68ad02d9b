"""Events to writes: a producer feeding a write guard. Sans-I/O, shared by sidecar and replay."""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from dataclasses import dataclass, field

from guard.account import Account
from guard.errors import FrameRejected
from guard.policy import Write, WriteGuard
from sidecar import logs
from sidecar.decoding import Dropped
from sidecar.producer import Producer, out_of_domain

__all__ = [
    "Pipeline",
]

log = logging.getLogger(__name__)


@dataclass
class Pipeline:
    producer: Producer
    guard: WriteGuard
    # The account the harness's own login states (issue 29), read by the wrapper at launch: every
    # reading carries it. A producer that states one itself keeps its own.
    account: Account | None = None
    # Drop events this pipeline saw (replay's tally), and the frames they stand for by where (the
    # sidecar's exit line): one sidecar, one pipeline, so a count is never another run's.
    dropped: int = field(default=0, init=False)
    drops: Counter[str] = field(default_factory=Counter, init=False)

    def feed(self, event: object, now_ms: int) -> list[Write]:
        """The writes this decoded event calls for, in order; a `Dropped` one is logged and counted.

        The guard takes each as written at once, so the next reading of the same frame is judged
        against it; a caller whose write then fails keeps that write and retries it (sidecar.app).
        """
        writes = self.tick(now_ms)
        if isinstance(event, Dropped):
            self._drop(event.reason, event.where, event.count)
            return writes
        try:
            readings = self.producer.feed(event, now_ms)
        except FrameRejected as exc:
            self._drop(str(exc), "producer")
            return writes
        except Exception:  # a producer bug must cost one frame, never the sidecar
            self.count_drop("producer")
            log.exception("producer failed on a frame; dropped", extra={"event": "frame-dropped"})
            return writes
        for reading in readings:
            if self.account is not None and reading.fields.account is None:
                stamped = reading.fields.model_copy(update={"account": self.account})
                reading = dataclasses.replace(reading, fields=stamped)
            if (problem := out_of_domain(reading.fields)) is not None:
                self._drop(problem, "producer")
                continue
            write = self.guard.offer(reading, now_ms)
            if write is not None:
                self.guard.committed(write)
                writes.append(write)
        return writes

    def count_drop(self, where: str, count: int = 1) -> None:
        """Count a drop of `count` frames at `where` (a caller that logs it its own way)."""
        self.dropped += 1
        self.drops[where] += count

    def _drop(self, why: str, where: str, count: int = 1) -> None:
        self.count_drop(where, count)
        extra = {"event": "frame-dropped", "where": where, "why": why, "count": count}
        logs.log.warning("frame dropped: %s", why, extra=extra)  # rate-limited like every warning

    def tick(self, now_ms: int) -> list[Write]:
        write = self.guard.tick(now_ms)
        if write is None:
            return []
        self.guard.committed(write)
        return [write]
