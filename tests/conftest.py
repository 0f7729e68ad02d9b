"""What every test shares: where the checkout and its fixtures are, and the channel's directory.

Importable as `tests.conftest` for the constants; pytest loads the fixtures itself.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from guard.errors import FrameRejected
from guard.policy import Reading
from guard.record import HarnessContext
from sidecar.app import SidecarConfig, Store, Writer, open_writer
from sidecar.decoding import CHANNEL, Dropped, LineDecoder, channel_decoder
from sidecar.producer import Producer
from sidecar.registry import HarnessSpec

REPO = Path(__file__).resolve().parent.parent
FIXTURE_ROOT = REPO / "fixtures"
LAB = REPO.parent / "shared" / "lab"


@pytest.hookimpl(optionalhook=True)  # a run without xdist (-p no:xdist) still loads this file
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under `pytest -n N` (scripts/test), a work unit is a test module, so a module-scoped fixture
    (a wheel built once, a browser, two Syncthing daemons) is still set up once; and the live tests
    are one unit, run one after another on one worker while the other workers take the rest: real
    harnesses started side by side starve each other on two cores and miss their deadlines. The
    fault campaign's rows are independent scenarios sharing no fixture, and together the longest
    module: each row is a unit of its own."""
    if config.getvalue("dist") != "load":
        return None  # a --dist the caller chose
    from xdist.scheduler import LoadScopeScheduling

    class ModulesLiveTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            if module == "tests/test_fault_suite.py":
                return nodeid
            return "tests/live" if module.startswith("tests/live/") else module

    return ModulesLiveTogether(config, log)


BROWSER_FIXTURES = frozenset({"chromium", "playwright"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that launches Chromium (it asks for a `chromium` fixture, each browser module has
    one, or for `playwright` to launch a browser of its own) is marked `browser`: scripts/test runs
    those in a pytest of their own after the rest, since Chromium crashed at launch (SIGTRAP) from an
    xdist worker that had run other modules first."""
    for item in items:
        if BROWSER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.browser)


# Where each harness's user files are looked for: `hctx doctor` adds a setup line per harness it
# finds installed (issue 36), so a test of doctor's own lines runs with none found.
HARNESS_HOME_VARIABLES = (
    "CLAUDE_CONFIG_DIR",
    "CODEX_HOME",
    "XDG_CONFIG_HOME",
    "PI_CODING_AGENT_DIR",
    "OPENCODE_CONFIG",
)


@pytest.fixture
def harnessless_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty HOME, no harness config dir set and no harness on PATH, for this process and the
    `hctx` processes it starts."""
    home = tmp_path / "harnessless-home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for variable in HARNESS_HOME_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("PATH", os.pathsep.join((os.path.dirname(sys.executable), "/usr/bin", "/bin")))
    return home


@pytest.fixture
def channel_dir(tmp_path: Path) -> Path:
    """A directory the channel accepts: owned by this user and closed to others."""
    directory = tmp_path / "ch"
    directory.mkdir(mode=0o700)
    return directory


def _as_they_are(kind: str, frame: dict[str, Any]) -> list[object]:
    return [frame]


def raw_channel_decoder() -> LineDecoder:
    """The channel's real decoder (framing, envelope) for a harness taking every frame as it is."""
    return channel_decoder(_as_they_are)


class Received(list[dict[str, Any]]):
    """Frames a channel or a transport submitted, its drops apart, and a wait for a count."""

    def __init__(self) -> None:
        super().__init__()
        self.dropped: list[Dropped] = []
        self.changed = trio.Event()

    def submit(self, event: object) -> None:
        if isinstance(event, Dropped):
            self.dropped.append(event)
        else:
            assert isinstance(event, dict)
            self.append(event)
        self.changed.set()
        self.changed = trio.Event()

    async def settle(self, count: int, timeout_s: float = 10) -> None:
        with trio.fail_after(timeout_s):
            while len(self) < count:
                await self.changed.wait()


class FailingStore:
    """The writer's own store, failing with `error` while `broken` is set, or (`failures` given) for
    its first `failures` attempts: healing itself, it fails exactly that many whatever the timing of
    the test's loop beside the writer's retry timer; every attempt kept."""

    def __init__(self, store: Store, error: OSError, failures: int | None = None) -> None:
        self.store = store
        self.error = error
        self.broken = True
        self.failures = failures
        self.attempts: list[HarnessContext] = []

    async def write(self, record: HarnessContext) -> HarnessContext:
        self.attempts.append(record)
        if self.failures is not None and len(self.attempts) > self.failures:
            self.broken = False
        if self.broken:
            raise self.error
        return await self.store.write(record)


def failing_writer(config: SidecarConfig, error: OSError, failures: int | None = None) -> tuple[Writer, FailingStore]:
    """The sidecar's own writer for `config`, its store failing until told otherwise (`failures`:
    for that many attempts)."""
    _, writer = open_writer(config)
    writer.store = store = FailingStore(writer.store, error, failures)
    return writer, store


def submit_channel_bytes(writer: Writer, data: bytes, harness: str) -> None:
    """`data` as the channel carries it, through the harness's channel decoder, into `writer`."""
    from sidecar.registry import spec_for

    decoder = spec_for(harness).decoder(CHANNEL)
    for event in decoder.receive_data(data) + decoder.end_of_data():
        writer.submit(event)


def channel_readings(spec: HarnessSpec, producer: Producer, data: bytes, now_ms: int) -> list[Reading]:
    """Channel bytes through `spec`'s channel decoder into `producer`; FrameRejected for a drop."""
    decoder = spec.decoder(CHANNEL)
    readings: list[Reading] = []
    for event in decoder.receive_data(data) + decoder.end_of_data():
        if isinstance(event, Dropped):
            raise FrameRejected(event.reason)
        readings += producer.feed(event, now_ms)
    return readings


async def read_head(stream: trio.SocketStream) -> bytes:
    """An HTTP request's head as the client sent it (all of it, up to its blank line, or what came
    before the client closed)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(65536)
        if not chunk:
            break
        data += chunk
    return data
