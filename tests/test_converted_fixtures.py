"""The fixtures the product replays are recordings converted once from the lab's captures
(scripts/convert_fixtures.py, issue 30): each is held here to its captures, byte for byte, and to
the writes the product's old converter and old replay driver made of them, write for write.

Before: `spec.read_recording(captures)` through the old driver (`legacy_replay`, the decoders and
pipeline called directly). After: the recording through `hctx replay`'s driver, the live `Stream` →
`Writer` → guard path on MockClock. A conversion that lost, added or moved a byte, or a capture
edited without converting it again, fails the first row; one that changed a time or an order, the
last.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from guard.policy import Write
from scripts.convert_fixtures import (
    Conversion,
    capture_chunks,
    conversions,
    legacy_replay,
    recording,
    same_recording,
)
from sidecar.harnesses.claude.frames import unwrap
from sidecar.registry import spec_for
from sidecar.replay import read_chunks, read_header, replay_recording
from tests.conformance import RECORDINGS, converted_recordings
from tests.conftest import FIXTURE_ROOT

CONVERSIONS = conversions()
CASES = [pytest.param(conversion, id=conversion.target) for conversion in CONVERSIONS]


def _by_wire(chunks: list[tuple[str, bytes]]) -> dict[str, bytes]:
    joined: dict[str, bytes] = {}
    for wire, data in chunks:
        joined[wire] = joined.get(wire, b"") + data
    return joined


def test_every_recording_under_fixtures_is_converted_by_the_script_and_names_its_captures() -> None:
    on_disk = {path.relative_to(RECORDINGS).as_posix() for path in converted_recordings()}
    assert on_disk == {conversion.target for conversion in CONVERSIONS}
    assert len(CONVERSIONS) >= 100  # every capture the tests replayed, and the sessions they replayed whole
    for conversion in CONVERSIONS:
        header = read_header(conversion.path)
        assert (header["harness"], header["converted_from"]) == (conversion.harness, list(conversion.sources))
        assert all(path.is_file() for path in conversion.source_paths), conversion.sources  # the captures stay


@pytest.mark.parametrize("conversion", CASES)
def test_a_recording_is_its_captures_converted_byte_for_byte(conversion: Conversion) -> None:
    made, _ = recording(conversion)
    assert same_recording(conversion.path.read_bytes(), made), f"stale: run scripts/convert_fixtures.py ({conversion})"
    recorded = _by_wire([(chunk.wire, chunk.data) for chunk in read_chunks(conversion.path.read_bytes())])
    assert recorded == _by_wire([(chunk.wire, chunk.data) for chunk in capture_chunks(conversion)])


@pytest.mark.parametrize("conversion", CASES)
def test_a_recording_replays_to_the_writes_its_captures_made_before(conversion: Conversion) -> None:
    spec = spec_for(conversion.harness)
    before = [_full(write) for write in legacy_replay(spec, capture_chunks(conversion))]
    writes, summary = replay_recording(spec, conversion.path)
    after = [_full(write) for write in writes]
    assert after == before  # every field, the clock's included
    assert not summary.problems and summary.sidecars == 1


def _full(write: Write) -> tuple[str, dict[str, object]]:
    return write.reason, json.loads(write.record.to_json())


def _lines(path: Path) -> list[bytes]:
    return [line + b"\n" for line in path.read_bytes().split(b"\n") if line.strip()]


@pytest.mark.parametrize("conversion", [c for c in CONVERSIONS if c.harness == "codex"], ids=lambda c: c.target)
def test_a_codex_recording_holds_the_app_servers_own_lines(conversion: Conversion) -> None:
    """Codex's stdout lines as the app-server wrote them (the lab's plain capture), not re-serialised:
    a `.timed` capture (the lab's own JSON around each frame) converts to the very bytes of its
    plain sibling, and a rollout to its file's lines."""
    (source,) = conversion.source_paths
    verbatim = source.with_name(source.name.replace(".timed.jsonl", ".jsonl"))
    wires = _by_wire([(chunk.wire, chunk.data) for chunk in read_chunks(conversion.path.read_bytes())])
    assert set(wires) in ({"stdout"}, {"rollout"})
    assert wires.popitem()[1] == b"".join(_lines(verbatim))


@pytest.mark.parametrize("conversion", [c for c in CONVERSIONS if c.harness == "claude"], ids=lambda c: c.target)
def test_a_claude_recording_carries_each_captured_payload_verbatim_in_the_tees_line(conversion: Conversion) -> None:
    payloads = sorted(line.rstrip(b"\n") for path in conversion.source_paths for line in _lines(path))
    sent = [unwrap(chunk.data) for chunk in read_chunks(conversion.path.read_bytes())]
    assert all(tee is not None for tee in sent)
    assert sorted(tee[1].rstrip(b"\n") for tee in sent if tee is not None) == payloads


@pytest.mark.parametrize(
    "conversion", [c for c in CONVERSIONS if ".channel." in c.target or "opencode" in c.harness], ids=lambda c: c.target
)
def test_a_channel_or_an_answer_recording_holds_its_files_bytes(conversion: Conversion) -> None:
    """pi's and omp's channel frames as received; OpenCode's `/config` and `/config/providers`
    answers as the server sent them, and each `/event` frame's own text (the lab's `raw`)."""
    wires = _by_wire([(chunk.wire, chunk.data) for chunk in read_chunks(conversion.path.read_bytes())])
    if conversion.harness != "opencode":
        (source,) = conversion.source_paths
        assert wires == {"channel": source.read_bytes()}
        return
    for path in conversion.source_paths:
        if path.name.endswith("providers.json"):
            assert wires["providers"] == path.read_bytes()
        elif path.name == "config.json":
            assert wires["config"] == path.read_bytes()
        elif path.suffix == ".sse":
            assert wires["sse"] in (path.read_bytes(), path.read_bytes() + b"\n\n")
        else:
            raws = [json.loads(line) for line in path.read_bytes().splitlines()]
            expected = b"".join(b"data: " + raw["raw"].encode() + b"\n\n" for raw in raws if raw["stream"] == "event")
            assert wires["sse"] == expected


def test_a_lost_byte_is_caught() -> None:
    """The byte-for-byte row is not vacuous: a recording missing one byte of one chunk is stale."""
    conversion = next(c for c in CONVERSIONS if c.target == "claude/session-2.1.332.rec")
    made, _ = recording(conversion)
    lines = made.split(b"\n")
    entry = json.loads(lines[3])
    entry["b64"] = base64.b64encode(base64.b64decode(entry["b64"])[:-1]).decode()
    lines[3] = json.dumps(entry, separators=(",", ":")).encode()
    assert not same_recording(b"\n".join(lines), made)
    assert FIXTURE_ROOT in conversion.path.parents
