"""`hctx scan` of Codex (the spec's `transcripts`): every rollout under `$CODEX_HOME/sessions`.

The latest `token_count` through the Codex producer's own arithmetic, with the window Codex reported
in the rollout (`windowSource: "transcript"`). Its own module: it needs both the rollout reader
(`transcript`) and the producer's arithmetic, and the producer needs the reader's decoder.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path

from guard.record import ContextFields
from sidecar.decoding import Dropped
from sidecar.harnesses.codex.events import RateLimitsUpdated, TokenUsage
from sidecar.harnesses.codex.producer import HeldTimes, merged_rate_limits, merged_times, usage_fields
from sidecar.harnesses.codex.transcript import read_codex_tail, session_build
from sidecar.spec import TranscriptFile, TranscriptReading, WindowSource
from sidecar.transcripts import BackwardLines, ReadAt

__all__ = [
    "codex_home",
    "files",
    "read",
]


def codex_home(environ: Mapping[str, str]) -> Path:
    configured = environ.get("CODEX_HOME")
    return Path(configured) if configured else Path(environ.get("HOME") or Path.home()) / ".codex"


def files(environ: Mapping[str, str]) -> Iterator[Path]:
    """Codex's `sessions/**/rollout-*.jsonl`."""
    for directory, subdirs, names in os.walk(codex_home(environ) / "sessions"):
        subdirs.sort()
        for name in sorted(names):
            if name.startswith("rollout-") and name.endswith(".jsonl"):
                yield Path(directory) / name


def read(file: TranscriptFile, read_at: ReadAt, size: int, windows: Mapping[str, int]) -> TranscriptReading:
    session_id = file.session_id
    tail = read_codex_tail(BackwardLines(read_at, size), session_id or "rollout")
    problems: list[str] = []
    usage = None if tail.usage is None else tail.usage.usage
    limits = None if tail.rate_limits is None else tail.rate_limits.rate_limits
    for refused in (limits, usage):
        if isinstance(refused, Dropped):  # e.g. a count out of range: no reading, and the row says why
            problems.append(f"token_count refused: {refused.reason}")
    reading = ContextFields(harness="codex", observed_at_ms=file.modified_ms)
    if isinstance(usage, TokenUsage) and tail.usage is not None:
        # The producer's own arithmetic on the latest usage, with the rate limits held before it.
        held = merged_rate_limits((None, None), limits) if isinstance(limits, RateLimitsUpdated) else (None, None)
        build = None if tail.session is None else session_build(tail.session)
        at_ms = file.modified_ms if tail.usage.at_ms is None else tail.usage.at_ms
        times: HeldTimes = (None, None)
        if isinstance(limits, RateLimitsUpdated) and tail.rate_limits is not None:  # dated by its own line
            times = merged_times(
                times, limits, file.modified_ms if tail.rate_limits.at_ms is None else tail.rate_limits.at_ms
            )
        reading = usage_fields(usage, at_ms, held_limits=held, held_times=times,
                               version=None if build is None else build.version)  # fmt: skip
    compactions = tail.compactions
    reading = reading.model_copy(
        update={
            "compactions": compactions or 0,
            "last_compaction_ms": tail.latest_compaction_ms,
            # A rollout's compaction line names no trigger.
            "last_compaction_trigger": "unknown" if tail.latest_compaction_ms is not None else None,
        }
    )
    source: WindowSource | None = "transcript" if reading.window_tokens is not None else None
    if tail.session is not None and session_id is None:
        session_id = tail.session.id
    return TranscriptReading(reading, session_id, source, tail.model, compactions, {}, tuple(problems))
