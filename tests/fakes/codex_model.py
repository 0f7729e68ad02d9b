"""A fake OpenAI Responses API on 127.0.0.1 for the Codex live tests and the relay benchmark.

It follows the lab's `fake_responses.py` (../shared/lab/codex/README.md) in what Codex can see:

- `POST /v1/responses` streams SSE: `response.created`, `response.output_item.added`,
  `response.output_text.delta`, `response.output_item.done`, `response.completed` with `usage`.
- every response carries the `x-codex-*` rate-limit headers: primary `10 + 7.5·n` % over a 300-minute
  window and secondary `40 + n` % over 10,080 minutes, n the request's index (capped at 100), unless
  the server was made with `rate_limit_headers=False`.
- a remote-compaction-v2 request (its `input` ends with `{"type": "compaction_trigger"}`) is answered
  with exactly one `{"type": "compaction", "encrypted_content": …}` output item, as Codex requires.
- `GET /v1/responses` (the built-in provider's Responses-over-websocket attempt) gets 404.

The usage a reply reports is dictated by markers in the request's user text, so a test decides
exactly what Codex is told it spent, with no state shared between test and server:

- a turn request answers with the last `[[u:IN:OUT]]` / `[[u:IN:OUT:CACHED]]` in its newest user
  message (`total_tokens = IN + OUT`), or 1300/20 without one;
- a compaction request (Codex's "CONTEXT CHECKPOINT COMPACTION" summarisation prompt, or a remote-v2
  trigger) answers with the last `[[c:IN:OUT]]` anywhere in its input, or 1000/100 without one;
- `[[sleep:S]]` in a turn's newest user message holds its reply back S seconds (a turn still running).

Delegation (issue 28): Codex's `multi_agent_v1` tools, called as the real model would.

- `[[spawn:IN:OUT]]` (one or more) in a turn's newest user message: the reply is one `spawn_agent`
  function call per marker, in parallel, each with the message `child task K [[u:IN:OUT]]`, so the
  child thread's own first request reports IN/OUT (and `[[sleep:S]]` after it, `[[csleep:S]]` in
  the parent's text, holds the child's reply back);
- once the input holds those calls' outputs (and no `wait_agent` yet): one `wait_agent` on every
  agent id they returned, its usage the last `[[w:IN:OUT]]`, or 1300/20;
- once it holds the `wait_agent` output: a plain reply, its usage the last `[[a:IN:OUT]]`, or 1300/20.

A reply to a request whose newest input is a tool output carries no tool call unless the rules above
say so, so a thread never loops.

Every request is kept in `requests` (kind, usage, headers, body) for assertions.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal

import h11
import trio

from tests.fakes.http11 import LOOPBACK, send, serving
from tests.harnesses import harness_env

HOST = LOOPBACK
TURN_MARKER = re.compile(r"\[\[u:(\d+):(\d+)(?::(\d+))?\]\]")
COMPACTION_MARKER = re.compile(r"\[\[c:(\d+):(\d+)(?::(\d+))?\]\]")
SLEEP_MARKER = re.compile(r"\[\[sleep:(\d+(?:\.\d+)?)\]\]")
SPAWN_MARKER = re.compile(r"\[\[spawn:(\d+):(\d+)\]\]")
CHILD_SLEEP_MARKER = re.compile(r"\[\[csleep:(\d+(?:\.\d+)?)\]\]")
WAIT_MARKER = re.compile(r"\[\[w:(\d+):(\d+)(?::(\d+))?\]\]")
AFTER_MARKER = re.compile(r"\[\[a:(\d+):(\d+)(?::(\d+))?\]\]")
MULTI_AGENT_NAMESPACE = "multi_agent_v1"
AGENT_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
COMPACTION_PROMPT = "CONTEXT CHECKPOINT COMPACTION"
DEFAULT_TURN_USAGE = (1300, 20, 0)
DEFAULT_COMPACTION_USAGE = (1000, 100, 0)
FIVE_HOUR_MINUTES = 300
SEVEN_DAY_MINUTES = 10_080

Kind = Literal["turn", "compaction", "remote_compaction_v2", "spawn", "wait", "after_wait"]
Usage = tuple[int, int, int]  # input, output, cached


@dataclass(frozen=True)
class Served:
    index: int
    kind: Kind
    usage: Usage
    headers: dict[str, str]
    body: dict[str, Any]
    rate_limits: tuple[float, float] | None  # (primary %, secondary %) as sent in the headers
    delay_s: float = 0.0  # how long the reply is held back
    calls: tuple[tuple[str, dict[str, Any]], ...] = ()  # (tool name, arguments) of a tool-call reply


@dataclass
class FakeResponses:
    rate_limit_headers: bool = True
    # The lab streamed each SSE event 20 ms apart; a live test keeps it short.
    event_gap_s: float = 0.002
    port: int = 0
    requests: list[Served] = field(default_factory=list)
    _index: itertools.count[int] = field(default_factory=itertools.count)

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}/v1"

    def answer(
        self, headers: dict[str, str], body: dict[str, Any]
    ) -> tuple[Served, list[bytes], list[tuple[bytes, bytes]]]:
        """The record of one `POST /v1/responses`, its SSE events and its extra headers."""
        index = next(self._index)
        raw_items = body.get("input")
        items: list[Any] = raw_items if isinstance(raw_items, list) else []
        texts = [_text_of(item) for item in items if isinstance(item, dict)]
        # A finished child's `<subagent_notification>` comes in as a user message; the markers are
        # the user's, in the newest message that is not one.
        user_texts = [_text_of(item) for item in items if _is_user_text(item)]
        kind: Kind
        if items and isinstance(items[-1], dict) and items[-1].get("type") == "compaction_trigger":
            kind = "remote_compaction_v2"
        elif any(COMPACTION_PROMPT in text for text in user_texts[-1:]):
            kind = "compaction"
        else:
            kind = "turn"
        calls: tuple[tuple[str, dict[str, Any]], ...] = ()
        if kind == "turn":
            usage = _last_marker(TURN_MARKER, user_texts[-1:]) or DEFAULT_TURN_USAGE
            kind, calls, usage = _delegation(items, user_texts[-1] if user_texts else "", usage)
        else:
            usage = _last_marker(COMPACTION_MARKER, texts) or DEFAULT_COMPACTION_USAGE
        limits = (min(100.0, 10 + 7.5 * index), min(100.0, 40.0 + index)) if self.rate_limit_headers else None
        sleep = SLEEP_MARKER.search(user_texts[-1]) if kind == "turn" and user_texts else None
        served = Served(index, kind, usage, headers, body, limits, float(sleep[1]) if sleep else 0.0, calls)
        self.requests.append(served)
        extra = _rate_limit_headers(*limits) if limits is not None else []
        return served, _sse_events(served, user_texts[-1] if user_texts else ""), extra


def _delegation(
    items: list[Any], user_text: str, usage: Usage
) -> tuple[Kind, tuple[tuple[str, dict[str, Any]], ...], Usage]:
    """The delegation step a turn request is at (the module doc), its tool calls and its usage."""
    newest_user = max((i for i, item in enumerate(items) if _is_user_text(item)), default=-1)
    since = [item for item in items[newest_user + 1 :] if isinstance(item, dict)]
    called = {item.get("call_id"): item.get("name") for item in since if item.get("type") == "function_call"}
    outputs = [item for item in since if item.get("type") == "function_call_output"]
    output_tools = [called.get(item.get("call_id")) for item in outputs]
    if "wait_agent" in output_tools:
        return "after_wait", (), _last_marker(AFTER_MARKER, [user_text]) or DEFAULT_TURN_USAGE
    if "spawn_agent" in output_tools:
        ids = [found for item in outputs for found in AGENT_ID.findall(str(item.get("output")))]
        wait = {"targets": list(dict.fromkeys(ids)), "timeout_ms": 120_000}
        return "wait", (("wait_agent", wait),), _last_marker(WAIT_MARKER, [user_text]) or DEFAULT_TURN_USAGE
    spawns = SPAWN_MARKER.findall(user_text)
    if not spawns or outputs:
        return "turn", (), usage
    child_sleep = CHILD_SLEEP_MARKER.search(user_text)
    hold = f" [[sleep:{child_sleep[1]}]]" if child_sleep else ""
    calls = tuple(
        ("spawn_agent", {"message": f"child task {number} [[u:{prompt}:{output}]]{hold}"})
        for number, (prompt, output) in enumerate(spawns, 1)
    )
    return "spawn", calls, usage


NOTIFICATION_PREFIX = "<subagent_notification>"


def _is_user_text(item: Any) -> bool:
    return (
        isinstance(item, dict) and item.get("role") == "user"
        and not _text_of(item).lstrip().startswith(NOTIFICATION_PREFIX)
    )  # fmt: skip


def _text_of(item: dict[str, Any]) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def _last_marker(marker: re.Pattern[str], texts: list[str]) -> Usage | None:
    found = [match for text in texts for match in marker.finditer(text)]
    if not found:
        return None
    last = found[-1]
    return int(last[1]), int(last[2]), int(last[3] or 0)


def _usage_json(usage: Usage) -> dict[str, Any]:
    prompt, output, cached = usage
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + output,
    }


def _rate_limit_headers(primary: float, secondary: float) -> list[tuple[bytes, bytes]]:
    now = int(time.time())
    pairs = {
        "x-codex-primary-used-percent": f"{primary}",
        "x-codex-primary-window-minutes": f"{FIVE_HOUR_MINUTES}",
        "x-codex-primary-reset-at": f"{now + 3 * 3600}",
        "x-codex-secondary-used-percent": f"{secondary}",
        "x-codex-secondary-window-minutes": f"{SEVEN_DAY_MINUTES}",
        "x-codex-secondary-reset-at": f"{now + 5 * 86400}",
    }
    return [(name.encode(), value.encode()) for name, value in pairs.items()]


def _sse(event: dict[str, Any]) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


def _sse_events(served: Served, user_text: str) -> list[bytes]:
    response_id = f"resp_fake_{served.index}"
    response = {"id": response_id, "object": "response", "status": "in_progress", "output": []}
    events: list[dict[str, Any]] = [{"type": "response.created", "response": response}]
    if served.kind == "remote_compaction_v2":
        item: dict[str, Any] = {
            "type": "compaction",
            "id": f"cmp_fake_{served.index}",
            "encrypted_content": f"fake-compaction-{served.index}",
        }
        events += [
            {"type": "response.output_item.added", "output_index": 0, "item": item},
            {"type": "response.output_item.done", "output_index": 0, "item": item},
        ]
    elif served.calls:
        for position, (name, arguments) in enumerate(served.calls):
            call = {
                "type": "function_call", "id": f"fc_fake_{served.index}_{position}", "status": "completed",
                "call_id": f"call_fake_{served.index}_{position}", "name": name,
                "namespace": MULTI_AGENT_NAMESPACE, "arguments": json.dumps(arguments),
            }  # fmt: skip
            events += [
                {"type": "response.output_item.added", "output_index": position, "item": call},
                {"type": "response.output_item.done", "output_index": position, "item": call},
            ]
    else:
        text = f"fake reply #{served.index} ({served.kind})" + (
            # Markers defused: the reply reaches the parent in a notification, which must not dictate.
            f" to: {user_text[:60].replace('[[', '((')}" if served.kind == "turn" else ""
        )
        message_id = f"msg_fake_{served.index}"
        events += [
            {"type": "response.output_item.added", "output_index": 0, "item": {
                "type": "message", "id": message_id, "role": "assistant", "status": "in_progress", "content": []}},
            {"type": "response.output_text.delta", "item_id": message_id, "output_index": 0, "content_index": 0,
             "delta": text},
            {"type": "response.output_item.done", "output_index": 0, "item": {
                "type": "message", "id": message_id, "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}]}},
        ]  # fmt: skip
    completed = {**response, "status": "completed", "usage": _usage_json(served.usage)}
    events.append({"type": "response.completed", "response": completed})
    return [_sse(event) for event in events]


async def _serve_one(
    server: FakeResponses, conn: h11.Connection, stream: trio.SocketStream, request: h11.Request, body: bytes
) -> None:
    path = request.target.decode("latin-1").split("?")[0]
    if request.method != b"POST" or not path.endswith("/responses"):
        payload = json.dumps({"error": {"message": f"no route {request.method.decode()} {path}"}}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
        for event in (h11.Response(status_code=404, headers=headers), h11.Data(data=payload), h11.EndOfMessage()):
            await send(conn, stream, event)
        return
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = {}
    request_headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in request.headers}
    served, chunks, extra = server.answer(request_headers, parsed if isinstance(parsed, dict) else {})
    await trio.sleep(served.delay_s)
    headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"), *extra]
    await send(conn, stream, h11.Response(status_code=200, headers=headers))
    for chunk in chunks:
        await send(conn, stream, h11.Data(data=chunk))
        await trio.sleep(server.event_gap_s)
    await send(conn, stream, h11.EndOfMessage())


@asynccontextmanager
async def fake_responses(*, rate_limit_headers: bool = True) -> AsyncIterator[FakeResponses]:
    """Serve on 127.0.0.1:<ephemeral> for the duration of the block."""
    server = FakeResponses(rate_limit_headers=rate_limit_headers)
    async with serving(partial(_serve_one, server)) as port:
        server.port = port
        yield server


def codex_env(home: Path, codex_home: Path, version: str) -> dict[str, str]:
    """An isolated environment for a real codex binary: its own HOME, CODEX_HOME and XDG dirs."""
    return {
        "PATH": os.environ.get("PATH", os.defpath),
        "PYTHONPATH": str(Path(__file__).resolve().parent.parent.parent),
        "HOME": str(home),
        "CODEX_HOME": str(codex_home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "FAKE_OPENAI_API_KEY": "dummy",  # the provider's env_key; no real key exists anywhere here
        **harness_env("codex", version),
    }


def codex_config(base_url: str) -> str:
    """CODEX_HOME/config.toml as the lab wrote it: the custom provider pointed at this server."""
    return f"""\
model = "lab-model"
model_provider = "fake"
model_context_window = 200000
model_auto_compact_token_limit = 160000
approval_policy = "never"
sandbox_mode = "read-only"
check_for_update_on_startup = false

[model_providers.fake]
name = "Fake Responses"
base_url = "{base_url}"
wire_api = "responses"
env_key = "FAKE_OPENAI_API_KEY"
request_max_retries = 0
stream_max_retries = 0
"""


# One `POST …/responses` as this fake answers it, for servers that route other paths themselves.
serve_responses = _serve_one
