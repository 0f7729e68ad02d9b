"""The launcher -> resident spec, and the resident -> step payloads: what crosses `hctx wrap`'s exec
into the resident (`Spec`, in `marshal`) and what the resident hands each
`python -m wrapper.launch.launcher STEP` on its stdin (`Step`).

Plain classes (dataclasses would bring inspect and re into the resident, a megabyte), carried as
dicts of plain values and checked field by field on read, so a spec from another hctx version is a
clear refusal, never a KeyError mid-session. The standard library only, as the resident.
"""

from __future__ import annotations

import marshal

from guard.errors import Unusable  # a module that imports nothing: the resident stays the standard library

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: the typing module is not worth its import here
    from typing import Any

__all__ = [
    "Adoption",
    "AgentRef",
    "Begin",
    "Incarnation",
    "Options",
    "Plan",
    "SidecarBack",
    "SidecarDied",
    "Spec",
    "SpecError",
    "Step",
    "Stopped",
    "Teardown",
]


class SpecError(Unusable):
    """A spec (or a step's answer) that is not one this resident can run; the message says which field."""


def _field(data: object, key: str, kinds: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(data, dict) or key not in data:
        raise SpecError(f"{where}: no {key!r}")
    value = data[key]
    allowed = kinds if isinstance(kinds, tuple) else (kinds,)
    if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):  # a bool is an int
        raise SpecError(f"{where}: {key!r} is {type(value).__name__}")
    return value


def _strings(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(item, str) for item in value):
        raise SpecError(f"{where}: not a list of strings")
    return tuple(value)


class AgentRef:
    """The agent an incarnation runs as (`guard.catalog.AgentDir`'s three names)."""

    __slots__ = ("catalog", "host", "identity")

    def __init__(self, catalog: str, host: str, identity: str) -> None:
        self.catalog, self.host, self.identity = catalog, host, identity

    def to_wire(self) -> dict[str, object]:
        return {"catalog": self.catalog, "host": self.host, "identity": self.identity}

    @classmethod
    def from_wire(cls, data: object) -> AgentRef:
        return cls(*(_field(data, key, str, "agent") for key in ("catalog", "host", "identity")))


class Options:
    """`hctx wrap`'s options the resident keeps for its relaunches (`wrapper.launch.launcher.WrapOptions`)."""

    __slots__ = (
        "agent",
        "argv",
        "harness",
        "heartbeat_s",
        "max_restarts",
        "record",
        "record_raw",
        "restart",
        "restart_delay_max_s",
        "restart_delay_s",
        "takeover",
    )

    def __init__(
        self,
        agent: AgentRef,
        harness: str,
        argv: tuple[str, ...],
        restart: str,
        max_restarts: int | None,
        restart_delay_s: float,
        restart_delay_max_s: float,
        takeover: bool,
        record: str | None,
        record_raw: bool = False,
        heartbeat_s: int | None = None,
    ) -> None:
        self.agent, self.harness, self.argv, self.restart = agent, harness, argv, restart
        self.max_restarts, self.restart_delay_s, self.restart_delay_max_s = (
            max_restarts,
            restart_delay_s,
            restart_delay_max_s,
        )
        self.takeover, self.record, self.record_raw = takeover, record, record_raw
        self.heartbeat_s = heartbeat_s  # HCTX_HEARTBEAT_S, checked by `hctx wrap`: each sidecar's heartbeat

    def to_wire(self) -> dict[str, object]:
        return {
            "agent": self.agent.to_wire(),
            "harness": self.harness,
            "argv": list(self.argv),
            "restart": self.restart,
            "maxRestarts": self.max_restarts,
            "restartDelayS": self.restart_delay_s,
            "restartDelayMaxS": self.restart_delay_max_s,
            "takeover": self.takeover,
            "record": self.record,
            "recordRaw": self.record_raw,
            "heartbeatS": self.heartbeat_s,
        }

    @classmethod
    def from_wire(cls, data: object) -> Options:
        where = "options"
        restart = _field(data, "restart", str, where)
        if restart not in ("no", "on-failure", "always"):
            raise SpecError(f"{where}: restart {restart!r}")
        return cls(
            AgentRef.from_wire(_field(data, "agent", dict, where)),
            _field(data, "harness", str, where),
            _strings(_field(data, "argv", (list, tuple), where), where + ".argv"),
            restart,
            _field(data, "maxRestarts", (int, type(None)), where),
            float(_field(data, "restartDelayS", (int, float), where)),
            float(_field(data, "restartDelayMaxS", (int, float), where)),
            _field(data, "takeover", bool, where),
            _field(data, "record", (str, type(None)), where),
            _field(data, "recordRaw", bool, where),
            _field(data, "heartbeatS", (int, type(None)), where),
        )


class Plan:
    """A prepared launch (`sidecar.launch.LaunchPlan`, as far as the resident runs it)."""

    __slots__ = ("argv", "cwd", "env", "owner", "tap", "teardown")

    def __init__(
        self, argv: tuple[str, ...], cwd: str, env: dict[str, str], tap: str | None, teardown: bool, owner: int
    ) -> None:
        self.argv, self.cwd, self.env, self.tap, self.teardown, self.owner = argv, cwd, env, tap, teardown, owner

    def to_wire(self) -> dict[str, object]:
        return {
            "argv": list(self.argv),
            "cwd": self.cwd,
            "env": dict(self.env),
            "tap": self.tap,
            "teardown": self.teardown,
            "owner": self.owner,
        }

    @classmethod
    def from_wire(cls, data: object) -> Plan:
        where = "plan"
        env = _field(data, "env", dict, where)
        if not all(isinstance(key, str) and isinstance(value, str) for key, value in env.items()):
            raise SpecError(f"{where}: env holds a name or value that is not a string")
        return cls(
            _strings(_field(data, "argv", (list, tuple), where), where + ".argv"),
            _field(data, "cwd", str, where),
            env,
            _field(data, "tap", (str, type(None)), where),
            _field(data, "teardown", bool, where),
            _field(data, "owner", int, where),
        )


class Incarnation:
    """The claimed incarnation as the resident runs it (`wrapper.launch.launcher.begin_incarnation`):
    its prepared launch and channel, or, when the launch could not be prepared, the status it ends with.
    `record_fd`, `record_raw` and `heartbeat_s` (`--record`'s open file, `--record-raw`,
    HCTX_HEARTBEAT_S) are the resident's to set: they come with the spec once, not with each
    incarnation."""

    __slots__ = (
        "account",
        "agent",
        "channel",
        "channel_dir",
        "harness",
        "heartbeat_s",
        "incarnation",
        "plan",
        "record_fd",
        "record_raw",
        "status",
        "transport",
    )

    def __init__(
        self,
        agent: AgentRef,
        harness: str,
        incarnation: str,
        plan: Plan | None = None,
        status: int | None = 2,
        transport: str | None = None,
        account: str | None = None,
        channel_dir: str = "",
        channel: str = "",
    ) -> None:
        self.agent, self.harness, self.incarnation, self.plan, self.status = agent, harness, incarnation, plan, status
        self.transport, self.account = transport, account
        self.channel_dir, self.channel = channel_dir, channel
        self.record_fd: int | None = None
        self.record_raw = False
        self.heartbeat_s: int | None = None

    def to_wire(self) -> dict[str, object]:
        return {
            "agent": self.agent.to_wire(),
            "harness": self.harness,
            "incarnation": self.incarnation,
            "plan": None if self.plan is None else self.plan.to_wire(),
            "status": self.status,
            "transport": self.transport,
            "account": self.account,
            "channelDir": self.channel_dir,
            "channel": self.channel,
        }

    @classmethod
    def from_wire(cls, data: object) -> Incarnation:
        where = "incarnation"
        plan = _field(data, "plan", (dict, type(None)), where)
        status = _field(data, "status", (int, type(None)), where)
        if (plan is None) == (status is None):
            raise SpecError(f"{where}: a plan and a status, or neither")
        return cls(
            AgentRef.from_wire(_field(data, "agent", dict, where)),
            _field(data, "harness", str, where),
            _field(data, "incarnation", str, where),
            None if plan is None else Plan.from_wire(plan),
            status,
            _field(data, "transport", (str, type(None)), where),
            _field(data, "account", (str, type(None)), where),
            _field(data, "channelDir", str, where),
            _field(data, "channel", str, where),
        )


class Adoption:
    """A harness this resident adopted (`hctx adopt`, wrapper.launch.adopt) rather than launched: the
    process it watches (its pid and start time in clock ticks since boot, which together name one
    process) and the channel lines the trigger could not deliver before the sidecar listened."""

    __slots__ = ("pending", "pid", "start_ticks")

    def __init__(self, pid: int, start_ticks: int, pending: bytes = b"") -> None:
        self.pid, self.start_ticks, self.pending = pid, start_ticks, pending

    def to_wire(self) -> dict[str, object]:
        return {"pid": self.pid, "startTicks": self.start_ticks, "pending": self.pending}

    @classmethod
    def from_wire(cls, data: object) -> Adoption:
        where = "adoption"
        return cls(_field(data, "pid", int, where), _field(data, "startTicks", int, where),
                   _field(data, "pending", bytes, where))  # fmt: skip


class Spec:
    """What `hctx wrap` (or `hctx adopt`, with `adoption`) hands the resident across its exec."""

    __slots__ = ("adoption", "incarnation", "lock_fd", "lock_held", "options", "record_fd")

    def __init__(
        self,
        options: Options,
        incarnation: Incarnation,
        lock_fd: int,
        lock_held: bool,
        record_fd: int | None = None,
        adoption: Adoption | None = None,
    ) -> None:
        self.options, self.incarnation, self.lock_fd, self.lock_held = options, incarnation, lock_fd, lock_held
        self.record_fd = record_fd  # `--record`'s file, open: every sidecar of every incarnation gets it
        self.adoption = adoption

    def dumps(self) -> bytes:
        return marshal.dumps(
            {
                "options": self.options.to_wire(),
                "incarnation": self.incarnation.to_wire(),
                "lockFd": self.lock_fd,
                "lockHeld": self.lock_held,
                "recordFd": self.record_fd,
                "adoption": None if self.adoption is None else self.adoption.to_wire(),
            }
        )

    @classmethod
    def loads(cls, data: bytes) -> Spec:
        try:
            wire = marshal.loads(data)
        except (EOFError, ValueError, TypeError) as exc:
            raise SpecError(f"not a spec: {exc}") from None
        return cls(
            Options.from_wire(_field(wire, "options", dict, "spec")),
            Incarnation.from_wire(_field(wire, "incarnation", dict, "spec")),
            _field(wire, "lockFd", int, "spec"),
            _field(wire, "lockHeld", bool, "spec"),
            _field(wire, "recordFd", (int, type(None)), "spec"),
            None if (adopted := _field(wire, "adoption", (dict, type(None)), "spec")) is None
            else Adoption.from_wire(adopted),
        )  # fmt: skip


# --- the resident -> step payloads (`python -m wrapper.launch.launcher STEP`), typed the same way ----------


class Step:
    """A step's payload; `name` is the step `wrapper.launch.launcher` runs with it."""

    __slots__ = ()
    name = ""

    def to_wire(self) -> dict[str, object]:
        raise NotImplementedError


class Begin(Step):
    """A relaunch: claim the agent again and prepare; the answer is an `Incarnation`."""

    __slots__ = ("options", "relaunch_of", "restarts")
    name = "begin"

    def __init__(self, options: Options, restarts: int, relaunch_of: str) -> None:
        self.options, self.restarts, self.relaunch_of = options, restarts, relaunch_of

    def to_wire(self) -> dict[str, object]:
        return {"options": self.options.to_wire(), "restarts": self.restarts, "relaunchOf": self.relaunch_of}

    @classmethod
    def from_wire(cls, data: object) -> Begin:
        return cls(Options.from_wire(_field(data, "options", dict, "begin")), _field(data, "restarts", int, "begin"),
                   _field(data, "relaunchOf", str, "begin"))  # fmt: skip


class Teardown(Step):
    """What a launch's `prepare` left behind, to undo."""

    __slots__ = ("harness", "plan")
    name = "teardown"

    def __init__(self, plan: Plan, harness: str) -> None:
        self.plan, self.harness = plan, harness

    def to_wire(self) -> dict[str, object]:
        return {"plan": self.plan.to_wire(), "harness": self.harness}

    @classmethod
    def from_wire(cls, data: object) -> Teardown:
        return cls(Plan.from_wire(_field(data, "plan", dict, "teardown")), _field(data, "harness", str, "teardown"))


class Stopped(Step):
    """The claim's final `stopped`."""

    __slots__ = ("agent", "incarnation")
    name = "stopped"

    def __init__(self, agent: AgentRef, incarnation: str) -> None:
        self.agent, self.incarnation = agent, incarnation

    def to_wire(self) -> dict[str, object]:
        return {"agent": self.agent.to_wire(), "incarnation": self.incarnation}

    @classmethod
    def from_wire(cls, data: object) -> Stopped:
        return cls(AgentRef.from_wire(_field(data, "agent", dict, "stopped")),
                   _field(data, "incarnation", str, "stopped"))  # fmt: skip


class SidecarDied(Step):
    """A sidecar died while its harness ran: the log line, the claim's gap, maybe a terminal line."""

    __slots__ = ("agent", "died_at_ms", "incarnation", "pid", "retry_in_s", "returncode", "tell_terminal")
    name = "sidecar-died"

    def __init__(self, agent: AgentRef, incarnation: str, pid: int, returncode: int, retry_in_s: float | None,
                 tell_terminal: bool, died_at_ms: int) -> None:  # fmt: skip
        self.agent, self.incarnation, self.pid, self.returncode = agent, incarnation, pid, returncode
        self.retry_in_s, self.tell_terminal, self.died_at_ms = retry_in_s, tell_terminal, died_at_ms

    def to_wire(self) -> dict[str, object]:
        return {"agent": self.agent.to_wire(), "incarnation": self.incarnation, "pid": self.pid,
                "returncode": self.returncode, "retryInS": self.retry_in_s, "tellTerminal": self.tell_terminal,
                "diedAtMs": self.died_at_ms}  # fmt: skip

    @classmethod
    def from_wire(cls, data: object) -> SidecarDied:
        where = "sidecar-died"
        retry = _field(data, "retryInS", (int, float, type(None)), where)
        return cls(AgentRef.from_wire(_field(data, "agent", dict, where)), _field(data, "incarnation", str, where),
                   _field(data, "pid", int, where), _field(data, "returncode", int, where),
                   None if retry is None else float(retry), _field(data, "tellTerminal", bool, where),
                   _field(data, "diedAtMs", int, where))  # fmt: skip


class SidecarBack(Step):
    """A replacement is ready: the claim's gap closes."""

    __slots__ = ("agent", "incarnation", "until_ms")
    name = "sidecar-back"

    def __init__(self, agent: AgentRef, incarnation: str, until_ms: int) -> None:
        self.agent, self.incarnation, self.until_ms = agent, incarnation, until_ms

    def to_wire(self) -> dict[str, object]:
        return {"agent": self.agent.to_wire(), "incarnation": self.incarnation, "untilMs": self.until_ms}

    @classmethod
    def from_wire(cls, data: object) -> SidecarBack:
        where = "sidecar-back"
        return cls(AgentRef.from_wire(_field(data, "agent", dict, where)), _field(data, "incarnation", str, where),
                   _field(data, "untilMs", int, where))  # fmt: skip
