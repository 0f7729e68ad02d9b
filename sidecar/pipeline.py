"""Frames to writes: a producer feeding a write guard. Sans-I/O, shared by sidecar and replay."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from guard.policy import Write, WriteGuard
from sidecar import logs
from sidecar.logs import drop
from sidecar.producers.base import Frame, FrameRejected, Producer, out_of_domain

log = logging.getLogger(__name__)


@dataclass
class Pipeline:
    producer: Producer
    guard: WriteGuard
    dropped: int = field(default=0, init=False)

    def feed(self, frame: Frame, now_ms: int) -> list[Write]:
        """The writes this frame calls for, in order.

        The guard takes each as written at once, so the next reading of the same frame is judged
        against it; a caller whose write then fails keeps that write and retries it (sidecar.app).
        """
        writes = self.tick(now_ms)
        try:
            readings = self.producer.feed(frame, now_ms)
        except FrameRejected as exc:
            self._drop(str(exc))
            return writes
        except Exception:  # a producer bug must cost one frame, never the sidecar
            self.dropped += 1
            logs.drops["producer"] += 1
            log.exception("producer failed on a frame; dropped", extra={"event": "frame-dropped"})
            return writes
        for reading in readings:
            if (problem := out_of_domain(reading.fields)) is not None:
                self._drop(problem)
                continue
            write = self.guard.offer(reading, now_ms)
            if write is not None:
                self.guard.committed(write)
                writes.append(write)
        return writes

    def _drop(self, why: str) -> None:
        """This pipeline's count (replay's tally) and the process's (the sidecar's exit line)."""
        self.dropped += 1
        drop("producer", why)

    def tick(self, now_ms: int) -> list[Write]:
        write = self.guard.tick(now_ms)
        if write is None:
            return []
        self.guard.committed(write)
        return [write]
