"""Convert the captures under fixtures/ into recordings, the one shape `hctx replay` reads (issue 30).

The captures are the lab's verbatim files of the real harnesses: Claude's status-line and hook
payloads (what Claude wrote to the tee's stdin, `.times` beside them), Codex's app-server stdout
lines and rollout files, pi's and omp's extension frames and probe captures, OpenCode's
`/config/providers` and `/config` answers and its `/event` stream. Each had a converter in the
product (`read_recording`) that sniffed its shape and made the bytes the wire would have carried;
they live here now (scripts/capture_readers/), run once, and the product replays only what they
made: `fixtures/recordings/**.rec`, each a recording as `hctx wrap --record` writes it
(docs/recording.md), with the captures it came from named in its header.

The bytes are the converters' own, unchanged: each wire is one stream, in the converter's order;
a chunk's time is the one the old replay gave its event (its capture's own time, never earlier than
the one before; an untimed event one second after the last; a drop no time at all), and each stream
ends where the old replay ended its decoder. So a recording replays to the writes the capture did:
`tests/test_converted_fixtures.py` holds every recording to it, byte for byte and write for write.

    python scripts/convert_fixtures.py           # (re)write every recording
    python scripts/convert_fixtures.py --check   # exit 1 if one is missing or differs from its captures
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))

import guard  # noqa: E402
from guard.policy import Write, WriteGuard  # noqa: E402
from scripts.capture_readers import claude, codex, opencode, pi  # noqa: E402
from sidecar.decoding import Decoder, Dropped, MessageDecoder  # noqa: E402
from sidecar.pipeline import Pipeline  # noqa: E402
from sidecar.recorder import FORMAT, Chunk, encode_line  # noqa: E402
from sidecar.registry import HarnessSpec, spec_for  # noqa: E402
from sidecar.replay import read_chunks  # noqa: E402

FIXTURES = REPO / "fixtures"
RECORDINGS = FIXTURES / "recordings"
# What the old replay's clock gave an event its capture did not time.
UNTIMED_STEP_MS = 1000

READERS: dict[str, Callable[[Sequence[Path]], Iterable[Chunk]]] = {
    "claude": claude.read_recording,
    "codex": codex.read_recording,
    "pi": pi.read_recording,
    "omp": pi.read_recording,
    "opencode": opencode.read_recording,
}


@dataclass(frozen=True)
class Conversion:
    """One recording: `harness`'s captures `sources` (paths under fixtures/), in that order."""

    harness: str
    target: str  # its path under fixtures/recordings/
    sources: tuple[str, ...]

    @property
    def path(self) -> Path:
        return RECORDINGS / self.target

    @property
    def source_paths(self) -> list[Path]:
        return [FIXTURES / source for source in self.sources]


def _names(pattern: str) -> list[str]:
    return sorted(path.relative_to(FIXTURES).as_posix() for path in FIXTURES.glob(pattern))


def _stem(name: str) -> str:
    """A capture's name without its `.jsonl`/`.sse`/`.json` ending (`.timed` kept: its own recording)."""
    for suffix in (".jsonl", ".sse", ".json"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


CLAUDE_KINDS = ("statusline", "precompact", "postcompact", "sessionstart")


def conversions() -> list[Conversion]:
    """Every recording made from the captures: each capture alone, and the sessions tests replay whole."""
    table: list[Conversion] = []
    for name in _names("claude/*.jsonl") + _names("claude/delegation/*/subagent-hooks.jsonl"):
        table.append(Conversion("claude", f"{_stem(name)}.rec", (name,)))
    for version in ("2.1.250", "2.1.332"):
        for tag in ("", "-sonnet45", "-sonnet45-oauth"):
            sources = tuple(f"claude/{kind}-{version}{tag}.jsonl" for kind in CLAUDE_KINDS)
            table.append(Conversion("claude", f"claude/session-{version}{tag}.rec", sources))
    for name in _names("accounts/statusline-*.jsonl"):
        table.append(Conversion("claude", f"{_stem(name)}.rec", (name,)))
    for name in _names("codex/*.jsonl") + _names("transcripts/codex-*/*.jsonl") + _names("accounts/codex-*.jsonl"):
        table.append(Conversion("codex", f"{_stem(name)}.rec", (name,)))
    for name in _names("pi/*/capture.jsonl"):
        run = name.split("/")[1]
        table.append(Conversion(run.split("-")[0], f"pi/{run}.rec", (name,)))
    for name in _names("pi/live/**/*.channel.jsonl"):
        harness = Path(name).name.split("-")[0]
        table.append(Conversion(harness, f"{_stem(name)}.rec", (name,)))
    for root in _names("opencode/v*"):
        events, providers, config = f"{root}/events.jsonl", f"{root}/config_providers.json", f"{root}/config.json"
        table.append(Conversion("opencode", f"{root}/events.rec", (events,)))
        table.append(Conversion("opencode", f"{root}/providers+events.rec", (providers, events)))
        table.append(Conversion("opencode", f"{root}/session.rec", (config, providers, events)))
    for name in _names("opencode/delegation/*.events.sse"):
        base = name.removesuffix(".events.sse")
        table.append(Conversion("opencode", f"{base}.rec", (f"{base}.providers.json", name)))
    return table


def capture_chunks(conversion: Conversion) -> list[Chunk]:
    """What the product's old `read_recording` made of the captures: the bytes, in order."""
    return list(READERS[conversion.harness](conversion.source_paths))


def timed(spec: HarnessSpec, chunks: Sequence[Chunk]) -> tuple[list[Chunk], int, int]:
    """Each chunk at the time the old replay gave its events (one stream a wire), when the streams'
    ends came, and how many untimed chunks complete more than one event (they share one time, where
    the old replay stepped each a second). An untimed chunk of a wire its decoder frames by lines
    (the SSE text of a whole stream, say) goes line by line, so each event keeps its own second."""
    decoders: dict[str, Decoder] = {}
    streams: dict[str, int] = {}
    clock = shared = 0
    out: list[Chunk] = []
    for chunk in chunks:
        decoder = decoders.get(chunk.wire)
        if decoder is None:
            decoder = decoders[chunk.wire] = spec.decoder(chunk.wire)
            streams[chunk.wire] = len(streams) + 1
        whole = chunk.at_ms is not None or isinstance(decoder, MessageDecoder)
        for piece in [chunk.data] if whole else re.split(b"(?<=\n)(?!$)", chunk.data):
            events = decoder.receive_data(piece)
            for event in events:
                clock = _arrival(clock, chunk.at_ms, event)
            shared += chunk.at_ms is None and sum(not isinstance(event, Dropped) for event in events) > 1
            out.append(Chunk(clock, chunk.wire, piece, streams[chunk.wire]))
    for decoder in decoders.values():
        for event in decoder.end_of_data():
            clock = _arrival(clock, None, event)
    return out, clock, shared


def _arrival(clock: int, at_ms: int | None, event: object) -> int:
    """The old replay's clock: a capture's time, never before an earlier one; untimed, a step after
    the last event (a drop takes no time)."""
    if at_ms is not None:
        return max(clock, at_ms)
    return clock if isinstance(event, Dropped) else clock + UNTIMED_STEP_MS


def recording(conversion: Conversion) -> tuple[bytes, int]:
    """The recording of `conversion`'s captures, as `hctx wrap --record` writes one, and how many of
    its chunks share a time the old replay stepped (`timed`)."""
    spec = spec_for(conversion.harness)
    chunks, ended_ms, shared = timed(spec, capture_chunks(conversion))
    header: dict[str, Any] = {
        "format": FORMAT,
        "harness": conversion.harness,
        "hctx": guard.__version__,
        "incarnation": "replay",
        "started_ms": chunks[0].at_ms if chunks else 0,
        "converted_from": list(conversion.sources),
    }
    lines = [encode_line(header)]
    lines += [encode_line((chunk.at_ms or 0, chunk.wire, chunk.stream or 1, chunk.data)) for chunk in chunks]
    ends = {chunk.wire: chunk.stream for chunk in chunks}
    lines += [encode_line({"at_ms": ended_ms, "wire": wire, "stream": stream, "end": True})
              for wire, stream in ends.items()]  # fmt: skip
    return b"".join(lines), shared


def same_recording(one: bytes, other: bytes) -> bool:
    """The same recording, whichever hctx version converted it (the header's `hctx`)."""
    (head, _, body), (other_head, _, other_body) = one.partition(b"\n"), other.partition(b"\n")
    return body == other_body and _unversioned(head) == _unversioned(other_head)


def _unversioned(head: bytes) -> dict[str, Any]:
    header: dict[str, Any] = json.loads(head)
    header.pop("hctx", None)
    return header


def legacy_replay(spec: HarnessSpec, chunks: Iterable[Chunk]) -> Iterator[Write]:
    """The product's old replay driver (its decoders and pipeline called directly, no writer): kept
    only to prove each recording replays, through the live driver, to the writes it gave."""
    pipeline = Pipeline(spec.make_producer(), WriteGuard("replay", incarnation="replay"))
    decoders: dict[str, Decoder] = {}
    clock = 0
    for chunk in chunks:
        decoder = decoders.get(chunk.wire)
        if decoder is None:
            decoder = decoders[chunk.wire] = spec.decoder(chunk.wire)
        for event in decoder.receive_data(chunk.data):
            clock = _arrival(clock, chunk.at_ms, event)
            yield from pipeline.feed(event, clock)
    for decoder in decoders.values():
        for event in decoder.end_of_data():
            clock = _arrival(clock, None, event)
            yield from pipeline.feed(event, clock)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a recording is stale")
    args = parser.parse_args(argv)
    stale = 0
    print(f"{'RECORDING':<62} {'CAPTURES':>8} {'CHUNKS':>6} {'BYTES':>9} {'SHARED':>6}  STATE")
    for conversion in conversions():
        data, shared = recording(conversion)
        chunks = read_chunks(data)
        current = conversion.path.read_bytes() if conversion.path.is_file() else None
        state = "missing" if current is None else ("same" if same_recording(current, data) else "differs")
        if state != "same":
            stale += 1
            if not args.check:
                conversion.path.parent.mkdir(parents=True, exist_ok=True)
                conversion.path.write_bytes(data)
                state = "written"
        row = f"{conversion.target:<62} {len(conversion.sources):>8} {len(chunks):>6} {len(data):>9} {shared:>6}"
        print(f"{row}  {state}")
    if args.check and stale:
        print(f"{stale} recording(s) stale: run scripts/convert_fixtures.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
