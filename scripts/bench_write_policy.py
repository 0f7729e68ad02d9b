#!/usr/bin/env python3
"""The write-policy benchmark of the spec's "Write policy" section, on traces anyone can replay.

    python scripts/bench_write_policy.py [--codex-rollout FILE]... [--claude-transcript FILE]...
                                         [--synthetic N] [--hours H] [--seed S] [--no-lab]

Traces: the lab's captures (Codex app-server streams, Codex rollout lines, Claude transcripts under
../shared/lab/ or fixtures/), rollouts and transcripts named on the command line, and N synthetic long
sessions per harness (tens of hours, thousands of readings, single long turns, compactions) written
as a real rollout / transcript and read back through the same readers. Every trace becomes readings
through the real producers (`CodexProducer`; Claude usage over the model table's window).

Policies: every distinct reading; turn boundary only; movement guard 5%/60 s and 1%/60 s; bucket 5%
+ 300 s heartbeat (re-implemented here); bucket 1% + 300 s heartbeat = the shipped `WriteGuard` (a new
1% of the tokens or of the displayed percent, issue 19); and, re-implemented, the tokens' 1% bucket
alone, the policy before issue 19.

Metrics per harness and policy: writes per agent-hour (over each trace's span), p95 error (|fill of
the truth − fill of the last written record|, in % of the window, sampled at every reading), and
missed warnings at every threshold 80..97 on both scales (occupancy usedTokens/windowTokens, and the
displayed usedPercent): of the compactions whose segment's true fill reached T, the share where no
record written in that segment (before the compaction) reached T.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from guard.constants import HARNESS_CONTEXT_HEARTBEAT_MS
from guard.policy import Reading, WriteGuard
from guard.record import ContextFields, round_half_up
from scripts.capture_readers.codex import read_recording as read_codex_capture
from sidecar.decoding import Dropped
from sidecar.harnesses.claude.transcript import claude_compaction, claude_usage
from sidecar.harnesses.claude.windows import shipped_model_table
from sidecar.harnesses.codex.events import ThreadOpened
from sidecar.harnesses.codex.producer import SPEC as CODEX
from sidecar.harnesses.codex.producer import CodexProducer
from sidecar.harnesses.codex.transcript import rollout_event
from sidecar.registry import spec_for
from sidecar.replay import replay_recording
from sidecar.spec import HarnessSpec
from sidecar.transcripts import forward_lines

ROOT = Path(__file__).resolve().parent.parent
LAB = ROOT.parent / "shared" / "lab"
THRESHOLDS = tuple(range(80, 98))


# ---------------------------------------------------------------------------------------------
# Traces: readings, compactions and turn ends, in time order


@dataclass(frozen=True)
class Event:
    at_ms: int
    reading: Reading | None = None
    compaction: bool = False
    turn_end: bool = False


@dataclass
class Trace:
    harness: str
    name: str
    events: list[Event] = field(default_factory=list)


def occupancy(fields: ContextFields) -> float | None:
    """The spec's measure: usedTokens over windowTokens, in % of the window (the bucket's own unit)."""
    if fields.used_tokens is None or not fields.window_tokens:
        return None
    return fields.used_tokens * 100 / fields.window_tokens


def displayed(fields: ContextFields) -> float | None:
    """What a reader alarms on: the record's usedPercent (Codex: 100 - "% context left")."""
    return fields.used_percent


MEASURES = {"occupancy (usedTokens/windowTokens)": occupancy, "displayed usedPercent": displayed}
fill = occupancy


def codex_app_server_trace(path: Path) -> Trace:
    trace = Trace("codex", path.name)
    producer = CodexProducer()
    decoder = CODEX.decoder("stdout")
    for chunk in read_codex_capture([path]):  # the lab's capture, read as convert_fixtures reads it
        now = chunk.at_ms or 0
        for event in decoder.receive_data(chunk.data):
            if not isinstance(event, Dropped):
                for reading in producer.feed(event, now):
                    trace.events.append(Event(now, reading, compaction=reading.compaction_edge))
        message = json.loads(chunk.data)  # a turn's end is no event of the producer's: read here
        if isinstance(message, dict) and message.get("method") == "turn/completed":
            trace.events.append(Event(now, turn_end=True))
    return trace


def codex_rollout_trace(name: str, data: bytes) -> Trace:
    trace = Trace("codex", name)
    producer = CodexProducer()
    # The rollout a seat follows is its own thread's, as the live follower tells the producer.
    producer.feed(ThreadOpened(thread_id="bench"), 0)
    for offset, line in forward_lines(data):
        event = rollout_event(line, offset, "bench")
        if event is None or event.at_ms is None:
            continue
        if event.kind == "task_complete":
            trace.events.append(Event(event.at_ms, turn_end=True))
        for item in event.events:
            if isinstance(item, Dropped):
                continue
            for reading in producer.feed(item, event.at_ms):
                trace.events.append(Event(event.at_ms, reading, compaction=reading.compaction_edge))
    return trace


def claude_transcript_trace(name: str, data: bytes, windows: dict[str, int]) -> Trace:
    trace = Trace("claude", name)
    compactions = 0
    last: ContextFields | None = None
    for offset, line in forward_lines(data):
        compaction = claude_compaction(line, offset)
        if compaction is not None:
            compactions += 1
            if last is not None:
                last = last.model_copy(update={"compactions": compactions, "last_compaction_ms": compaction.at_ms})
                trace.events.append(Event(compaction.at_ms, Reading(last, compaction_edge=True), compaction=True))
            continue
        if b'"turn_duration"' in line:
            stamp = _stamp(line)
            if stamp is not None:
                trace.events.append(Event(stamp, turn_end=True))
            continue
        usage = claude_usage(line, offset)
        window = None if usage is None or usage.model is None else windows.get(usage.model)
        if usage is None or window is None:
            continue
        last = ContextFields(
            harness="claude",
            used_tokens=usage.used_tokens,
            window_tokens=window,
            used_percent=min(100, round_half_up(usage.used_tokens * 100 / window)),  # Claude's Math.round
            model=usage.model,
            compactions=compactions,
            observed_at_ms=usage.observed_at_ms,
        )
        trace.events.append(Event(usage.observed_at_ms, Reading(last)))
    return trace


def _stamp(line: bytes) -> int | None:
    from sidecar.producer import instant_ms

    try:
        return instant_ms(json.loads(line).get("timestamp"))
    except (ValueError, AttributeError):
        return None


# ---------------------------------------------------------------------------------------------
# Synthetic long sessions, written in the harnesses' own formats


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _activity(rng: random.Random, hours: float) -> Iterator[tuple[int, int, bool]]:
    """(turn start ms, turn length ms, is a single long wedge turn) over `hours` of a working agent."""
    t = 1_795_000_000_000
    end = t + int(hours * 3_600_000)
    while t < end:
        active_until = t + int(rng.uniform(20, 180) * 60_000)
        while t < min(active_until, end):
            wedge = rng.random() < 0.04
            length = int((rng.uniform(60, 180) if wedge else rng.expovariate(1 / 6)) * 60_000) + 20_000
            yield t, length, wedge
            t += length + int(rng.expovariate(1 / 40) * 1000)
        t += int(rng.uniform(10, 240) * 60_000)


def synthetic_codex_rollout(seed: int, hours: float) -> bytes:
    rng = random.Random(seed)
    window, baseline = 258_400, 12_000
    limit = int(window * rng.uniform(0.88, 0.995))
    lines: list[dict[str, object]] = []
    last = 14_000 + rng.randint(0, 4000)
    total = last
    primary, secondary = 0.0, 0.0

    def token_count(at: int, last_tokens: int) -> None:
        lines.append({"timestamp": _iso(at), "type": "event_msg", "payload": {
            "type": "token_count",
            "info": {"total_token_usage": {"total_tokens": total}, "last_token_usage": {"total_tokens": last_tokens},
                     "model_context_window": window},
            "rate_limits": {"primary": {"used_percent": round(primary, 1), "window_minutes": 300},
                            "secondary": {"used_percent": round(secondary, 1), "window_minutes": 10080}},
        }})  # fmt: skip

    for start, length, wedge in _activity(rng, hours):
        lines.append({"timestamp": _iso(start), "type": "turn_context", "payload": {"model": "gpt-5-codex"}})
        at = start
        while at < start + length:
            at += int(rng.expovariate(1 / (14 if wedge else 20)) * 1000) + 400
            step = int(rng.lognormvariate(6.6, 1.0)) + (rng.randint(4000, 30000) if rng.random() < 0.05 else 0)
            last += step
            total += last
            primary = min(100.0, primary + rng.uniform(0, 0.05))
            secondary = min(100.0, secondary + rng.uniform(0, 0.01))
            token_count(at, last)
            if last >= limit:
                # Auto-compaction before the next sample: the summarisation request, the line, the estimate.
                at += 2000
                total += last
                token_count(at, last)
                lines.append({"timestamp": _iso(at + 300), "type": "compacted", "payload": {"message": "..."}})
                last = baseline // 2 + rng.randint(0, 3000)
                limit = int(window * rng.uniform(0.88, 0.995))
                at += 310
                token_count(at, last)
        lines.append({"timestamp": _iso(at + 50), "type": "event_msg", "payload": {"type": "task_complete"}})
    return b"".join(json.dumps(line, separators=(",", ":")).encode() + b"\n" for line in lines)


def synthetic_claude_transcript(seed: int, hours: float) -> bytes:
    rng = random.Random(seed)
    # Both windows of the lab's model table; Claude auto-compacts at window - 33k (lab: 967000 of 1M).
    model, window = ("claude-sonnet-4-5", 200_000) if seed % 2 else ("claude-opus-5-5", 1_000_000)
    scale = window // 200_000
    auto_at = window - 33_000
    lines: list[dict[str, object]] = []
    used = 18_000 + rng.randint(0, 4000)
    for start, length, wedge in _activity(rng, hours):
        at = start
        while at < start + length:
            at += int(rng.expovariate(1 / (25 if wedge else 40)) * 1000) + 1500
            used += scale * (
                int(rng.lognormvariate(7.2, 1.1)) + (rng.randint(5000, 25000) if rng.random() < 0.05 else 0)
            )
            usage = {"input_tokens": 3, "cache_read_input_tokens": used - 1500, "cache_creation_input_tokens": 1497,
                     "output_tokens": 200}  # fmt: skip
            message = {"model": model, "usage": usage}
            lines.append({"type": "assistant", "timestamp": _iso(at), "isSidechain": False, "message": message})
            manual = rng.random() < 0.002
            if used >= auto_at or manual:
                # Claude compacts before the request that would carry this much (lab: threshold = window - 33k).
                at += 2000
                meta = {"trigger": "manual" if manual else "auto", "preTokens": used, "postTokens": 3000}
                lines.append({"type": "system", "subtype": "compact_boundary", "timestamp": _iso(at),
                              "compactMetadata": meta})  # fmt: skip
                used = 16_000 + rng.randint(0, 6000)
        lines.append({"type": "system", "subtype": "turn_duration", "timestamp": _iso(at + 100), "durationMs": length})
    return b"".join(json.dumps(line, separators=(",", ":")).encode() + b"\n" for line in lines)


# ---------------------------------------------------------------------------------------------
# Policies


class Policy:
    name = ""

    def offer(self, event: Event) -> ContextFields | None:
        """The record written for this event, if any."""
        raise NotImplementedError

    def due_ms(self) -> int | None:
        return None

    def tick(self, now_ms: int) -> ContextFields | None:
        return None


def _numbers(fields: ContextFields) -> tuple[object, ...]:
    return (fields.used_tokens, fields.window_tokens, fields.used_percent, fields.compactions)


class EveryDistinct(Policy):
    name = "every distinct reading"

    def __init__(self) -> None:
        self.last: ContextFields | None = None

    def offer(self, event: Event) -> ContextFields | None:
        if event.reading is None:
            return None
        fields = event.reading.fields
        if self.last is not None and _numbers(fields) == _numbers(self.last):
            return None
        self.last = fields
        return fields


class TurnBoundary(Policy):
    name = "turn boundary only"

    def __init__(self) -> None:
        self.held: ContextFields | None = None
        self.last: ContextFields | None = None

    def offer(self, event: Event) -> ContextFields | None:
        if event.reading is not None:
            self.held = event.reading.fields
        if not event.turn_end or self.held is None or self.held is self.last:
            return None
        self.last = self.held
        return self.held


class MovementGuard(Policy):
    """The spike: skip identical, write on a move of at least `step`%, otherwise at most once per floor."""

    def __init__(self, step: float, floor_ms: int) -> None:
        self.step, self.floor_ms = step, floor_ms
        self.name = f"movement guard {step:g}% / {floor_ms // 1000} s"
        self.last: ContextFields | None = None
        self.last_at = 0

    def offer(self, event: Event) -> ContextFields | None:
        if event.reading is None:
            return None
        fields = event.reading.fields
        last = self.last
        if last is not None:
            if _numbers(fields) == _numbers(last):
                return None
            moved = abs((fill(fields) or 0) - (fill(last) or 0)) >= self.step
            if not moved and event.at_ms - self.last_at < self.floor_ms:
                return None
        self.last, self.last_at = fields, event.at_ms
        return fields


class Bucket(Policy):
    """A re-implementation at another bucket size: compaction edge, bucket change, 300 s heartbeat."""

    def __init__(self, percent: int, name: str | None = None) -> None:
        self.percent = percent
        self.name = name or f"bucket {percent}% + 300 s heartbeat"
        self.last: ContextFields | None = None
        self.last_at = 0
        self.held: ContextFields | None = None

    def _bucket(self, fields: ContextFields) -> int | None:
        if fields.used_tokens is None or not fields.window_tokens:
            return None
        return fields.used_tokens * 100 // (fields.window_tokens * self.percent)

    def _write(self, fields: ContextFields, now_ms: int) -> ContextFields:
        self.last, self.last_at, self.held = fields, now_ms, None
        return fields

    def offer(self, event: Event) -> ContextFields | None:
        if event.reading is None:
            return None
        fields, last = event.reading.fields, self.last
        if event.reading.compaction_edge or last is None or self._bucket(fields) != self._bucket(last):
            return self._write(fields, event.at_ms)
        fresh = fields.observed_at_ms > last.observed_at_ms
        if fresh and event.at_ms - self.last_at >= HARNESS_CONTEXT_HEARTBEAT_MS:
            return self._write(fields, event.at_ms)
        if fresh:
            self.held = fields
        return None

    def due_ms(self) -> int | None:
        return None if self.held is None else self.last_at + HARNESS_CONTEXT_HEARTBEAT_MS

    def tick(self, now_ms: int) -> ContextFields | None:
        due = self.due_ms()
        if due is None or now_ms < due or self.held is None:
            return None
        return self._write(self.held, now_ms)


class Shipped(Policy):
    """The shipped policy itself: `guard.policy.WriteGuard` (bucket 1% + 300 s heartbeat + edges)."""

    name = "bucket 1% + 300 s heartbeat"

    def __init__(self) -> None:
        self.guard = WriteGuard("bench", "bench")

    def offer(self, event: Event) -> ContextFields | None:
        if event.reading is None:
            return None
        write = self.guard.offer(event.reading, event.at_ms)
        if write is None:
            return None
        self.guard.committed(write)
        return event.reading.fields

    def due_ms(self) -> int | None:
        return self.guard.heartbeat_due_ms()

    def tick(self, now_ms: int) -> ContextFields | None:
        write = self.guard.tick(now_ms)
        if write is None:
            return None
        self.guard.committed(write)
        return ContextFields.model_validate(write.record.model_dump(include=set(ContextFields.model_fields)))


POLICIES = (
    EveryDistinct,
    TurnBoundary,
    lambda: MovementGuard(5, 60_000),
    lambda: MovementGuard(1, 60_000),
    lambda: Bucket(5),
    Shipped,
    # The shipped policy before issue 19: the tokens' bucket alone, without the displayed percent's.
    lambda: Bucket(1, "bucket 1% tokens only (before issue 19)"),
)


# ---------------------------------------------------------------------------------------------
# Evaluation


@dataclass
class Score:
    writes: int = 0
    hours: float = 0.0
    errors: list[float] = field(default_factory=list)
    # measure name -> threshold -> count
    eligible: dict[str, dict[int, int]] = field(
        default_factory=lambda: {m: dict.fromkeys(THRESHOLDS, 0) for m in MEASURES}
    )
    missed: dict[str, dict[int, int]] = field(
        default_factory=lambda: {m: dict.fromkeys(THRESHOLDS, 0) for m in MEASURES}
    )
    readings: int = 0
    compactions: int = 0


def evaluate(trace: Trace, policy: Policy, score: Score) -> None:
    events = trace.events
    if not events:
        return
    score.hours += max(events[-1].at_ms - events[0].at_ms, 1000) / 3_600_000
    written: ContextFields | None = None
    truth_peak = dict.fromkeys(MEASURES, 0.0)
    written_peak = dict.fromkeys(MEASURES, 0.0)

    def wrote(record: ContextFields) -> None:
        for name, measure in MEASURES.items():
            written_peak[name] = max(written_peak[name], measure(record) or 0)

    for event in events:
        while (due := policy.due_ms()) is not None and due <= event.at_ms:
            ticked = policy.tick(due)
            if ticked is None:
                break
            score.writes += 1
            written = ticked
            wrote(ticked)
        if event.compaction:
            # Judge the segment that ends here before the edge itself writes anything.
            score.compactions += 1
            for name in MEASURES:
                for threshold in THRESHOLDS:
                    if truth_peak[name] >= threshold:
                        score.eligible[name][threshold] += 1
                        score.missed[name][threshold] += written_peak[name] < threshold
            truth_peak = dict.fromkeys(MEASURES, 0.0)
            written_peak = dict.fromkeys(MEASURES, 0.0)
        record = policy.offer(event)
        if record is not None:
            score.writes += 1
            written = record
            if not event.compaction:
                wrote(record)
        if event.reading is not None and not event.compaction:
            score.readings += 1
            fields = event.reading.fields
            for name, measure in MEASURES.items():
                truth_peak[name] = max(truth_peak[name], measure(fields) or 0)
            truth, shown = occupancy(fields), None if written is None else occupancy(written)
            if truth is not None and shown is not None:
                score.errors.append(abs(truth - shown))


def p95(values: list[float]) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


def _worst_missed(score: Score, measure: str) -> str:
    """The largest share of missed warnings over the thresholds 80..97 on one scale."""
    eligible, missed = score.eligible[measure], score.missed[measure]
    shares = [100 * missed[t] / eligible[t] for t in THRESHOLDS if eligible[t]]
    return f"{max(shares):.1f}%" if shares else "n/a"


def render(harness: str, traces: list[Trace]) -> str:
    scores: dict[str, Score] = {}
    for make in POLICIES:
        name = make().name
        score = Score()
        for trace in traces:
            evaluate(trace, make(), score)
        scores[name] = score
    any_score = next(iter(scores.values()))
    first = next(iter(MEASURES))
    lines = [
        f"## {harness}: {len(traces)} traces, {any_score.hours:.1f} h, {any_score.readings} readings, "
        f"{any_score.compactions} compactions",
        "",
        f"{'policy':40} {'writes/h/agent':>14} {'error p95 (% of window)':>23} {'missed @90':>10} "
        f"{'worst missed 80..97 occupancy / displayed':>42}",
    ]
    for name, score in scores.items():
        eligible = score.eligible[first][90]
        missed = f"{100 * score.missed[first][90] / eligible:.1f}%" if eligible else "n/a"
        writes = f"{score.writes / score.hours:.1f}" if score.hours else "n/a"
        if score.hours < 1:
            writes += "*"  # minutes of capture: a rate per hour would be an extrapolation
        worst = " / ".join(_worst_missed(score, measure) for measure in MEASURES)
        lines.append(f"{name:40} {writes:>14} {p95(score.errors):23.2f} {missed:>10} {worst:>42}")
    if any_score.hours < 1:
        lines.append("* these traces span minutes, not hours: their rate is not comparable to the spec's")
    for measure in MEASURES:
        lines += ["", f"missed warnings, % of eligible compactions, threshold on {measure}:", ""]
        lines.append(f"{'policy':40} " + " ".join(f"{t:>5}" for t in THRESHOLDS))
        lines.append(f"{'(eligible n)':40} " + " ".join(f"{any_score.eligible[measure][t]:>5}" for t in THRESHOLDS))
        for name, score in scores.items():
            counts, misses = score.eligible[measure], score.missed[measure]
            cells = [f"{100 * misses[t] / counts[t]:5.1f}" if counts[t] else "  n/a" for t in THRESHOLDS]
            lines.append(f"{name:40} " + " ".join(cells))
        shipped = scores[Shipped.name]
        clean = all(shipped.missed[measure][t] == 0 for t in THRESHOLDS)
        lines.append(f"shipped policy misses no warning at 80..97 on {measure}: {'yes' if clean else 'NO'}")
    return "\n".join(lines) + "\n"


def lab_traces(windows: dict[str, int]) -> dict[str, list[Trace]]:
    codex: list[Trace] = []
    claude: list[Trace] = []
    codex_dir = LAB / "codex" / "captures"
    for path in sorted(codex_dir.glob("codex-*/codex-*-*.jsonl")):
        if not path.name.endswith(".timed.jsonl") and "resume" not in path.name:
            codex.append(codex_app_server_trace(path))
    for path in sorted(codex_dir.glob("codex-*/rollout-token-events*.jsonl")):
        by_file: dict[str, list[bytes]] = {}
        for line in path.read_bytes().splitlines():
            by_file.setdefault(json.loads(line).get("file", ""), []).append(line)
        for name, lines in sorted(by_file.items()):
            codex.append(codex_rollout_trace(f"{path.parent.name}/{name}", b"\n".join(lines)))
    for path in sorted((LAB / "claude" / "captures").glob("transcript-*.jsonl")):
        claude.append(claude_transcript_trace(path.name, path.read_bytes(), windows))
    return {"codex (lab captures)": codex, "claude (lab captures)": claude}


# ---- issue 28: the subagent rows' cost, on the recorded delegation sessions -----------------------

DELEGATIONS = ROOT / "fixtures" / "recordings"


class _WithoutRows:
    """A producer whose readings carry no subagent rows: the same session as published before."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.harness = inner.harness

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def feed(self, event: Any, now_ms: int) -> list[Reading]:
        return [dataclasses.replace(r, fields=r.fields.model_copy(update={"subagents": ()}))
                for r in self.inner.feed(event, now_ms)]  # fmt: skip


def delegation_recordings() -> list[tuple[str, HarnessSpec, Path]]:
    found: list[tuple[str, HarnessSpec, Path]] = []
    for path in sorted((DELEGATIONS / "codex").glob("codex-*-delegation.rec")):
        found.append((f"codex {path.name.split('-')[1]}", spec_for("codex"), path))
    for path in sorted((DELEGATIONS / "opencode" / "delegation").glob("delegation-*.rec")):
        found.append((f"opencode {path.name.split('-')[1].removesuffix('.rec')}", spec_for("opencode"), path))
    return found


def without_rows(spec: HarnessSpec) -> HarnessSpec:
    """The spec whose producer publishes no subagent rows; named as the harness's own module, so a
    recording's facts (the wrapper's settings) still reach it."""
    module = type(spec.make_producer()).__module__
    kind = type("WithoutRows", (_WithoutRows,), {"__module__": module})
    return dataclasses.replace(spec, make_producer=lambda: kind(spec.make_producer()))


def timed_delegations() -> list[tuple[str, HarnessSpec, Path]]:
    """The sidecars' own `--record` recordings of the live delegations, timed as the bytes came."""
    found: list[tuple[str, HarnessSpec, Path]] = []
    # Beside the live captures, not under fixtures/recordings/ (which holds the converted, untimed ones).
    live = ROOT / "fixtures"
    for path in sorted((live / "opencode" / "delegation").glob("delegation-*.rec")):
        found.append((f"opencode {path.stem.removeprefix('delegation-')}", spec_for("opencode"), path))
    for path in sorted((live / "claude" / "delegation").glob("*/sidecar.rec")):
        found.append((f"claude {path.parent.name}", spec_for("claude"), path))
    for path in sorted((live / "pi" / "delegation").glob("omp-*.rec")):
        found.append((f"omp {path.stem.removeprefix('omp-')}", spec_for("omp"), path))
    return found


def timed_subagent_rows() -> list[str]:
    from sidecar.replay import replay_recording

    lines: list[str] = []
    for name, spec, path in timed_delegations():
        with_rows, _ = replay_recording(spec, path)
        without, _ = replay_recording(without_rows(spec), path)
        stamps = [w.record.written_at_ms for w in with_rows + without]
        span_ms = max(stamps) - min(stamps) if len(stamps) > 1 else 0
        hours = max(span_ms, 1) / 3_600_000
        lines.append(
            f"{name + ' (timed)':<26} {span_ms / 1000:>7.1f} {len(with_rows):>5} {len(without):>8} "
            f"{len(with_rows) / hours:>8.0f} {len(without) / hours:>10.0f} {len(with_rows) / len(without):>6.2f}"
        )
    return lines


def subagent_table() -> str:
    """Writes per agent-hour of each recorded delegation, with the subagent rows and without."""
    header = f"{'session':<26} {'span s':>7} {'with':>5} {'without':>8} {'with/h':>8} {'without/h':>10} {'ratio':>6}"
    lines = ["", "subagent rows (issue 28), recorded delegation sessions (target: with <= 1.5x without)", header]
    for name, spec, path in delegation_recordings():
        with_rows, _ = replay_recording(spec, path)
        without, _ = replay_recording(without_rows(spec), path)
        # The session's span, first write to last (a converted recording times its leading untimed lines
        # by the old replay's steps from 0, not by the wall clock).
        span_ms = max(w.record.written_at_ms for w in with_rows) - min(w.record.written_at_ms for w in with_rows)
        hours = max(span_ms, 1) / 3_600_000
        lines.append(
            f"{name:<26} {span_ms / 1000:>7.1f} {len(with_rows):>5} {len(without):>8} "
            f"{len(with_rows) / hours:>8.0f} {len(without) / hours:>10.0f} {len(with_rows) / len(without):>6.2f}"
        )
    return "\n".join(lines + timed_subagent_rows())


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--codex-rollout", action="append", default=[], type=Path, metavar="FILE")
    parser.add_argument("--claude-transcript", action="append", default=[], type=Path, metavar="FILE")
    parser.add_argument("--synthetic", type=int, default=45, metavar="N", help="synthetic sessions per harness")
    parser.add_argument("--hours", type=float, default=30.6, help="median span of a synthetic session")
    parser.add_argument("--seed", type=int, default=20260829)
    parser.add_argument("--no-lab", action="store_true", help="leave out the lab's captures")
    parser.add_argument("--write-synthetic", type=Path, metavar="DIR", help="also save the synthetic traces")
    args = parser.parse_args(None if argv is None else list(argv))

    windows = shipped_model_table()
    groups: dict[str, list[Trace]] = {} if args.no_lab or not LAB.is_dir() else lab_traces(windows)
    if args.codex_rollout:
        groups["codex (given rollouts)"] = [codex_rollout_trace(p.name, p.read_bytes()) for p in args.codex_rollout]
    if args.claude_transcript:
        groups["claude (given transcripts)"] = [
            claude_transcript_trace(p.name, p.read_bytes(), windows) for p in args.claude_transcript
        ]
    if args.synthetic:
        rng = random.Random(args.seed)
        codex, claude = [], []
        for index in range(args.synthetic):
            hours = args.hours * rng.uniform(0.6, 1.4)
            rollout = synthetic_codex_rollout(args.seed + index, hours)
            transcript = synthetic_claude_transcript(args.seed + 10_000 + index, hours)
            if args.write_synthetic:
                args.write_synthetic.mkdir(parents=True, exist_ok=True)
                (args.write_synthetic / f"rollout-synthetic-{index:02d}.jsonl").write_bytes(rollout)
                (args.write_synthetic / f"transcript-synthetic-{index:02d}.jsonl").write_bytes(transcript)
            codex.append(codex_rollout_trace(f"synthetic-{index}", rollout))
            claude.append(claude_transcript_trace(f"synthetic-{index}", transcript, windows))
        groups["codex (synthetic)"] = codex
        groups["claude (synthetic)"] = claude
    for harness, traces in groups.items():
        print(render(harness, traces))
    print(subagent_table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
