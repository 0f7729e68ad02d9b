"""The `st2.harness-state.v1` claim a wrapper writes when it launches an incarnation."""

from __future__ import annotations

import json
from typing import Literal

from pydantic import Field, ValidationError

from guard.constants import STATE_RECORD_NAME, STATE_SCHEMA
from guard.files import read_bounded
from guard.record import Count, Harness, Millis, RecordRefused, _Wire
from guard.store import AgentDir, write_agent_file

DesiredState = Literal["running", "stopped"]
# Enough recent claims to see a crash loop for what it is, bounded so the file stays small.
CLAIM_HISTORY_LIMIT = 32
MAX_STATE_BYTES = 256 * 1024


class PastClaim(_Wire):
    incarnation: str
    claimed_at_ms: Millis
    wrapper_pid: Count


class HarnessState(_Wire):
    schema_id: Literal["st2.harness-state.v1"] = Field(default=STATE_SCHEMA, alias="schema")
    agent: str
    host: str
    harness: Harness
    incarnation: str
    claimed_at_ms: Millis
    wrapper_pid: Count
    desired_state: DesiredState
    history: list[PastClaim] = Field(default_factory=list, max_length=CLAIM_HISTORY_LIMIT)

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True) + "\n"

    def claim(self) -> PastClaim:
        return PastClaim(incarnation=self.incarnation, claimed_at_ms=self.claimed_at_ms, wrapper_pid=self.wrapper_pid)


def parse_state(data: bytes | str) -> HarnessState:
    try:
        return HarnessState.model_validate(json.loads(data), by_alias=True)
    except (ValueError, RecursionError, ValidationError) as exc:
        raise RecordRefused(f"harness-state refused: {exc}") from None


def read_state(agent: AgentDir) -> HarnessState | None:
    """The claim on disk, or None when there is none or it cannot be trusted."""
    data = read_bounded(None, agent.path / STATE_RECORD_NAME, MAX_STATE_BYTES).data
    if data is None:
        return None
    try:
        return parse_state(data)
    except RecordRefused:
        return None


def write_state(agent: AgentDir, state: HarnessState) -> None:
    write_agent_file(agent, STATE_RECORD_NAME, state.to_json().encode())


def new_claim(
    agent: AgentDir, harness: Harness, incarnation: str, now_ms: int, pid: int, previous: HarnessState | None
) -> HarnessState:
    """The next claim, carrying the previous ones (newest first) so a crash loop stays visible."""
    history = [] if previous is None else [previous.claim(), *previous.history]
    return HarnessState(
        agent=agent.identity,
        host=agent.host,
        harness=harness,
        incarnation=incarnation,
        claimed_at_ms=now_ms,
        wrapper_pid=pid,
        desired_state="running",
        history=history[:CLAIM_HISTORY_LIMIT],
    )
