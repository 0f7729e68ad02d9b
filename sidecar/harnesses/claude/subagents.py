"""Claude's subagents' own numbers, from each subagent's own transcript (issue 28). Sans-I/O.

Measured on 2.1.250 and 2.1.332 (tests/live/test_subagents_live.py): every subagent the `Agent`
tool starts writes `<projects>/<project>/<session>/subagents/agent-<agent_id>.jsonl`, each line
`isSidechain` and naming its `agentId`; `SubagentStop` names that file as `agent_transcript_path`.
Its context is its newest assistant message's usage, input + cache_read + cache_creation, as for
the main agent (`sidecar.harnesses.claude.transcript.claude_usage`). Its window is not in its
transcript (the model is): Claude states it to the `subagentStatusLine` command (issue 37, the
producer's `SubagentRows`); where Claude states none, the model table `hctx scan` uses gives it,
named as the source, or it stays null; never the parent's. The `<subagent_tokens>` a
`<task-notification>` carries is no context (last context + last output on 2.1.332, + turns on
2.1.250) and is never read.

The `subagent` wire is one subagent transcript's bytes from its start, as the transport
(`sidecar.harnesses.claude.follow`) reads them where the harness writes; `SubagentDecoder` makes its
lines the producer's events. `ModelWindows` is the table the wrapper read at launch, a fact the
transport submits once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Annotated, Final

from pydantic import BaseModel, ConfigDict, Field

from guard.errors import JsonRefused
from guard.json_rule import loads_object
from guard.record import MAX_COUNT
from sidecar.decoding import Dropped, LineByLine
from sidecar.framing import Line, LineFramer, Oversized
from sidecar.harnesses.claude.compaction import ClaudeCompaction
from sidecar.harnesses.claude.transcript import claude_compaction, claude_usage
from sidecar.transcripts import HEAD_BYTES, MAX_LINE_BYTES

__all__ = [
    "MAX_TRANSCRIPT_BYTES",
    "SUBAGENT_WIRE",
    "ClaudeTransport",
    "ModelWindows",
    "SubagentCompacted",
    "SubagentDecoder",
    "SubagentTranscript",
    "SubagentUsage",
    "is_agent_id",
    "subagent_transcript",
]

SUBAGENT_WIRE: Final = "subagent"
# A subagent transcript past this is no file the sidecar reads (a runaway, a planted sparse file).
MAX_TRANSCRIPT_BYTES: Final = 256 * 1024 * 1024
# Claude's agent ids are `a` + 16 hex digits (2.1.250, 2.1.332); a name a path is built from is only
# ever this plain, so no id can walk out of the subagents directory.
_AGENT_ID: Final = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
_BOUNDARY_KEY: Final = b'"subtype":"compact_boundary"'

_Model = Annotated[str, Field(min_length=1, max_length=256)]


class ClaudeTransport(BaseModel):
    """What the wrapper's launch plan hands the transport: where Claude writes its projects
    (`$CLAUDE_CONFIG_DIR/projects`, else `~/.claude/projects`) and the model table `hctx scan`
    uses (shipped, extended by the user's), read at launch."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    projects_dir: Annotated[str, Field(min_length=1, max_length=4096)]
    windows: dict[_Model, Annotated[int, Field(gt=0, le=MAX_COUNT)]] = {}
    poll_seconds: Annotated[float, Field(gt=0, le=60)] = 0.5
    # Issue 37: Claude's auto-compaction as the launch read it (a fact submitted once, as `windows`).
    compaction: ClaudeCompaction | None = None


@dataclass(frozen=True, slots=True)
class ModelWindows:
    """The model table the launch read (a fact): model id -> window tokens."""

    windows: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SubagentUsage:
    """A subagent's newest assistant message: its own context, in its own transcript."""

    agent_id: str
    used_tokens: int
    model: str | None
    observed_at_ms: int


@dataclass(frozen=True, slots=True)
class SubagentCompacted:
    """A `compact_boundary` in a subagent's own transcript: a compaction of that subagent."""

    agent_id: str
    at_ms: int | None


@dataclass(frozen=True, slots=True)
class SubagentTranscript:
    """A transcript the producer wants read: the subagent's, at the path the harness names."""

    agent_id: str
    path: str
    finished: bool


def is_agent_id(text: str) -> bool:
    """Whether `text` is as plain as Claude's agent ids: nothing a path or a terminal reads."""
    return _AGENT_ID.match(text) is not None


def subagent_transcript(
    agent_id: str, named: str | None, session_id: str | None, session_transcript: str | None
) -> str | None:
    """The subagent's transcript path: the one its hook names (`agent_transcript_path`), else the
    one Claude writes beside the session's (`<dir>/<session>/subagents/agent-<id>.jsonl`); None
    when neither is given, or the id could name anything but one file there."""
    if not _AGENT_ID.match(agent_id):
        return None
    if named is not None:
        return named
    if session_id is None or session_transcript is None or not _AGENT_ID.match(session_id):
        return None
    return str(PurePosixPath(session_transcript).parent / session_id / "subagents" / f"agent-{agent_id}.jsonl")


class SubagentDecoder(LineByLine):
    """One subagent transcript's bytes, from its first, to `SubagentUsage` and `SubagentCompacted`
    events. A line over MAX_LINE_BYTES (a huge tool result) is skipped, but still counted when its
    head says it is a compaction; a line the JSON rule refuses is a counted drop; any other line says
    nothing of the context and makes no event."""

    def __init__(self) -> None:
        self.framer = LineFramer(MAX_LINE_BYTES, head_bytes=HEAD_BYTES)
        self._agent: str | None = None  # the id the file's own lines name, once one did

    def end_of_data(self) -> list[object]:
        tail = self.framer.end_of_data()
        return [] if tail is None else self._line(tail)  # the last line may lack its newline yet

    def _line(self, line: Line | Oversized) -> list[object]:
        if isinstance(line, Oversized):
            if _BOUNDARY_KEY in line.head and self._agent is not None:
                return [SubagentCompacted(self._agent, None)]
            return []
        usage = claude_usage(line.data, sidechain=True)
        if usage is not None and usage.agent_id is not None:
            self._agent = usage.agent_id
            return [SubagentUsage(usage.agent_id, usage.used_tokens, usage.model, usage.observed_at_ms)]
        compaction = claude_compaction(line.data, sidechain=True)
        if compaction is not None and compaction.agent_id is not None:
            self._agent = compaction.agent_id
            return [SubagentCompacted(compaction.agent_id, compaction.at_ms)]
        if not line.data.strip():
            return []
        # Only a line that made no event is parsed here (a usage line was parsed once, above): the
        # one JSON rule, so a damaged line is a counted drop, as on every wire.
        try:
            loads_object(line.data)
        except JsonRefused as exc:
            return [Dropped(str(exc), SUBAGENT_WIRE)]
        return []
