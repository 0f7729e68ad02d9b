"""What a producer holds between events, in one place for every harness: its held reading, the
compaction ledger, and its subagents' rows (the shared producer kernel, issue 30).

A producer decodes its harness's facts into a `ContextFields` and hands it here; the kernel is
what carries from one event to the next, by the same rules for every harness:

- **the held reading**: the newest reading the producer made (`Held.measured`). A compaction edge
  or a subagent's row restates it, its numbers and its `observedAtMs` kept: nothing was
  re-measured, so nothing is re-stamped.
- **the ledger** (`CompactionLedger`, the spec's compaction accounting, HC-R12): the count, when
  the newest compaction happened and its trigger ride every reading after it, never forgotten by a
  new one. hctx counts one per edge (incarnation scope), or takes the count the harness states
  from its own session store (harness-durable: pi, omp), even a lower one (another session's).
  An edge carrying a key (an event or item id) counts once however often it is delivered.
- **an edge with no reading** keeps the held numbers; before any reading, the count is the only
  observation and is published alone, taken now (or, for a harness whose first reading is moments
  away, `edge_waits_for_reading`, it rides that reading as its edge).
- **a new session** (`Held.new_session`) forgets the held reading and the last compaction's time
  and trigger: they are another session's. The count stays until the new session states its own.
- **subagents** (`Held.subagent`): one subagent's row changed, on the held reading.

Hostile input is refused, never published: a stated count that is no count (negative, past the
record's bound, not an int), a time that is no time, a count st2 would push past the bound, each
raises `FrameRejected` (the pipeline counts the frame as dropped) and changes nothing.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

from guard.errors import FrameRejected
from guard.policy import Reading
from guard.record import MAX_COUNT, CompactionTrigger, ContextFields, Harness
from sidecar.producer import SubagentRoster, remember

__all__ = [
    "COMPACTION_KEYS_REMEMBERED",
    "CompactionLedger",
    "Held",
]

# Keys of counted compactions (event or item ids). One compaction is a handful of deliveries apart;
# the bound only keeps a hostile stream from growing a producer's memory.
COMPACTION_KEYS_REMEMBERED = 1024


def _time(value: object, what: str) -> int:
    if type(value) is not int or value < 0:  # the record's Millis
        raise FrameRejected(f"{what} {value!r} is not a time")
    return value


def _count(value: object) -> int:
    if type(value) is not int or not 0 <= value <= MAX_COUNT:
        raise FrameRejected(f"compaction count {value!r} is not a count")
    return value


class CompactionLedger:
    """An agent's compactions: how many, when the newest was, and what set it off.

    `count` starts at 0; `last_ms` and `trigger` are None until a compaction is known. `owed` is an
    edge counted but not yet published: the next reading is that edge."""

    def __init__(self) -> None:
        self.count = 0
        self.last_ms: int | None = None
        self.trigger: CompactionTrigger | None = None
        self.owed = False
        self._keys: OrderedDict[Hashable, None] = OrderedDict()

    def counted(
        self,
        now_ms: int,
        trigger: CompactionTrigger = "unknown",
        *,
        key: Hashable | None = None,
        stated: int | None = None,
    ) -> bool:
        """One compaction edge, arrived at `now_ms`: the count one more, or the count the harness
        `stated` with it (its store already holds this compaction). False, and nothing changes, when
        `key` was counted already."""
        now_ms = _time(now_ms, "compaction time")
        count = self.count + 1 if stated is None else _count(stated)
        if count > MAX_COUNT:
            raise FrameRejected(f"compaction count past {MAX_COUNT}")
        if key is not None:
            if key in self._keys:
                return False  # the same compaction delivered again
            remember(self._keys, key, None, COMPACTION_KEYS_REMEMBERED)
        self.count, self.last_ms, self.trigger, self.owed = count, now_ms, trigger, True
        return True

    def finished(self, now_ms: int) -> None:
        """The counted compaction finished at `now_ms` (Claude's PostCompact): its time moves from
        when it started to when the window emptied, never to before it started (a clock stepped
        back), and rides the next reading."""
        now_ms = _time(now_ms, "compaction time")
        if self.last_ms is None or now_ms >= self.last_ms:
            self.last_ms = now_ms

    def stated(self, count: int, stored_ms: int | None = None) -> None:
        """The count the harness's session store holds, said outside an edge (a restarted or
        switched-to session): taken as said. None held means no compaction at all (a new session):
        the last time and trigger were another's. A first count learned this way is timed by the
        store's own entry, `stored_ms`, when it names one; the store names no trigger."""
        count = _count(count)
        if stored_ms is not None:
            stored_ms = _time(stored_ms, "stored compaction time")
        self.count = count
        if count == 0:
            self.last_ms = self.trigger = None
        elif self.last_ms is None and stored_ms is not None:
            self.last_ms = stored_ms

    def new_session(self) -> None:
        """Another session begins: its last compaction is not the one held; the count stays until it
        states its own."""
        self.last_ms = self.trigger = None
        self.owed = False

    def fields(self) -> dict[str, Any]:
        """The record's compaction fields, as every reading carries them."""
        return {"compactions": self.count, "last_compaction_ms": self.last_ms, "last_compaction_trigger": self.trigger}


def _unexhausted(fields: ContextFields) -> frozenset[str]:
    return frozenset()


class Held:
    """One agent's producer state shared by every harness: the held reading, its compactions and
    its subagents, and the readings they make.

    `exhausted` names the account windows the harness itself proves exhausted in a reading (only a
    harness that stops at a limit can say; none by default). `edge_waits_for_reading`: a compaction
    counted before any reading rides the first reading as its edge, instead of being published alone."""

    def __init__(
        self,
        harness: Harness,
        *,
        exhausted: Callable[[ContextFields], frozenset[str]] = _unexhausted,
        edge_waits_for_reading: bool = False,
    ) -> None:
        self.harness = harness
        self.reading: ContextFields | None = None
        self.compactions = CompactionLedger()
        self.subagents = SubagentRoster()
        self._exhausted = exhausted
        self._edge_waits = edge_waits_for_reading

    def publish(
        self, fields: ContextFields, *, compaction_edge: bool = False, rate_limits_edge: bool = False
    ) -> Reading:
        """`fields` held, as the reading the guard considers."""
        self.reading = fields
        return Reading(fields, compaction_edge=compaction_edge, rate_limits_edge=rate_limits_edge,
                       exhausted=self._exhausted(fields))  # fmt: skip

    def hold(self, fields: ContextFields) -> ContextFields:
        """A reading just made, with what carries over onto it (the ledger, the subagent rows), held."""
        self.reading = fields.model_copy(update={**self.compactions.fields(), "subagents": self.subagents.rows()})
        return self.reading

    def measured(self, fields: ContextFields, *, rate_limits_edge: bool = False) -> Reading:
        """A reading just made, held and published; it is the compaction edge if one is owed.
        `rate_limits_edge`: it states the harness's newest account limits (guard.policy.Reading)."""
        edge, self.compactions.owed = self.compactions.owed, False
        return self.publish(self.hold(fields), compaction_edge=edge, rate_limits_edge=rate_limits_edge)

    def compacted(
        self,
        now_ms: int,
        trigger: CompactionTrigger = "unknown",
        *,
        key: Hashable | None = None,
        stated: int | None = None,
        **restated: Any,
    ) -> list[Reading]:
        """One compaction edge (see `CompactionLedger.counted`), published at once."""
        if not self.compactions.counted(now_ms, trigger, key=key, stated=stated):
            return []
        return self.edge(now_ms, **restated)

    def edge(self, now_ms: int, **restated: Any) -> list[Reading]:
        """The owed compaction edge on the held reading, its numbers and time kept (with the held
        facts in `restated` that are newer than it, a build or rate limits); before any reading, on
        a reading of the count alone, taken now, unless the edge waits for the first reading."""
        if not self.compactions.owed:
            return []
        if self.reading is None and self._edge_waits:
            return []
        self.compactions.owed = False
        held = self.reading or ContextFields(harness=self.harness, observed_at_ms=now_ms)
        return [self.publish(held.model_copy(update={**self.compactions.fields(), **restated}), compaction_edge=True)]

    def new_session(self) -> None:
        """Another session begins: the held reading and the last compaction are the old one's."""
        self.reading = None
        self.compactions.new_session()

    def subagent(self, subagent_id: str, now_ms: int, **fields: Any) -> list[Reading]:
        """The record with one subagent's row changed (`fields` said of it now); the parent's numbers
        and time as held. Nothing when the row did not change or would not validate."""
        if not self.subagents.update(subagent_id, now_ms, **{**fields, "observed_at_ms": now_ms}):
            return []
        return [self.publish(self.subagents.onto(self.reading, self.harness, now_ms))]

    def subagent_compacted(self, subagent_id: str, now_ms: int) -> list[Reading]:
        """A subagent's own window compacted: counted on its row, never the agent's."""
        row = self.subagents.get(subagent_id)
        return self.subagent(subagent_id, now_ms, compactions=(row.compactions or 0) + 1 if row else 1)
