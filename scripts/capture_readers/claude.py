"""Claude's lab captures (the payloads Claude wrote to the tee's stdin, `.times` beside them) as the
channel lines the tee sends: moved out of the product by issue 30, run once by convert_fixtures."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from guard.errors import FrameRejected, MalformedFrame
from guard.json_rule import loads_object
from sidecar.decoding import CHANNEL
from sidecar.harnesses.claude.frames import HOOK_FRAME, HOOK_TYPE, STATUSLINE_FRAME, channel_line
from sidecar.producer import instant_ms
from sidecar.recorder import Chunk
from sidecar.spec import recording_bytes


@dataclass(frozen=True, slots=True)
class _Recorded:
    """One line of a capture: its channel bytes, when it arrived, and what orders a hook."""

    at_ms: int | None
    hook: bool
    event: object  # a hook's hook_event_name
    prompt: object  # its payload's prompt_id
    data: bytes


# Measured arrival order of one compaction's three hooks, on both versions.
_HOOK_ORDER = {"PreCompact": 0, "SessionStart": 1, "PostCompact": 2}


def read_recording(paths: Sequence[Path]) -> Iterator[Chunk]:
    """Capture files as the channel lines the tee would have sent, in one session timeline.

    A line of a capture is what Claude wrote to the tee's stdin: a hook payload when it names
    `hook_event_name`, a status-line payload otherwise. Each becomes `channel_line`'s bytes, as the
    tee builds them; a line the tee would not send (not one JSON object) is not in the session. A
    line that already is a channel frame (it has a `type`) is those bytes, timed by its own `atMs`.

    A capture `X.jsonl` is timed by its sibling `X.times` (one ISO-8601 instant per JSON object
    line) when there is one. Timed lines run in time order. The lab kept no times for the hook
    captures, so an untimed hook is placed just before the first status-line payload of the same
    `prompt_id` (each compaction's hooks fire before the payload that follows it) and takes that
    payload's time; a hook with no prompt_id (SessionStart at startup) goes first; one whose prompt
    never shows up goes last.
    """
    spine: list[_Recorded] = []
    loose: list[_Recorded] = []
    for path in paths:
        times = _times_beside(path)
        objects = ((line, item) for line in recording_bytes(path).splitlines() if (item := _object(line)) is not None)
        for index, (line, item) in enumerate(objects):
            recorded = _recorded(line, item, times[index] if index < len(times) else None)
            if recorded is None:
                continue
            (loose if recorded.at_ms is None and recorded.hook else spine).append(recorded)
    if all(payload.at_ms is not None for payload in spine):
        spine.sort(key=lambda payload: payload.at_ms or 0)
    first: list[_Recorded] = []
    anchored: dict[str, list[_Recorded]] = {}
    for hook in sorted(loose, key=lambda hook: _HOOK_ORDER.get(str(hook.event), len(_HOOK_ORDER))):
        if isinstance(hook.prompt, str):
            anchored.setdefault(hook.prompt, []).append(hook)
        else:
            first.append(hook)
    for payload in spine:
        hooks = first + (anchored.pop(payload.prompt, []) if isinstance(payload.prompt, str) else [])
        first = []
        yield from (Chunk(payload.at_ms, CHANNEL, hook.data) for hook in hooks)
        yield Chunk(payload.at_ms, CHANNEL, payload.data)
    for hook in first + [hook for hooks in anchored.values() for hook in hooks]:
        yield Chunk(None, CHANNEL, hook.data)


def _object(line: bytes) -> dict[str, Any] | None:
    try:
        return loads_object(line, error=MalformedFrame) if line.strip() else None
    except FrameRejected:
        return None  # a truncated tail is what a killed capture leaves


def _recorded(line: bytes, item: dict[str, Any], at_ms: int | None) -> _Recorded | None:
    if "type" in item:  # already a channel frame: the bytes the channel carried
        stamp = item.get("atMs")
        own = stamp if isinstance(stamp, int) and not isinstance(stamp, bool) and stamp >= 0 else None
        payload = item.get("payload")
        payload = payload if isinstance(payload, dict) else {}
        hook = item.get("type") == HOOK_TYPE
        return _Recorded(own if own is not None else at_ms, hook, payload.get("hook_event_name"),
                         payload.get("prompt_id"), line + b"\n")  # fmt: skip
    hook = "hook_event_name" in item
    try:
        data = channel_line(HOOK_FRAME if hook else STATUSLINE_FRAME, line)
    except ValueError:
        return None  # the tee would not have sent it
    return _Recorded(at_ms, hook, item.get("hook_event_name"), item.get("prompt_id"), data)


def _times_beside(path: Path) -> list[int | None]:
    try:
        text = recording_bytes(path.with_suffix(".times")).decode("utf-8", "replace")
    except OSError:
        return []
    return [instant_ms(line.strip()) for line in text.splitlines()]
