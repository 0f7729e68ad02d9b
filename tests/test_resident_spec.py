"""The launcher -> resident spec is a typed structure, checked field by field when the resident
reads it: a spec it cannot run is a one-line refusal (status 2), never a KeyError mid-session."""

from __future__ import annotations

import marshal
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from wrapper.launch.launcher import RESIDENT_COMMAND, WrapOptions
from wrapper.launch.spec import (
    AgentRef,
    Begin,
    Incarnation,
    Options,
    Plan,
    SidecarBack,
    SidecarDied,
    Spec,
    SpecError,
    Stopped,
    Teardown,
)

AGENT = AgentRef("/tmp/catalog", "host", "agent")
OPTIONS = Options(AGENT, "pi", ("pi", "--x"), "on-failure", 3, 1.0, 60.0, False, None, heartbeat_s=20)
PLAN = Plan(("pi",), "/tmp", {"A": "1"}, None, True, 1234)
BEGUN = Incarnation(AGENT, "pi", "inc", plan=PLAN, status=None, channel_dir="/tmp/d", channel="/tmp/d/s")


def wire(spec: Spec) -> dict[str, object]:
    loaded: dict[str, object] = marshal.loads(spec.dumps())
    return loaded


def test_a_spec_goes_and_comes_back_whole() -> None:
    spec = Spec.loads(Spec(OPTIONS, BEGUN, 7, True).dumps())
    assert wire(spec) == wire(Spec(OPTIONS, BEGUN, 7, True))
    assert spec.incarnation.plan is not None and spec.incarnation.plan.env == {"A": "1"}
    assert spec.options.argv == ("pi", "--x") and spec.lock_fd == 7 and spec.lock_held is True
    options = WrapOptions.from_resident(spec.options)
    assert options.for_resident().to_wire() == OPTIONS.to_wire() and options.restart == "on-failure"
    assert options.heartbeat_s == 20  # HCTX_HEARTBEAT_S, for every incarnation's sidecar


@pytest.mark.parametrize(
    ("path", "value", "said"),
    [
        (("lockFd",), "7", "'lockFd' is str"),
        (("lockHeld",), 1, "'lockHeld' is int"),
        (("options", "restart"), "sometimes", "restart 'sometimes'"),
        (("options", "maxRestarts"), True, "'maxRestarts' is bool"),
        (("options", "argv"), ["pi", 3], "options.argv: not a list of strings"),
        (("options", "heartbeatS"), "20", "'heartbeatS' is str"),
        (("incarnation", "plan", "env"), {"A": 1}, "env holds a name or value that is not a string"),
        (("incarnation", "status"), 2, "a plan and a status, or neither"),
        (("incarnation", "agent"), None, "'agent' is NoneType"),
    ],
)
def test_a_wrong_field_is_named(path: tuple[str, ...], value: object, said: str) -> None:
    data = wire(Spec(OPTIONS, BEGUN, 7, True))
    where: dict[str, object] = data
    for key in path[:-1]:
        where = where[key]  # type: ignore[assignment]
    where[path[-1]] = value
    with pytest.raises(SpecError, match=said.replace("(", r"\(")):
        Spec.loads(marshal.dumps(data))
    del where[path[-1]]
    with pytest.raises(SpecError, match=f"no '{path[-1]}'"):
        Spec.loads(marshal.dumps(data))


def test_the_resident_refuses_a_spec_it_cannot_run_in_one_line(tmp_path: Path) -> None:
    spec = tmp_path / "spec"
    spec.write_bytes(marshal.dumps({"options": {}, "incarnation": {}}))
    with open(spec, "rb") as held:
        done = subprocess.run([sys.executable, "-I", "-S", "-c", RESIDENT_COMMAND, os.fspath(REPO), "--spec-fd",
                               str(held.fileno())], pass_fds=(held.fileno(),), capture_output=True, text=True,
                              timeout=30)  # fmt: skip
    assert done.returncode == 2
    assert done.stderr == "hctx wrap: the resident cannot run this spec: options: no 'restart'\n"


def test_each_step_payload_goes_and_comes_back_whole() -> None:
    died = SidecarDied(AGENT, "inc", 41, -9, 0.25, True, 1_700_000_000_000)
    steps = [Begin(OPTIONS, 2, "inc"), Teardown(PLAN, "pi"), Stopped(AGENT, "inc"), died, SidecarBack(AGENT, "inc", 1)]
    for step in steps:
        back = type(step).from_wire(marshal.loads(marshal.dumps(step.to_wire())))  # type: ignore[attr-defined]
        assert back.to_wire() == step.to_wire() and back.name == step.name


def test_a_step_refuses_a_payload_it_cannot_read_in_one_line() -> None:
    payload = marshal.dumps({"agent": AGENT.to_wire(), "incarnation": "inc", "untilMs": "soon"})
    step = [sys.executable, "-m", "wrapper.launch.launcher", "sidecar-back"]
    done = subprocess.run(step, cwd=REPO, capture_output=True, input=payload, timeout=60)
    assert done.returncode == 2
    assert b"the sidecar-back step's payload is not one this hctx reads (sidecar-back: 'untilMs' is str)" in done.stderr
    assert b"Traceback" not in done.stderr
