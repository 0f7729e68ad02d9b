"""Codex's typed events and wire names: what every Codex decoder makes, whichever wire the bytes
came by (the app-server's JSON-RPC in `sidecar.harnesses.codex.producer`, the rollout file's lines in
`sidecar.transcripts`), and all the producer ever sees.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Final, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from guard.errors import FrameRejected
from guard.record import Count
from sidecar.producer import Percent

__all__ = [
    "FRAME_TYPE",
    "ROLLOUT",
    "STDOUT",
    "WEBSOCKET",
    "CompactionConfig",
    "CompactionItem",
    "HarnessBuild",
    "Id",
    "RateLimitsUpdated",
    "RateWindow",
    "SubagentsSpawned",
    "ThreadCompacted",
    "ThreadOpened",
    "TokenUsage",
    "Tokens",
    "TurnState",
    "event",
]

# The one name of the tap's frames on the channel (the wrapper's launch plan uses it too).
FRAME_TYPE: Final = "codex.rpc"

# The wires Codex is read from besides the channel.
STDOUT: Final = "stdout"  # the app-server's stdio stream: JSONL, one message a line
WEBSOCKET: Final = "websocket"  # one relayed websocket text message per `receive_data`
ROLLOUT: Final = "rollout"  # an interactive seat's rollout file (sidecar.transcripts)

Tokens = Count
Id = Annotated[str, Field(min_length=1, strict=True)]


# ---------------------------------------------------------------------------------------------
# The typed events: one class per kind of fact, whichever wire it came by


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True, strict=True, extra="forbid")


class TokenUsage(_Event):
    """A thread's usage (`thread/tokenUsage/updated`, a rollout `token_count`'s `info`)."""

    thread_id: Id
    tokens_in_window: Tokens  # `last.totalTokens`: what the window holds
    session_total_tokens: Tokens  # `total.totalTokens`: spend, never occupancy
    context_window: Tokens | None  # `modelContextWindow`, already Codex's effective window


class ThreadOpened(_Event):
    """A thread that is the agent's own: one a client started, resumed or forked (`thread/started`,
    a `thread/start`/`thread/resume`/`thread/fork` result's `thread`, neither naming a
    `parentThreadId`), or the rollout an interactive seat writes. A subagent's thread is never one:
    Codex sends no `thread/started` for it, only its `turn/*`, `item/*` and usage under its id."""

    thread_id: Id


class SubagentsSpawned(_Event):
    """A finished `spawnAgent` `collabAgentToolCall` item: the threads it started for a sender."""

    sender_thread_id: Id
    thread_ids: tuple[Id, ...]
    model: Annotated[str, Field(max_length=128)] | None


class TurnState(_Event):
    """`turn/started` (running) or `turn/completed` (not) of a thread."""

    thread_id: Id
    running: bool


class RateWindow(_Event):
    used_percent: Percent
    window_minutes: Tokens | None
    # `resetsAt`, unix seconds, as Codex stated it (from the `x-codex-*-reset-at` header or
    # `wham/usage`); None unstated. Additive (issue 29).
    resets_at_s: Tokens | None = None


class RateLimitsUpdated(_Event):
    """`account/rateLimits/updated`: a sparse snapshot, a null or absent window says nothing."""

    primary: RateWindow | None
    secondary: RateWindow | None


class CompactionItem(_Event):
    """A `contextCompaction` thread item (`item/started`, `item/completed`, a rollout `compacted`)."""

    item_id: Id
    turn_id: Id | None
    thread_id: Id | None = None  # the thread it compacted, where the item's params name it


class ThreadCompacted(_Event):
    """The deprecated `thread/compacted` notification: a turn's compaction without an item."""

    turn_id: Id


class HarnessBuild(_Event):
    """The build that speaks: the initialize response's user agent, or a thread's `cliVersion`."""

    version: Annotated[str, Field(max_length=64)]
    from_user_agent: bool


class CompactionConfig(_Event):
    """The compaction settings the wrapper read from the config Codex loads (the module doc)."""

    auto_compact_token_limit: Tokens | None = None
    model_context_window: Tokens | None = None


_E = TypeVar("_E", bound=_Event)


def event(model: type[_E], source: Mapping[str, str], **values: Any) -> _E:
    """A typed event from values a decoder read; FrameRejected (the drop's reason, naming the value
    as `source` says its wire spells it) when they are not one (a count past 2**53, a percent < 0)."""
    try:
        return model(**values)
    except ValidationError as exc:
        first = exc.errors(include_input=False, include_url=False)[0]
        where = ".".join(source.get(str(part), str(part)) for part in first["loc"])
        raise FrameRejected(f"{where}: {first['msg']}") from None
