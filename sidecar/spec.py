"""What a harness is to hctx: its `HarnessSpec`, the contract between a harness package and the rest.

A spec is everything the sidecar, `hctx replay`, `hctx scan` and the wrapper need to know about one
harness: its producer, one decoder per wire it is read from, the transport that moves those bytes
(if the unix-socket channel is not the only one) and the model of its config, how the wrapper taps
its stdout, its launch plan, how its own transcripts read, its model-window table, whether its
percent can run past 100, and the builds its arithmetic was verified against. It names modules only
inside its own package.

This module sits below the harness packages (`sidecar.harnesses.<name>`), which define their specs
with it, and below `sidecar.registry`, which finds them by name: it imports no harness.
"""

from __future__ import annotations

import errno
import importlib
from collections.abc import Awaitable, Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal, Protocol

from guard.errors import NotFound, Unavailable, Unusable
from guard.files import read_bounded
from sidecar.decoding import CHANNEL, ChannelFrames, Decoder, channel_decoder
from sidecar.producer import Producer

if TYPE_CHECKING:
    from pydantic import BaseModel

    from guard.record import ContextFields
    from sidecar.transcripts import ReadAt

__all__ = [
    "MAX_RECORDING_BYTES",
    "ChannelPathError",
    "ConfigError",
    "HarnessSpec",
    "ModelWindows",
    "NotAdoptable",
    "RecordingError",
    "Stream",
    "Streams",
    "Submit",
    "TranscriptFile",
    "TranscriptReader",
    "TranscriptReading",
    "Transport",
    "UnknownHarness",
    "Wants",
    "WindowSource",
    "recording_bytes",
]


class UnknownHarness(NotFound):
    """No registered harness has the name (or the wire asked for)."""


class RecordingError(Unavailable):
    """A recording is no file of bytes, or not one hctx made."""


class ConfigError(Unusable):
    """A transport's address or config is unusable."""


class NotAdoptable(Unusable):
    """The harness has no way to be adopted (its launch plan defines no `adopted`), or this process
    cannot be (issue 36: `hctx adopt`)."""


class ChannelPathError(Unusable):
    """The channel's socket path is unusable: too long, or its directory not this user's alone."""


# The transport contract. A transport (`HarnessSpec.transport`'s `run(config, streams)`) sees only
# these; the sidecar's runtime (`sidecar.streams`) implements them, with the decoding, the
# submitting and the recording behind them.
Submit = Callable[[object], None]
# What the producer lacks that a transport could pull (OpenCode's windows of models it has seen).
Wants = Callable[[], frozenset[Hashable]]


class Stream(Protocol):
    """One stream of one wire (a connection, a file): its bytes go through its own decoder, and
    each event it completes is submitted at once."""

    wire: str

    def receive_data(self, data: bytes) -> int:
        """How many events the bytes completed (each already submitted)."""
        ...

    def end_of_data(self) -> int: ...


class Streams(Protocol):
    """What a transport is handed: fresh streams of its harness's wires, the sidecar's own facts
    (settings the wrapper read) as events through `submit`, and what the producer wants pulled."""

    submit: Submit
    wants: Wants

    def open(self, wire: str, decoder: Decoder | None = None) -> Stream:
        """A stream of `wire`, through `decoder` when the transport must start it somewhere (a
        resumed file's offset), else through a fresh one of the harness's."""
        ...

    async def fed(self, timeout_s: float | None) -> None:
        """Until the producer is next fed an event (what it `wants` may have changed), or until
        `timeout_s` passed (None: no timeout)."""
        ...


# `run(config, streams)`: config is an instance of the harness's `transport_config` model (or None).
Transport = Callable[[Any, Streams], Awaitable[None]]


# Where a transcript reading's window came from: the transcript itself, or hctx's model table.
WindowSource = Literal["transcript", "model-table"]


@dataclass(frozen=True)
class TranscriptFile:
    """One transcript `hctx scan` reads: its path, the session its name gives, when it changed."""

    path: Path
    session_id: str | None
    modified_ms: int


@dataclass(frozen=True)
class TranscriptReading:
    """What a harness's transcript says of its session, as `hctx scan` shows it."""

    fields: ContextFields
    session_id: str | None
    window_source: WindowSource | None
    model: str | None
    compactions: int | None  # exact only when the whole file was read
    extra: Mapping[str, Any] = field(default_factory=dict)  # the harness's own columns
    problems: tuple[str, ...] = ()


class TranscriptReader(Protocol):
    """The module `HarnessSpec.transcripts` names: a harness's own transcripts, for `hctx scan`
    (sessions nobody wrapped)."""

    def files(self, environ: Mapping[str, str]) -> Iterable[Path]:
        """Every transcript file of the harness's home (scan filters them by age)."""
        ...

    def read(self, file: TranscriptFile, read_at: ReadAt, size: int, windows: Mapping[str, int]) -> TranscriptReading:
        """Its reading, from `read_at(offset, size)` over its `size` bytes (never more than a tail
        budget of them) and the model -> window table."""
        ...


class ModelWindows(Protocol):
    """The module `HarnessSpec.model_windows` names: a table of model id -> window tokens."""

    def model_table(self, environ: Mapping[str, str], warnings: list[str]) -> dict[str, int]:
        """The shipped table, extended by the user's file; what is wrong with that file goes in
        `warnings` (the shipped table is used)."""
        ...


@dataclass(frozen=True)
class HarnessSpec:
    name: str
    make_producer: Callable[[], Producer]
    # The harness's frames on the unix-socket channel: (envelope type, object) -> typed events.
    channel_frames: ChannelFrames
    # Every other wire -> a fresh decoder for one stream of it (a connection, a file).
    decoders: Mapping[str, Callable[[], Decoder]]
    verified_versions: tuple[str, ...]
    # The harness's own package (`sidecar.harnesses.<name>`). Every module the spec names below is
    # one of that package's, by its name inside it (`launch`, never a dotted path): a harness is one
    # folder, and its spec reaches nothing outside it (`module`).
    package: str
    # The module whose `prepare` launches the harness (`sidecar.launching`; loaded only in the
    # wrapper process), and the transport module whose `run(config, streams)` moves its native
    # stream's bytes (None: the channel is the only wire).
    launch: str = "launch"
    transport: str | None = None
    # The module whose `setup(home, environ)` is its `hctx setup` plan (`sidecar.setup_plan`; loaded
    # only in the wrapper process; absent: no user-level extension point measured). Two harnesses
    # sharing one package (pi and omp) name theirs apart.
    setup: str = "setup"
    # How its program is called, and its npm package as `npx` or `bunx` runs it (`hctx wrap`'s
    # inference of the harness from a command line).
    programs: tuple[str, ...] = ()
    # The model of the transport's config: the launch plan builds an instance of it, the sidecar
    # validates its JSON (`--transport`) with it.
    transport_config: type[BaseModel] | None = None
    # One line of the harness's stdout (without its newline) -> the channel frame the wrapper sends
    # for it, when a launch plan asks for the stdout tap (`LaunchPlan.tap_stdout`); None: no tap.
    tap_frame: Callable[[bytes], bytes] | None = None
    # The module (a `TranscriptReader`) that reads its own transcripts for `hctx scan`, loaded only
    # there; None: scan does not read this harness.
    transcripts: str | None = None
    # A recording's redaction (sidecar.redaction, issue 40): the keys whose string values its
    # decoders read (a type, a model, an id, a time, a version), recorded as they were; every other
    # string is recorded as as many `x`. None of them ever holds a prompt, a message, a tool's input
    # or output, a file's content, an instruction, an email, a token or a key.
    recorded_strings: frozenset[str] = frozenset()
    # Keys whose string value is JSON text itself (Codex's stdout line in a tap frame): redacted
    # by the same keys inside.
    recorded_json_strings: frozenset[str] = frozenset()
    # The module (a `ModelWindows`) whose `model_table(environ, warnings)` gives model id -> window
    # tokens where the harness's own records name no window (its launch plan and `hctx scan` read
    # it); None: the harness states its windows itself.
    model_windows: str | None = None
    # Whether its usedPercent can run past 100 on an overrun (`hctx watch --at` above 100 says which).
    overruns: bool = False

    def __post_init__(self) -> None:
        for module in (self.launch, self.setup, self.transport, self.transcripts, self.model_windows):
            if module is not None and not module.isidentifier():
                raise UnknownHarness(
                    f"the {self.name} harness's spec names {module!r}: a spec names only modules of its own "
                    f"package {self.package}, by their name inside it"
                )

    def module(self, name: str) -> ModuleType:
        """The module `name` of the harness's own package (one the spec names), imported."""
        return importlib.import_module(f"{self.package}.{name}")

    def wires(self) -> tuple[str, ...]:
        return (CHANNEL, *self.decoders)

    def decoder(self, wire: str) -> Decoder:
        """A fresh decoder for one stream of `wire`."""
        if wire == CHANNEL:
            return channel_decoder(self.channel_frames)
        try:
            return self.decoders[wire]()
        except KeyError:
            raise UnknownHarness(f"the {self.name} harness has no wire {wire!r}") from None


# A recording is read whole (`hctx replay`); a bigger one is refused, not swapped in.
MAX_RECORDING_BYTES = 256 * 1024 * 1024


def recording_bytes(path: Path) -> bytes:
    """A recording file's bytes. A FIFO or a device (`/dev/zero`) would never end and is refused, as is
    a file over MAX_RECORDING_BYTES: OSError says why."""
    raw = read_bounded(None, path, MAX_RECORDING_BYTES, follow=True)
    if raw.data is not None:
        return raw.data
    if raw.problem is None:
        raise FileNotFoundError(errno.ENOENT, f"{path}: no such file")
    raise RecordingError(f"{path} {raw.problem} (a recording is a file of bytes already written)")
