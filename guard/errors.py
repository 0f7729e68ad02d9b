"""Every exception hctx raises on purpose, under one root, in one place (as httpx does).

    HctxError
    ├── JsonRefused          bytes the one JSON rule (guard.json_rule) refuses (ValueError)
    ├── RecordRefused        a record or claim file is not one this reader accepts (ValueError)
    ├── ClaimHeld            another live wrapper holds the agent's claim
    ├── CatalogError         the catalog cannot be opened or walked (OSError)
    ├── FrameRejected        a producer will not interpret a frame (ValueError)
    │   └── MalformedFrame   the bytes are not a frame at all: bad UTF-8, bad JSON, wrong shape
    ├── ChannelPathError     the channel's socket path is unusable (ValueError)
    ├── ConfigError          a transport's address or config is unusable (ValueError)
    ├── HttpError            an HTTP request (httpx, OpenCode's transport) did not deliver (OSError)
    ├── SettingsError        a harness's settings file cannot be merged (ValueError)
    ├── AgentNotFound        no agent answers to the name asked for (LookupError)
    ├── UnknownHarness       no registered harness has the name (LookupError)
    ├── ModelTableError      `hctx scan`'s model table is unreadable (ValueError)
    ├── TranscriptError      a transcript `hctx scan` reads cannot be opened (OSError)
    ├── RecordingError       a recording `hctx replay` reads is no file of bytes, or not one hctx made (OSError)
    ├── UsageError           what the command line asks cannot be done (ValueError)
    └── FleetFailed          a demo agent failed to start or cannot be played

Each also derives from the builtin a caller would catch without knowing hctx, so `except ValueError`
around a parse keeps working. The message is always the sentence a user is shown.
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

__all__ = [
    "AgentNotFound",
    "CatalogError",
    "ChannelPathError",
    "ClaimHeld",
    "ConfigError",
    "FleetFailed",
    "FrameRejected",
    "HctxError",
    "HttpError",
    "JsonRefused",
    "MalformedFrame",
    "ModelTableError",
    "RecordRefused",
    "RecordingError",
    "SettingsError",
    "TranscriptError",
    "UnknownHarness",
    "UsageError",
]


class HctxError(Exception):
    """The root: anything hctx raises deliberately."""


class JsonRefused(HctxError, ValueError):
    """Bytes the one JSON rule refuses (`guard.json_rule.loads`' default `error`)."""


class RecordRefused(HctxError, ValueError):
    """The bytes are not a record this reader may interpret; the message says why."""


class _ClaimHolder(Protocol):
    """What the message names of the claim that holds an agent (`guard.state.HarnessState`, which
    this module does not import: the errors are below everything that raises them)."""

    @property
    def host(self) -> str: ...
    @property
    def agent(self) -> str: ...
    @property
    def wrapper_pid(self) -> int: ...


_Holder = TypeVar("_Holder", bound=_ClaimHolder)


class ClaimHeld(HctxError, Generic[_Holder]):
    """Another wrapper holds the agent; `holder` is its claim (None while it has not written one yet)."""

    def __init__(self, holder: _Holder | None) -> None:
        who = "another wrapper" if holder is None else f"wrapper pid {holder.wrapper_pid}"
        super().__init__(f"the agent is held by {who}")
        self.holder = holder


class CatalogError(HctxError, OSError):
    pass


class FrameRejected(HctxError, ValueError):
    """The message is the log line's reason."""


class MalformedFrame(FrameRejected):
    pass


class ChannelPathError(HctxError, ValueError):
    pass


class ConfigError(HctxError, ValueError):
    pass


class HttpError(HctxError, OSError):
    """The message is the sentence to log."""


class SettingsError(HctxError, ValueError):
    pass


class AgentNotFound(HctxError, LookupError):
    pass


class UnknownHarness(HctxError, LookupError):
    pass


class ModelTableError(HctxError, ValueError):
    pass


class TranscriptError(HctxError, OSError):
    pass


class RecordingError(HctxError, OSError):
    pass


class UsageError(HctxError, ValueError):
    pass


class FleetFailed(HctxError):
    pass
