"""Extension asset runtime smoke: the shipped TypeScript, run by the real loaders, read back off a socket.

pi loads extensions with jiti on node 22, omp with bun's own TypeScript loader. Each run loads
`sidecar/harnesses/pi/hctx-channel.ts` exactly as shipped, drives every handler it registers with one of
three contexts (bare, populated with the lab's shapes, every getter throwing), and the frames it wrote
to $HCTX_CHANNEL are read back from a recording socket and asserted: the envelope and its five reading
keys, each harness's own numerator, the unclamped percent, pi's withheld reading riding the edge, and
the countless edge when the session store cannot be read. The populated frames then go through the
real producer, so the two halves of the wire (TypeScript and Python) are checked against each other.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from guard.policy import WriteGuard
from sidecar.decoding import CHANNEL
from sidecar.pipeline import Pipeline
from sidecar.registry import spec_for
from tests.conftest import REPO
from tests.fakes.pi_channel import channel_lines, recording_channel
from tests.harnesses import harness_prefix, require_harness

ASSET = REPO / "sidecar" / "harnesses" / "pi" / "hctx-channel.ts"
DRIVER = REPO / "tests" / "fakes" / "pi_extension_driver.mjs"
READING_KEYS = {"tokens", "contextWindow", "percent", "model", "costUsd"}
RUN_TIMEOUT_S = 30

# (loader, the harness build whose runtime/loader is used)
LOADERS = [("jiti", "pi", "0.84.2"), ("jiti", "pi", "1.6.0"), ("bun", "omp", "18.1.16")]


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """Unix socket paths are limited to ~107 bytes; pytest's tmp_path can exceed that."""
    path = Path(tempfile.mkdtemp(prefix="hctx-pi-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _loader_command(loader: str, harness: str, version: str) -> list[str]:
    runtime = require_harness(harness, version)[0]
    if loader == "jiti":
        jiti = harness_prefix(harness, version) / "node_modules" / "jiti" / "lib" / "jiti.mjs"
        if not jiti.is_file():
            pytest.fail(f"pi {version} no longer ships jiti at {jiti}; its extension loader moved")
        return [runtime, os.fspath(DRIVER), "{asset}", "{context}", "{script}", os.fspath(jiti)]
    return [runtime, os.fspath(DRIVER), "{asset}", "{context}", "{script}"]


async def _drive(
    command: list[str], asset: Path, context: str, script: str, socket_dir: Path
) -> tuple[dict[str, Any], list[dict[str, Any]], bytes]:
    """Run the driver; (its summary, the frames read back, those frames as a timed recording)."""
    channel = socket_dir / "channel.sock"
    argv = [part.format(asset=asset, context=context, script=script) for part in command]
    env = {**os.environ, "HCTX_CHANNEL": os.fspath(channel)}
    async with recording_channel(channel) as recording:
        with trio.fail_after(RUN_TIMEOUT_S):
            result = await trio.run_process(argv, env=env, capture_stdout=True, capture_stderr=True)
        await trio.sleep(0.05)
    summary = json.loads(result.stdout.decode().strip().splitlines()[-1])
    assert "fatal" not in summary, summary.get("fatal")
    return summary, [frame for _, frame in recording.frames], recording.jsonl()


def assert_context_wire(frame: dict[str, Any]) -> dict[str, Any] | None:
    """The envelope the producer decodes: fail on any flattening or renaming of it."""
    assert frame["type"] == "context"
    assert set(frame) >= {"type", "reading", "compaction"}
    reading = frame["reading"]
    if reading is not None:
        assert set(reading) == READING_KEYS, sorted(reading)
    if frame["compaction"] is not None:
        assert set(frame["compaction"]) == {"reason", "count"}
    return reading


def _by_event(frames: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    return [frame for frame in frames if frame.get("event") == event]


@pytest.mark.parametrize(("loader", "harness", "version"), LOADERS)
@pytest.mark.parametrize("context", ["bare", "throwing"])
async def test_without_telemetry_only_the_edge_arrives_countless(
    loader: str, harness: str, version: str, context: str, short_dir: Path
) -> None:
    summary, frames, _ = await _drive(_loader_command(loader, harness, version), ASSET, context, harness, short_dir)
    assert summary["threw"] == []
    assert {"session_start", "message_end", "turn_end", "agent_end", "session_compact"} <= set(summary["registered"])
    # No usage object means nothing to publish, except the compaction itself, which must not be lost.
    assert len(frames) == 1, frames
    (edge,) = frames
    assert assert_context_wire(edge) is None
    assert edge["event"] == "session_compact"
    # pi names the reason on the event; omp on the auto_compaction_start before it.
    reason = "manual" if harness == "pi" else "threshold"
    assert edge["compaction"] == {"reason": reason, "count": None}
    assert edge["compactions"] is None


@pytest.mark.parametrize(("loader", "version"), [("jiti", "0.84.2"), ("jiti", "1.6.0")])
async def test_pi_populated_context_sends_total_tokens_and_withholds_at_the_edge(
    loader: str, version: str, short_dir: Path
) -> None:
    summary, frames, recorded = await _drive(
        _loader_command(loader, "pi", version), ASSET, "populated", "pi", short_dir
    )
    assert summary["threw"] == []
    readings = [assert_context_wire(frame) for frame in frames]
    assert all(reading is not None for reading in readings)
    # the scripted events in order, then the handlers pi never fires (omp's session_stop), driven last
    assert [frame["event"] for frame in frames] == [
        "session_start", "message_end", "message_end", "turn_end", "agent_end", "agent_settled",
        "session_compact", "message_end", "turn_end", "agent_end", "session_start", "session_stop",
    ]  # fmt: skip
    (turn, overrun) = _by_event(frames, "turn_end")
    # pi's numerator is the totalTokens (input + output + cacheRead), not the prompt's 16000.
    assert turn["reading"] == {
        "tokens": 16480, "contextWindow": 32000, "percent": 51.5, "model": "fake-32k", "costUsd": 13.36,
    }  # fmt: skip
    assert turn["reading"]["tokens"] != 16000
    assert overrun["reading"]["percent"] == 105  # unclamped
    (edge,) = _by_event(frames, "session_compact")
    assert edge["reading"] == {
        "tokens": None, "contextWindow": 32000, "percent": None, "model": "fake-32k", "costUsd": 13.36,
    }  # fmt: skip
    assert edge["compaction"] == {"reason": "manual", "count": 1}
    # The cost is held and restated on frames whose event carries no message.
    assert _by_event(frames, "agent_settled")[0]["reading"]["costUsd"] == 13.36
    assert frames[0]["reading"]["costUsd"] is None
    # A replaced session restates its own cost (none yet), never its predecessor's; its count is its own.
    replaced = _by_event(frames, "session_start")[-1]
    assert (replaced["reading"]["costUsd"], replaced["compactions"]) == (None, 0)

    writes = _through_the_producer("pi", recorded)
    (compaction,) = [write for write in writes if write.reason == "compaction"]
    assert compaction.record.used_tokens is None and compaction.record.used_percent is None
    assert compaction.record.window_tokens == 32000
    assert (compaction.record.compactions, compaction.record.last_compaction_trigger) == (1, "manual")
    assert (33600, 105) in [(w.record.used_tokens, w.record.used_percent) for w in writes]
    # the replaced session's store holds no compaction: no count, no trigger carried over from the old one
    assert (writes[-1].record.compactions, writes[-1].record.last_compaction_trigger) == (0, None)


async def test_omp_populated_context_sends_prompt_tokens_and_the_start_events_reason(short_dir: Path) -> None:
    summary, frames, recorded = await _drive(
        _loader_command("bun", "omp", "18.1.16"), ASSET, "populated", "omp", short_dir
    )
    assert summary["threw"] == []
    for frame in frames:
        assert assert_context_wire(frame) is not None
    settled, overrun = (frame["reading"] for frame in _by_event(frames, "session_stop"))
    # omp's numerator is the prompt alone (12000 input + 4000 cacheRead), not the totalTokens 16480.
    assert settled == {
        "tokens": 16000, "contextWindow": 32000, "percent": 50, "model": "fake-32k", "costUsd": 13.36,
    }  # fmt: skip
    assert settled["tokens"] != 16480
    assert overrun["percent"] == 112.5  # unclamped
    assert overrun["costUsd"] == 36
    replaced = _by_event(frames, "session_start")[-1]
    assert (replaced["reading"]["costUsd"], replaced["compactions"]) == (None, 0)
    (edge,) = _by_event(frames, "session_compact")
    # omp never nulls, and its reason comes from the preceding auto_compaction_start.
    assert edge["reading"]["tokens"] == 15013
    assert edge["compaction"] == {"reason": "threshold", "count": 1}

    writes = _through_the_producer("omp", recorded)
    (compaction,) = [write for write in writes if write.reason == "compaction"]
    assert compaction.record.used_tokens == 15013
    assert compaction.record.last_compaction_trigger == "threshold"
    assert (36000, 112.5) in [(w.record.used_tokens, w.record.used_percent) for w in writes]
    assert (writes[-1].record.compactions, writes[-1].record.last_compaction_ms) == (0, None)


async def test_pi_shape_under_bun_and_omp_shape_under_jiti_load_alike(short_dir: Path) -> None:
    """The one asset serves both loaders: each context shape runs under the other harness's loader too."""
    _, pi_under_bun, _ = await _drive(_loader_command("bun", "omp", "18.2.3"), ASSET, "populated", "pi", short_dir)
    assert _by_event(pi_under_bun, "turn_end")[0]["reading"]["tokens"] == 16480
    _, omp_under_jiti, _ = await _drive(_loader_command("jiti", "pi", "0.84.2"), ASSET, "populated", "omp", short_dir)
    assert _by_event(omp_under_jiti, "session_compact")[0]["compaction"] == {"reason": "threshold", "count": 1}


@pytest.mark.parametrize(("loader", "harness", "version"), [LOADERS[0], LOADERS[2]])
async def test_the_wire_check_fails_on_a_flattened_envelope(
    loader: str, harness: str, version: str, short_dir: Path
) -> None:
    """Non-vacuous: the same run over an asset whose reading is spread into the frame must fail."""
    flattened = short_dir / "flattened.ts"
    source = ASSET.read_text()
    assert "reading: now," in source
    flattened.write_text(source.replace("reading: now,", "...now,"))
    _, frames, recorded = await _drive(
        _loader_command(loader, harness, version), flattened, "populated", harness, short_dir
    )
    assert frames, "the flattened asset still sends frames: only their shape is wrong"
    with pytest.raises((AssertionError, KeyError)):
        for frame in frames:
            assert assert_context_wire(frame) is not None
    # And the producer refuses every one of them rather than inventing a reading.
    assert _through_the_producer(harness, recorded) == []


def _through_the_producer(harness: str, recorded: bytes) -> list[Any]:
    spec = spec_for("pi" if harness == "pi" else "omp")
    pipeline = Pipeline(spec.make_producer(), WriteGuard("smoke", "smoke"))
    decoder = spec.decoder(CHANNEL)
    writes = []
    for chunk in channel_lines(recorded):
        assert chunk.at_ms is not None
        for event in decoder.receive_data(chunk.data):
            writes.extend(pipeline.feed(event, chunk.at_ms))
    return writes


@pytest.mark.parametrize(("loader", "harness", "version"), [LOADERS[0], LOADERS[2]])
@pytest.mark.parametrize("channel", ["dead", "unset"])
async def test_a_dead_or_absent_channel_never_breaks_the_harness(
    loader: str, harness: str, version: str, channel: str, short_dir: Path
) -> None:
    """No sidecar listening (or not launched by hctx at all): every handler still returns, quietly."""
    command = _loader_command(loader, harness, version)
    argv = [part.format(asset=ASSET, context="populated", script=harness) for part in command]
    env = {key: value for key, value in os.environ.items() if key != "HCTX_CHANNEL"}
    if channel == "dead":
        env["HCTX_CHANNEL"] = os.fspath(short_dir / "nobody-listens.sock")
    with trio.fail_after(RUN_TIMEOUT_S):
        result = await trio.run_process(argv, env=env, capture_stdout=True, capture_stderr=True)
    summary = json.loads(result.stdout.decode().strip().splitlines()[-1])
    assert summary["threw"] == [] and result.stderr == b""
    # Outside `hctx wrap` the asset stays inert: it registers no handler at all.
    assert (summary["registered"] == []) == (channel == "unset")
