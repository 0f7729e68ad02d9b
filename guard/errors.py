"""Every exception hctx raises on purpose, under one root, as a tree by what a caller does with it.

The root and its five branches live here; each leaf lives in the layer that raises it (the lowest
module of that layer every raiser can import), so this module names no other layer. A caller
catches a branch when what it does is the branch's, a leaf when it must tell one case from another.

    HctxError
    ├── Refused (ValueError)     input hctx will not interpret: skip it, say why, carry on
    │   ├── JsonRefused          bytes the one JSON rule refuses                      guard.errors
    │   ├── RecordRefused        not a record or claim this reader accepts            guard.errors
    │   ├── FrameRejected        a producer will not interpret a frame                guard.errors
    │   │   └── MalformedFrame   not a frame at all: bad UTF-8, bad JSON, bad shape   guard.errors
    │   └── SetupRefused         a user file `hctx setup` will not touch              sidecar.setup_plan
    ├── Unavailable (OSError)    a file, directory or peer cannot be used now: report it, and
    │   │                        retry or go on without it
    │   ├── CatalogError         the catalog cannot be opened or walked               guard.errors
    │   ├── RecordingError       a recording is no file of bytes, or not hctx's       sidecar.spec
    │   ├── HttpError            an HTTP request did not deliver          sidecar.harnesses.opencode.transport
    │   └── TranscriptError      a transcript `hctx scan` reads is unreadable         wrapper.readers.scan
    ├── NotFound (LookupError)   nothing answers to the name asked: say which names do
    │   ├── UnknownHarness       no registered harness has the name                   sidecar.spec
    │   └── AgentNotFound        no agent answers to the name                 wrapper.readers.roster
    ├── Unusable (ValueError)    what the user set or asked cannot be done: stop (status 2) with
    │   │                        the message, change nothing
    │   ├── ConfigError          a transport's address or config                      sidecar.spec
    │   ├── ChannelPathError     the channel's socket path                            sidecar.spec
    │   ├── NotAdoptable         a harness with no way to be adopted                  sidecar.spec
    │   ├── AdoptRefused         a process `hctx adopt` will not adopt                wrapper.launch.adopt
    │   ├── SettingsError        a harness's settings file cannot be merged    sidecar.harnesses.claude.launch
    │   ├── ModelTableError      Claude's model-window table is unreadable    sidecar.harnesses.claude.windows
    │   ├── UsageError           what the command line asks                           wrapper.arguments
    │   ├── SpecError            a launcher -> resident spec                          wrapper.launch.spec
    │   └── FleetFailed          a demo agent failed to start or be played            sidecar.demo_standin
    └── Held                     another live process owns it: refuse, or take it over
        └── ClaimHeld            another live wrapper holds the agent's claim         guard.state

Each branch also derives from the builtin a caller would catch without knowing hctx, so `except
ValueError` around a parse keeps working. The message is always the sentence a user is shown. This
module imports nothing: the resident (`python -I -S`, the standard library only) raises from it.
"""

from __future__ import annotations

__all__ = [
    "CatalogError",
    "FrameRejected",
    "HctxError",
    "Held",
    "JsonRefused",
    "MalformedFrame",
    "NotFound",
    "RecordRefused",
    "Refused",
    "Unavailable",
    "Unusable",
]


class HctxError(Exception):
    """The root: anything hctx raises deliberately."""


class Refused(HctxError, ValueError):
    """Input hctx will not interpret (a frame, a record, a line): the caller skips it and says why."""


class Unavailable(HctxError, OSError):
    """A file, directory or peer cannot be used now: the caller reports it, and retries or goes on."""


class NotFound(HctxError, LookupError):
    """Nothing answers to the name asked: the caller says which names do."""


class Unusable(HctxError, ValueError):
    """What the user configured or asked cannot be done: the caller stops with the message."""


class Held(HctxError):
    """Another live process owns what was asked for: the caller refuses, or takes it over."""


class JsonRefused(Refused):
    """Bytes the one JSON rule refuses (`guard.json_rule.loads`' default `error`)."""


class RecordRefused(Refused):
    """The bytes are not a record this reader may interpret; the message says why."""


class FrameRejected(Refused):
    """The message is the log line's reason."""


class MalformedFrame(FrameRejected):
    pass


class CatalogError(Unavailable):
    pass
