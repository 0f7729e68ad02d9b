"""Recordings `hctx wrap --record` made of real sessions of pinned builds (the live tests, run with
`HCTX_KEEP_RECORDINGS=1`, keep them under fixtures/recordings/<harness>/wrapped/; docs/recording.md):
each replays, through the live sidecar's own setup, to the numbers the live session published."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidecar.registry import spec_for
from sidecar.replay import read_header, replay_recording
from tests.conformance import RECORDINGS

Published = list[tuple[str, int | None, float | None, int]]  # reason, usedTokens, usedPercent, compactions

# What each live test asserted its session published (tests/live/), as the recording replays it.
WRAPPED: dict[str, tuple[str, Published]] = {
    "claude/wrapped/2.1.332.rec": ("2.1.332", [
        ("bucket", None, None, 0), ("bucket", 20001, 10.0, 0), ("bucket", 61000, 31.0, 0),
        ("compaction", 61000, 31.0, 1), ("bucket", 0, 0.0, 1), ("bucket", 5000, 3.0, 1),
    ]),
    "codex/wrapped/stdio-resume-0.171.0.rec": ("0.171.0", [
        ("bucket", 30500, 10.0, 0), ("rate-limits", 30500, 10.0, 0), ("bucket", 90800, 44.0, 0),
        ("rate-limits", 90800, 44.0, 0), ("compaction", 90800, 44.0, 1), ("rate-limits", 90800, 44.0, 1),
        ("bucket", 92500, 45.0, 1), ("bucket", 6114, 0.0, 1), ("bucket", 20300, 5.0, 1),
        ("rate-limits", 20300, 5.0, 1), ("bucket", 175900, 92.0, 1), ("rate-limits", 175900, 92.0, 1),
        ("compaction", 175900, 92.0, 2), ("rate-limits", 175900, 92.0, 2), ("bucket", 177200, 93.0, 2),
        ("bucket", 6142, 0.0, 2), ("bucket", 18250, 4.0, 2), ("rate-limits", 18250, 4.0, 2),
    ]),
    "codex/wrapped/websocket-0.171.0.rec": ("0.171.0", [
        ("bucket", 30500, 10.0, 0), ("rate-limits", 30500, 10.0, 0), ("bucket", 90800, 44.0, 0),
        ("rate-limits", 90800, 44.0, 0), ("compaction", 90800, 44.0, 1), ("rate-limits", 90800, 44.0, 1),
        ("bucket", 92500, 45.0, 1), ("bucket", 6114, 0.0, 1), ("bucket", 20300, 5.0, 1),
        ("rate-limits", 20300, 5.0, 1), ("bucket", 175900, 92.0, 1), ("rate-limits", 175900, 92.0, 1),
        ("compaction", 175900, 92.0, 2), ("rate-limits", 175900, 92.0, 2), ("bucket", 177200, 93.0, 2),
        ("bucket", 6142, 0.0, 2), ("bucket", 18250, 4.0, 2), ("rate-limits", 18250, 4.0, 2),
        ("bucket", 40400, 16.0, 2), ("rate-limits", 40400, 16.0, 2), ("bucket", 50500, 22.0, 2),
        ("rate-limits", 50500, 22.0, 2),
    ]),
    "omp/wrapped/omp-18.2.3.rec": ("18.2.3", [
        ("bucket", 15122, 47.25625, 0), ("bucket", 15423, 48.196875, 0), ("bucket", 9600, 30.0, 0),
        ("bucket", 16000, 50.0, 0), ("compaction", 15186, 47.45625, 1), ("bucket", 15494, 48.41875, 1),
        ("bucket", 25600, 80.0, 1), ("compaction", 15154, 47.35625, 2), ("bucket", 15461, 48.315625000000004, 2),
        ("compaction", 15450, 48.28125, 3), ("bucket", 36000, 112.5, 3),
    ]),
    "opencode/wrapped/opencode-1.18.33.rec": ("1.18.33", [
        ("bucket", 20100, 15.703125, 0), ("bucket", 30200, 23.59375, 0), ("compaction", 30200, 23.59375, 1),
        ("bucket", 125500, 98.046875, 1), ("compaction", 125500, 98.046875, 2), ("bucket", 1320, 1.03125, 2),
    ]),
    "pi/wrapped/pi-1.6.0.rec": ("1.6.0", [
        ("bucket", 0, 0.0, 0), ("bucket", 1320, 4.125, 0), ("bucket", 1621, 5.065625, 0), ("bucket", 9920, 31.0, 0),
        ("bucket", 16480, 51.5, 0), ("compaction", None, None, 1), ("bucket", 26400, 82.5, 1),
        ("compaction", None, None, 2), ("bucket", 36400, 113.75, 2), ("compaction", None, None, 3),
    ]),
}  # fmt: skip


def test_every_harness_keeps_a_recording_of_a_real_wrapped_session() -> None:
    kept = {path.relative_to(RECORDINGS).as_posix() for path in RECORDINGS.glob("*/wrapped/*.rec")}
    assert kept == set(WRAPPED)
    assert {read_header(RECORDINGS / name)["harness"] for name in kept} == {"claude", "codex", "omp", "opencode", "pi"}


@pytest.mark.parametrize("name", sorted(WRAPPED))
def test_a_wrapped_recording_replays_to_the_numbers_its_session_published(name: str) -> None:
    path: Path = RECORDINGS / name
    version, published = WRAPPED[name]
    header = read_header(path)
    config = header["config"]  # made by `hctx wrap --record`, not converted: the sidecar's whole configuration
    assert "converted_from" not in header and config["harness"] == header["harness"]
    said = {json.loads(line).get("write") for line in path.read_bytes().splitlines()[1:]}
    assert {"taken", "landed"} <= said  # the live writer's schedule, recorded
    writes, summary = replay_recording(spec_for(header["harness"]), path)
    assert summary.sidecars >= 1 and not summary.problems and not summary.lost_chunks and not summary.truncated
    numbers = [(w.reason, w.record.used_tokens, w.record.used_percent, w.record.compactions)
               for w in writes if w.reason != "heartbeat"]  # fmt: skip
    assert numbers == published
    assert {(w.record.agent, w.record.incarnation, w.record.harness_version) for w in writes} == {
        (config["agent"], config["incarnation"], version)
    }
