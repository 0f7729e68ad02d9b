"""The write policy (HC-R09, HC-R10): bucket, compaction edge, exhaustion edge, rate-limit edge,
heartbeat.

The rate-limit edge (issue 35): a reading carrying the harness's newest account limits
(`Reading.rate_limits_edge`) that entered another 1% bucket of either window, or state another
reset, than the record's is written, whatever its context bucket. It is
bounded as the context bucket is: at most one write per window per percent, plus one per reset, so
a harness restating a float (Claude 2.1.250's 42.370000000000005) never writes on its noise.

A producer hands the guard `Reading`s; the guard decides which become records. It never stamps
`observedAtMs` itself, so a record can only age, never look refreshed without a new reading.

Subagent rows (issue 28): a subagent crossing a bucket, appearing with numbers or finishing is a
change, but one that changes nothing of the agent's own is held for SUBAGENT_QUANTUM_MS, and every
subagent change of that quantum lands as one write: the child's last reading and its finish,
parallel children reporting together, or the parent's own next write, which carries them all.
Nothing is hidden: the held rows are written when the quantum ends at the latest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from guard.constants import (
    HARNESS_CONTEXT_BUCKET_PERCENT,
    HARNESS_CONTEXT_FUTURE_SKEW_MS,
    HARNESS_CONTEXT_HEARTBEAT_MS,
)
from guard.errors import Unusable
from guard.record import ContextFields, HarnessContext, RateLimits

__all__ = [
    "HEARTBEAT_MAX_S",
    "HEARTBEAT_MIN_S",
    "SUBAGENT_QUANTUM_MS",
    "Bucket",
    "RateLimitBucket",
    "Reading",
    "Write",
    "WriteGuard",
    "WriteReason",
    "bucket",
    "heartbeat_seconds",
    "rate_limit_bucket",
    "subagent_buckets",
    "windows_at_limit",
]

WriteReason = Literal["compaction", "bucket", "exhaustion", "rate-limits", "prompt-cache", "heartbeat"]

# How long a change of the subagent rows alone waits for the changes that come with it.
SUBAGENT_QUANTUM_MS = 2_000

# The heartbeat a test or a diagnosis may ask for (`HCTX_HEARTBEAT_S`, the sidecar's
# `--heartbeat-s`): whole seconds, never longer than the spec's, whose readers take a record older
# than a few heartbeats as stale.
HEARTBEAT_MIN_S = 1
HEARTBEAT_MAX_S = HARNESS_CONTEXT_HEARTBEAT_MS // 1000


def heartbeat_seconds(text: str) -> int:
    """A heartbeat asked for in whole seconds; Unusable (a ValueError, as argparse's types raise)
    saying what is allowed otherwise."""
    allowed = f"whole seconds from {HEARTBEAT_MIN_S} to {HEARTBEAT_MAX_S} (the spec's, the default)"
    try:
        seconds = int(text.strip(), 10)
    except ValueError:
        raise Unusable(f"the heartbeat {text!r} is not {allowed}") from None
    if not HEARTBEAT_MIN_S <= seconds <= HEARTBEAT_MAX_S:
        raise Unusable(f"the heartbeat {seconds}s is outside {allowed}")
    return seconds


@dataclass(frozen=True, slots=True)
class Reading:
    """What a producer measured: the record's reading fields, plus whether this is a compaction edge.

    `rate_limits_edge`: the reading carries the account rate-limit snapshot the harness stated last:
    a status line stating it (Claude), or the producer's held reading (its own observedAtMs kept)
    restated with a snapshot that arrived after it (a harness may send a request's limits after
    its usage). Written when its limits' bucket (`rate_limit_bucket`) differs from the record's, so the
    record's are the latest.

    `exhausted`: the account windows (`fiveHour`, `sevenDay`) the harness itself proves exhausted
    now; a change of the set is an edge. Only the producer can say: one harness stops at 100%,
    another continues on credits the record cannot see and proves nothing.
    """

    fields: ContextFields
    compaction_edge: bool = False
    rate_limits_edge: bool = False
    exhausted: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Write:
    record: HarnessContext
    reason: WriteReason


Bucket = tuple[str | None, int | None, int | None, int | None]


def bucket(fields: ContextFields) -> Bucket:
    """(session, window, tokens bucket, displayed bucket); None where the channel withheld it.

    The tokens bucket is `floor(used / (BUCKET_PERCENT% of window))`. The displayed bucket is
    `floor(usedPercent / BUCKET_PERCENT)`: usedPercent is the figure the harness itself displays
    (HC-R02, the producer's to supply), and it moves inside one tokens bucket where the harness
    rounds (a `Math.round`) or subtracts a baseline (a fixed token allowance), so a record
    keyed by tokens alone would show another integer than the harness until the heartbeat. A
    move between withheld and known is a change of bucket, and so is a reading of another session
    (`sessionId`, where one server hosts several): its numbers describe another window.
    """
    used, window, shown = fields.used_tokens, fields.window_tokens, fields.used_percent
    tokens = used * 100 // (window * HARNESS_CONTEXT_BUCKET_PERCENT) if used is not None and window else None
    displayed = None if shown is None else math.floor(shown / HARNESS_CONTEXT_BUCKET_PERCENT)
    return fields.session_id, window, tokens, displayed


def subagent_buckets(fields: ContextFields) -> tuple[tuple[str, str, int | None, int | None], ...]:
    """(id, state, tokens bucket, displayed bucket) of each subagent row (issue 28): a subagent
    crossing a bucket, appearing, or finishing is a change of the record, as the parent's is."""
    return tuple(sorted(
        (
            row.id,
            row.state,
            row.used_tokens * 100 // (row.window_tokens * HARNESS_CONTEXT_BUCKET_PERCENT)
            if row.used_tokens is not None and row.window_tokens
            else None,  # no window, no bucket: its numbers ride the record's next write
            None if row.used_percent is None else math.floor(row.used_percent / HARNESS_CONTEXT_BUCKET_PERCENT),
        )
        for row in fields.subagents
        if row.used_tokens is not None or row.state == "finished"  # spawned, nothing measured: no change yet
    ))  # fmt: skip


RateLimitBucket = tuple[int | None, int | None, int | None, int | None]


def rate_limit_bucket(fields: ContextFields) -> RateLimitBucket | None:
    """(five-hour bucket, seven-day bucket, five-hour reset, seven-day reset) of a reading's account
    limits; None when it states none (a producer that has not heard them yet says nothing new)."""
    limits = fields.rate_limits
    if limits is None:
        return None
    resets = fields.rate_limit_resets_at_ms

    def quantum(used: float | None) -> int | None:
        return None if used is None else math.floor(used / HARNESS_CONTEXT_BUCKET_PERCENT)

    return (
        quantum(limits.five_hour),
        quantum(limits.seven_day),
        None if resets is None else resets.five_hour,
        None if resets is None else resets.seven_day,
    )


def _cache_edge(fields: ContextFields) -> tuple[bool, int | None] | None:
    """What of a stated prompt cache makes a write: its warmth and when it goes cold."""
    cache = fields.prompt_cache
    return None if cache is None else (cache.warm, cache.expires_at_ms)


def windows_at_limit(limits: RateLimits | None) -> frozenset[str]:
    """The account windows a snapshot shows at 100% or more: exhausted, for a producer whose
    harness stops there and publishes a window only while its reset is still ahead."""
    if limits is None:
        return frozenset()
    windows = {"fiveHour": limits.five_hour, "sevenDay": limits.seven_day}
    return frozenset(name for name, used in windows.items() if used is not None and used >= 100)


class WriteGuard:
    """Per-record write policy state: the last written record and the newest reading held back."""

    def __init__(
        self,
        agent: str,
        incarnation: str,
        last: HarnessContext | None = None,
        heartbeat_ms: int = HARNESS_CONTEXT_HEARTBEAT_MS,
    ) -> None:
        self.agent = agent
        self.incarnation = incarnation
        self.last = last
        # The spec's 5 minutes; shorter only where a test or a diagnosis asks (HCTX_HEARTBEAT_S).
        self.heartbeat_ms = heartbeat_ms
        self.held: ContextFields | None = None
        self.exhausted: frozenset[str] = frozenset()  # as the newest reading offered proved it
        # While a change of the subagent rows alone is held: when its quantum ends.
        self.subagents_due_ms: int | None = None

    def offer(self, reading: Reading, now_ms: int) -> Write | None:
        self._distrust_future(now_ms)
        fields = reading.fields
        reason = self._reason(reading, now_ms)
        self.exhausted = reading.exhausted
        if reason is None:
            if self.last is not None and subagent_buckets(fields) != subagent_buckets(self.last):
                self.held = fields  # the rows changed: held for the quantum, whatever its parent's time
                if self.subagents_due_ms is None:
                    self.subagents_due_ms = now_ms + SUBAGENT_QUANTUM_MS
            elif self.last is None or fields.observed_at_ms > self.last.observed_at_ms:
                self.held = fields
            return None
        return self._write(fields, reason, now_ms)

    def _reason(self, reading: Reading, now_ms: int) -> WriteReason | None:
        last, fields = self.last, reading.fields
        if reading.compaction_edge:
            return "compaction"
        if last is None or bucket(fields) != bucket(last):
            return "bucket"
        if reading.exhausted != self.exhausted:
            return "exhaustion"
        if reading.rate_limits_edge and rate_limit_bucket(fields) not in (None, rate_limit_bucket(last)):
            return "rate-limits"  # the account's limits moved: never left behind a heartbeat
        if _cache_edge(fields) != _cache_edge(last):
            return "prompt-cache"  # issue 37: when it goes cold is news minutes before the heartbeat
        fresh = fields.observed_at_ms > last.observed_at_ms
        if fresh and now_ms - last.written_at_ms >= self.heartbeat_ms:
            return "heartbeat"
        return None

    def heartbeat_due_ms(self) -> int | None:
        """When the held reading is due: at the end of a held subagent change's quantum, or at the
        heartbeat; None while nothing is held."""
        if self.held is None or self.last is None:
            return None
        beat = self.last.written_at_ms + self.heartbeat_ms
        return beat if self.subagents_due_ms is None else min(beat, self.subagents_due_ms)

    def tick(self, now_ms: int) -> Write | None:
        """The heartbeat: re-publish a reading taken since the last write, never re-stamp one; and
        the held subagent rows once their quantum ended."""
        self._distrust_future(now_ms)
        due = self.heartbeat_due_ms()
        if due is None or now_ms < due or self.held is None:
            return None
        reason: WriteReason = "bucket" if due == self.subagents_due_ms else "heartbeat"
        return self._write(self.held, reason, now_ms)

    def _distrust_future(self, now_ms: int) -> None:
        """A last write dated past the skew bound (a planted record, a clock stepped back) is taken
        as written now: carried +1 it would date every later write in the future, and hold the
        heartbeat off for as long."""
        last = self.last
        if last is not None and last.written_at_ms > now_ms + HARNESS_CONTEXT_FUTURE_SKEW_MS:
            self.last = last.model_copy(update={"written_at_ms": now_ms})

    def refresh(self, write: Write, now_ms: int) -> Write:
        """`write` carrying the newest reading held since it was decided, so a write that waited (a
        stalled lock, a full disk, a burst) lands as the newest reading, not an older one. The held
        reading is in the write's own bucket, so the policy's decision stands."""
        held = self.held
        if held is None or held.observed_at_ms <= write.record.observed_at_ms:
            return write
        newer = self._write(held, write.reason, now_ms)
        self.committed(newer)
        return newer

    def _write(self, fields: ContextFields, reason: WriteReason, now_ms: int) -> Write:
        written_at = now_ms if self.last is None else max(now_ms, self.last.written_at_ms + 1)
        record = HarnessContext(
            **dict(fields),
            agent=self.agent,
            incarnation=self.incarnation,
            written_at_ms=written_at,
        )
        return Write(record, reason)

    def committed(self, write: Write) -> None:
        """Call once the write is durable: the policy's next decisions are relative to it."""
        self.last = record = write.record
        held = self.held
        if (
            held is not None
            and held.observed_at_ms <= record.observed_at_ms
            and (subagent_buckets(held) == subagent_buckets(record))
        ):
            self.held = None
        if self.held is None or subagent_buckets(self.held) == subagent_buckets(record):
            self.subagents_due_ms = None
