"""The `st2.harness-state.v1` claim a wrapper writes when it launches an incarnation."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
from collections.abc import Callable, Container, Iterator
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, ValidationError

from guard.account import Account
from guard.constants import (
    AGENTS_DIR_NAME,
    MAX_STATE_BYTES,
    STATE_LOCK_NAME,
    STATE_RECORD_NAME,
    STATE_SCHEMA,
    WRAPPER_LOCK_NAME,
)
from guard.errors import Held, JsonRefused, RecordRefused
from guard.files import read_bounded
from guard.json_rule import loads_object
from guard.layout import AgentDir
from guard.procs import pid_alive, proc_stat
from guard.record import AT_FIRST_USE, Count, Harness, Millis, WireModel, optional_model, refuse_nul_characters
from guard.walk import open_append, open_chain

__all__ = [
    "CLAIM_HISTORY_LIMIT",
    "MAX_STATE_BYTES",
    "UNOBSERVED_LIMIT",
    "AgentLock",
    "ClaimHeld",
    "DesiredState",
    "HarnessState",
    "PastClaim",
    "Unobserved",
    "claim_agent",
    "held_by_live_wrapper",
    "new_claim",
    "parse_state",
    "process_identity",
    "read_state",
    "state_locked",
    "update_claim",
    "wrapper_lock_evidence",
    "write_state",
]


class ClaimHeld(Held):
    """Another wrapper holds the agent; `holder` is its claim (None while it has not written one yet)."""

    def __init__(self, holder: HarnessState | None) -> None:
        who = "another wrapper" if holder is None else f"wrapper pid {holder.wrapper_pid}"
        super().__init__(f"the agent is held by {who}")
        self.holder = holder


DesiredState = Literal["running", "stopped"]
# Enough recent claims to see a crash loop for what it is, bounded so the file stays small.
CLAIM_HISTORY_LIMIT = 32
# The newest stretches without a sidecar kept per claim (a sidecar that keeps dying is given up on
# after a few quick deaths; one that dies now and then over days is replaced each time).
UNOBSERVED_LIMIT = 16


class Unobserved(WireModel):
    """A stretch of the session no sidecar watched: from its sidecar's death to a replacement's
    ready, or open (`untilMs` null) when none came up before the session ended."""

    model_config = AT_FIRST_USE  # validated inside a claim, on its own only by a writer

    since_ms: Millis
    until_ms: Millis | None = None
    sidecar_pid: Count
    # The dead sidecar's return code: negative for the signal that killed it.
    sidecar_exit: Annotated[int, Field(strict=True)]

    def how_it_ended(self) -> str:
        if self.sidecar_exit >= 0:
            return f"exit status {self.sidecar_exit}"
        try:
            return f"killed by {signal.Signals(-self.sidecar_exit).name}"
        except ValueError:
            return f"killed by signal {-self.sidecar_exit}"


class PastClaim(WireModel):
    model_config = AT_FIRST_USE  # validated inside a claim, on its own only by a writer

    incarnation: str
    claimed_at_ms: Millis
    wrapper_pid: Count
    unobserved: list[Unobserved] = Field(default_factory=list, max_length=UNOBSERVED_LIMIT)


class HarnessState(WireModel):
    schema_id: Literal["st2.harness-state.v1"] = Field(default=STATE_SCHEMA, alias="schema")
    agent: str
    host: str
    harness: Harness
    incarnation: str
    claimed_at_ms: Millis
    wrapper_pid: Count
    desired_state: DesiredState
    history: list[PastClaim] = Field(default_factory=list, max_length=CLAIM_HISTORY_LIMIT)
    # Which process the pid was when it claimed (see `process_identity`), so a pid reused since
    # is not taken for a live wrapper. Null in claims written before it existed.
    wrapper_identity: str | None = None
    unobserved: list[Unobserved] = Field(default_factory=list, max_length=UNOBSERVED_LIMIT)
    # Additive (issue 35): the account the harness's own login states (guard.account), as the
    # wrapper read it when it planned the launch: the agent counts toward its account before its
    # first reading (a harness may write none until its first token usage). Null where none is stated;
    # one that does not read is null too, never a reason to refuse the claim.
    account: Annotated[Account | None, BeforeValidator(lambda value: optional_model(Account, value))] = None
    # Additive (issue 36): the harness was not launched by this wrapper but adopted after its own
    # start (`hctx adopt`, run by a hook `hctx setup` installed); its "wrapper" is the adopting
    # resident, which watches the harness and never signals it. False for a wrapped seat, and in
    # claims written before it existed.
    adopted: Annotated[bool, Field(strict=True)] = False

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True) + "\n"

    def claim(self) -> PastClaim:
        return PastClaim(
            incarnation=self.incarnation,
            claimed_at_ms=self.claimed_at_ms,
            wrapper_pid=self.wrapper_pid,
            unobserved=self.unobserved,
        )


def parse_state(data: bytes | str, *, harnesses: Container[str] | None = None) -> HarnessState:
    """The claim; `harnesses` as for `guard.record.parse_record` (None: any well-formed name)."""
    try:
        raw = loads_object(data)
        refuse_nul_characters(raw, data)
        state = HarnessState.model_validate(raw, by_alias=True)
    except (JsonRefused, RecordRefused, ValidationError) as exc:
        raise RecordRefused(f"harness-state refused: {exc}") from None
    if harnesses is not None and state.harness not in harnesses:
        raise RecordRefused(f"harness-state refused: harness {state.harness!r} is not one this reader knows")
    return state


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
    from guard.atomic import write_agent_file  # the writer's: a reader of claims never loads it (issue 38)

    write_agent_file(agent, STATE_RECORD_NAME, state.to_json().encode())


def new_claim(
    agent: AgentDir,
    harness: Harness,
    incarnation: str,
    now_ms: int,
    pid: int,
    previous: HarnessState | None,
    identity: str | None = None,
    *,
    adopted: bool = False,
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
        wrapper_identity=identity,
        adopted=adopted,
    )


def held_by_live_wrapper(state: HarnessState | None, here: str) -> bool:
    """Whether a wrapper on this host still runs this claim. Another host's pid means nothing here,
    nor does a pid that another process holds now."""
    if state is None or state.desired_state != "running" or state.host != here:
        return False
    if not pid_alive(state.wrapper_pid):
        return False
    return state.wrapper_identity is None or process_identity(state.wrapper_pid) in (None, state.wrapper_identity)


def process_identity(pid: int) -> str | None:
    """This boot and the process's start time: with the pid, one process for as long as the machine
    runs. None where /proc does not say."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    stat = proc_stat(pid)
    return None if stat is None else f"{boot}/{stat.started}"


@contextlib.contextmanager
def state_locked(agent: AgentDir) -> Iterator[HarnessState | None]:
    """The claim on disk, read under the agent's state lock, held for the block."""
    from guard.locks import agent_locked  # the writer's, as write_state's

    with agent_locked(agent, STATE_LOCK_NAME):
        yield read_state(agent)


def claim_agent(
    agent: AgentDir,
    harness: Harness,
    incarnation: str,
    now_ms: int,
    pid: int,
    *,
    locked: bool,
    relaunch_of: str | None = None,
    takeover: bool = False,
    adopted: bool = False,
) -> HarnessState:
    """A fresh incarnation claimed under the state lock, then the old record removed.

    `locked`: the caller holds the agent's wrapper lock (`AgentLock`), so no other wrapper runs it,
    whatever a claim on disk says; without it the claim is refused with ClaimHeld, unless this is a
    takeover. A relaunch (`relaunch_of`, the incarnation it follows) is refused once the claim is
    another's: it was taken over. `adopted`: the claim of an adopted harness (see HarnessState)."""
    from guard.store import remove_context  # the writer's, as write_state's

    with state_locked(agent) as previous:
        if relaunch_of is not None:
            if previous is None or previous.incarnation != relaunch_of:
                raise ClaimHeld(previous)
        elif not locked and not takeover:
            raise ClaimHeld(previous)
        state = new_claim(agent, harness, incarnation, now_ms, pid, previous, process_identity(pid), adopted=adopted)
        write_state(agent, state)
        remove_context(agent)
    return state


def update_claim(agent: AgentDir, incarnation: str, change: Callable[[HarnessState], HarnessState]) -> bool:
    """Rewrite the claim under the state lock, only while it is still `incarnation`'s (never over a
    takeover's); False when it no longer is."""
    with state_locked(agent) as state:
        if state is None or state.incarnation != incarnation:
            return False
        write_state(agent, change(state))
    return True


class AgentLock:
    """The agent's wrapper lock (WRAPPER_LOCK_NAME in its directory): an exclusive flock its wrapper
    takes before its first claim and holds until it exits, across its one exec into the resident
    (`across_exec`). Close-on-exec otherwise, and never passed to a child, so no harness or sidecar
    holds it; released by the kernel however the wrapper ends, SIGKILL included."""

    def __init__(self, agent: AgentDir) -> None:
        self.agent = agent
        self.fd: int | None = None

    @property
    def held(self) -> bool:
        return self.fd is not None

    def take(self) -> bool:
        """Take it if no other process holds it; whether it is held now."""
        if self.fd is None:
            fd = _open_wrapper_lock(self.agent)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            self.fd = fd
        return True

    def across_exec(self) -> tuple[int, bool]:
        """The lock's descriptor, kept open across this process's exec (the resident wrapper holds
        it for its whole life: the same open file, so the same flock), and whether it is held. One
        not held (a takeover that went on regardless) is opened all the same, for a relaunch to take."""
        fd = _open_wrapper_lock(self.agent) if self.fd is None else self.fd
        os.set_inheritable(fd, True)
        return fd, self.fd is not None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _open_wrapper_lock(agent: AgentDir) -> int:
    dir_fd = open_chain(agent.catalog, (AGENTS_DIR_NAME, agent.host, agent.identity), create=True)
    try:
        return open_append(dir_fd, WRAPPER_LOCK_NAME)  # a regular file: never a symlink, never a FIFO
    finally:
        os.close(dir_fd)


def wrapper_lock_evidence(agent: AgentDir, pid: int) -> str | None:
    """None when process `pid` holds the agent's wrapper lock: one of its descriptors is that very
    file and /proc/PID/fdinfo shows the exclusive flock on it. Otherwise what was found instead,
    for the message that refuses to signal it."""
    fd = _open_wrapper_lock(agent)
    try:
        lock = os.fstat(fd)
    finally:
        os.close(fd)
    where = f"{agent.host}/{agent.identity}'s wrapper lock"
    try:
        descriptors = os.listdir(f"/proc/{pid}/fd")
    except FileNotFoundError:
        return f"pid {pid} is not running"
    except OSError as exc:
        return f"pid {pid} ({_command(pid)}) cannot be looked into ({exc.strerror}), so nothing proves it holds {where}"
    for descriptor in descriptors:
        try:
            opened = os.stat(f"/proc/{pid}/fd/{descriptor}")
            info = Path(f"/proc/{pid}/fdinfo/{descriptor}").read_text()
        except OSError:
            continue
        if (opened.st_dev, opened.st_ino) != (lock.st_dev, lock.st_ino):
            continue
        if any(line.startswith("lock:") and "FLOCK" in line and "WRITE" in line for line in info.splitlines()):
            return None
    holders = _flock_holders(lock)
    held = f"it is held by pid {', '.join(f'{p} ({_command(p)})' for p in holders)}" if holders else "nothing holds it"
    return f"pid {pid} ({_command(pid)}) does not hold {where}; {held}"


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() or "?"
    except OSError:
        return "gone"


def _flock_holders(lock: os.stat_result) -> list[int]:
    """The pids /proc/locks names for flocks on this file."""
    device = f"{os.major(lock.st_dev):02x}:{os.minor(lock.st_dev):02x}:{lock.st_ino}"
    holders = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/locks").read_text().splitlines():
            fields = line.split()
            if len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == device and fields[4].isdigit():
                holders.append(int(fields[4]))
    return holders
