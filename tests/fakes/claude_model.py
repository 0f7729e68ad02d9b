"""A fake Anthropic Messages API on 127.0.0.1 for the Claude Code live tests.

It does what the lab's `fake_anthropic.py` did (../shared/lab/claude/README.md), as far as Claude Code
can see it:

- `POST /v1/messages` (Claude adds `?beta=true`, and always asks for `stream: true`) answers SSE:
  `message_start`, `content_block_start`, `content_block_delta` (text_delta), `content_block_stop`,
  `message_delta` carrying the full usage again, `message_stop`. Non-streaming requests get the
  message as JSON; `POST /v1/messages/count_tokens` an input count.
- `HEAD`/`GET /api/hello` (2.1.250 at start-up) get 200; any other path 404.

The usage a reply reports is dictated by the request, so a test decides what Claude is told it spent:

- a main-loop request (one carrying `tools`) answers with the last `usage=I,CC,CR,O` in its newest
  user text (input, cache_creation, cache_read, output), or 120/0/0/7 without one;
- the compaction request (its newest user text is Claude's "create a detailed summary of the
  conversation" prompt) answers 30000/0/0/1500 with an `<analysis>`/`<summary>` reply;
- side calls (title generation: no `tools`) answer 120/0/0/7, so no marker is ever counted twice.

Delegation (issue 28), Claude's `Agent` tool called as a real model would:

- `agent=I,CC,CR,O` (one or more) in a main-loop request's newest user text, with nothing after it:
  the reply is one `Agent` tool_use per marker, in parallel (`subagent_type` general-purpose), each
  prompt `child task K usage=I,CC,CR,O`, so the subagent's own requests report those numbers;
  `agent@haiku=...` also sets the call's `model` input;
- a main-loop request whose newest message is a tool result or a `<task-notification>` (Claude
  runs every subagent in the background and wakes the main agent with one): a plain reply, its
  usage the last `after=I,CC,CR,O` of the user's newest own text, or 120/0/0/7.

A reply quotes its prompt with the markers defused, since a subagent's last message reaches the
main agent inside its notification.

Every request is kept in `requests` for assertions.

Rate limits (issue 29): with `unified` set, a response carries the `anthropic-ratelimit-unified-{5h,7d}-
{utilization,reset}` headers the real service sends a claude.ai subscriber, for the account the
request names (`metadata.user_id`'s `account_uuid`, which Claude takes from its config dir's
`oauthAccount`): the account's n-th main-loop turn gets its n-th (five-hour, seven-day) utilization
(the last one repeats), a side call the current one. `account_uuids` keeps what each request named.
"""

from __future__ import annotations

import itertools
import json
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

import h11
import trio

from tests.fakes.http11 import LOOPBACK, reply_json, send, serving

HOST = LOOPBACK
USAGE_MARKER = re.compile(r"usage=(\d+),(\d+),(\d+),(\d+)")
# `agent@haiku=...` asks for the subagent on that model (the Agent tool's `model` input).
AGENT_MARKER = re.compile(r"agent(?:@(\w+))?=(\d+,\d+,\d+,\d+)")
AFTER_MARKER = re.compile(r"after=(\d+),(\d+),(\d+),(\d+)")
NOTIFICATION_PREFIX = "<task-notification>"
AGENT_TOOL = "Agent"
CHILD_TASK = "child task"
COMPACTION_PROMPT = "create a detailed summary of the conversation"
SIDE_CALL_USAGE = (120, 0, 0, 7)
COMPACTION_USAGE = (30000, 0, 0, 1500)
# Claude approves a custom API key by its last 20 characters (the lab's `customApiKeyResponses`).
API_KEY = "sk-ant-api03-hctx-fake-live-test-key-0000000000AA"

Kind = Literal["turn", "compaction", "side", "delegate", "after"]
Usage = tuple[int, int, int, int]  # input, cache_creation, cache_read, output


@dataclass(frozen=True)
class Served:
    index: int
    kind: Kind
    usage: Usage
    stream: bool
    model: str
    calls: tuple[dict[str, Any], ...] = ()  # the tool_use inputs of a delegating reply


@dataclass
class FakeMessages:
    port: int = 0
    requests: list[Served] = field(default_factory=list)
    other_paths: list[str] = field(default_factory=list)
    # account_uuid -> the (five-hour, seven-day) utilizations (fractions) its turns are told, in order
    unified: dict[str, list[tuple[float, float]]] | None = None
    account_uuids: list[str | None] = field(default_factory=list)
    # Seconds a subagent's own request (`child task K ...`) waits before its reply: the subagent is
    # running that long, so Claude's `subagentStatusLine` ticks (every 5 s) see it (issue 37).
    child_hold_s: float = 0.0
    _turns_of: dict[str, int] = field(default_factory=dict)
    _index: itertools.count[int] = field(default_factory=itertools.count)

    def rate_limit_headers(self, body: dict[str, Any], kind: Kind) -> list[tuple[bytes, bytes]]:
        """The unified headers for the account this request names; none without `unified`."""
        account = _account_uuid(body)
        self.account_uuids.append(account)
        if self.unified is None or account not in self.unified:
            return []
        steps, served = self.unified[account], self._turns_of.get(account, 0)
        five_hour, seven_day = steps[min(served, len(steps) - 1)]
        if kind == "turn":
            self._turns_of[account] = served + 1
        now = int(time.time())
        pairs = {
            "anthropic-ratelimit-unified-status": "allowed",
            "anthropic-ratelimit-unified-5h-utilization": f"{five_hour}",
            "anthropic-ratelimit-unified-5h-reset": f"{now + 2 * 3600}",
            "anthropic-ratelimit-unified-7d-utilization": f"{seven_day}",
            "anthropic-ratelimit-unified-7d-reset": f"{now + 3 * 86_400}",
        }
        return [(name.encode(), value.encode()) for name, value in pairs.items()]

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def answer(self, body: dict[str, Any]) -> tuple[Served, str]:
        """The record of one `POST /v1/messages` and the reply text."""
        messages = body.get("messages")
        messages = messages if isinstance(messages, list) else []
        # The user's own words: not a tool result's message nor a subagent's notification.
        own = [
            text for m in messages
            if isinstance(m, dict) and m.get("role") == "user" and not _has_tool_result(m)
            and (text := _text_of(m)).strip() and NOTIFICATION_PREFIX not in text
        ]  # fmt: skip
        newest = own[-1] if own else ""
        woken = bool(messages) and _is_wake_up(messages[-1])
        calls: tuple[dict[str, Any], ...] = ()
        kind: Kind
        if COMPACTION_PROMPT in newest:
            kind, usage = "compaction", COMPACTION_USAGE
            text = (
                "<analysis>Fake analysis of the conversation.</analysis>\n"
                "<summary>1. Primary Request and Intent: the hctx live test's turns.</summary>"
            )
        elif body.get("tools") and woken:
            kind, usage = "after", _marker(AFTER_MARKER, newest) or SIDE_CALL_USAGE
            text = "The subagents reported back."
        elif body.get("tools") and AGENT_MARKER.search(newest) and _text_of(messages[-1]) == newest:
            kind, usage = "delegate", _marker(USAGE_MARKER, newest) or SIDE_CALL_USAGE
            calls = tuple(
                {"description": f"child {number}", "subagent_type": "general-purpose",
                 "prompt": f"{CHILD_TASK} {number} usage={found}"} | ({"model": model} if model else {})
                for number, (model, found) in enumerate(AGENT_MARKER.findall(newest), 1)
            )  # fmt: skip
            text = "Delegating."
        elif body.get("tools"):
            kind = "turn"
            usage = _marker(USAGE_MARKER, newest) or SIDE_CALL_USAGE
            text = f"Fake reply to: {newest[-80:].replace('=', ':')}"
        else:
            kind, usage = "side", SIDE_CALL_USAGE
            text = json.dumps({"title": "Fake live session"})
        served = Served(next(self._index), kind, usage, bool(body.get("stream")), str(body.get("model", "")), calls)
        self.requests.append(served)
        return served, text

    def turns(self) -> list[Served]:
        return [served for served in self.requests if served.kind == "turn"]


def _account_uuid(body: dict[str, Any]) -> str | None:
    """`metadata.user_id` is a JSON string naming `account_uuid` ("" without a stored account)."""
    metadata = body.get("metadata")
    try:
        user = json.loads(metadata.get("user_id", "")) if isinstance(metadata, dict) else None
    except ValueError:
        return None
    account = user.get("account_uuid") if isinstance(user, dict) else None
    return account if isinstance(account, str) and account else None


def _marker(marker: re.Pattern[str], text: str) -> Usage | None:
    found = marker.findall(text)
    return tuple(int(n) for n in found[-1]) if found else None  # type: ignore[return-value]


def _is_wake_up(message: Any) -> bool:
    """A user message that is a tool result, or a subagent's `<task-notification>`."""
    if not isinstance(message, dict) or message.get("role") != "user":
        return False
    return _has_tool_result(message) or NOTIFICATION_PREFIX in _text_of(message)


def _has_tool_result(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(isinstance(p, dict) and p.get("type") == "tool_result" for p in content)


def _text_of(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text", "")) for part in content if isinstance(part, dict) and part.get("type") == "text"
        )
    return ""


def _usage_json(usage: Usage, *, output: int | None = None) -> dict[str, int]:
    fresh, creation, read, out = usage
    return {
        "input_tokens": fresh,
        "cache_creation_input_tokens": creation,
        "cache_read_input_tokens": read,
        "output_tokens": out if output is None else output,
    }


def _tool_uses(served: Served) -> list[dict[str, Any]]:
    return [
        {"type": "tool_use", "id": f"toolu_fake_{served.index}_{n}", "name": AGENT_TOOL, "input": call}
        for n, call in enumerate(served.calls)
    ]


def _message(served: Served, text: str | None) -> dict[str, Any]:
    content: list[dict[str, Any]] = [] if text is None else [{"type": "text", "text": text}, *_tool_uses(served)]
    return {
        "id": f"msg_fake_{served.index}",
        "type": "message",
        "role": "assistant",
        "model": served.model,
        "content": content,
        "stop_reason": None if text is None else ("tool_use" if served.calls else "end_turn"),
        "stop_sequence": None,
        "usage": _usage_json(served.usage, output=1 if text is None else None),
    }


def _sse(event: dict[str, Any]) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


def sse_events(served: Served, text: str) -> list[bytes]:
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": _message(served, None)},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}},
        {"type": "content_block_stop", "index": 0},
    ]
    for index, use in enumerate(_tool_uses(served), 1):
        events += [
            {"type": "content_block_start", "index": index, "content_block": {**use, "input": {}}},
            {"type": "content_block_delta", "index": index,
             "delta": {"type": "input_json_delta", "partial_json": json.dumps(use["input"])}},
            {"type": "content_block_stop", "index": index},
        ]  # fmt: skip
    events += [
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use" if served.calls else "end_turn", "stop_sequence": None},
            "usage": _usage_json(served.usage),
        },
        {"type": "message_stop"},
    ]
    return [_sse(event) for event in events]


async def _serve_one(
    server: FakeMessages, conn: h11.Connection, stream: trio.SocketStream, request: h11.Request, body: bytes
) -> None:
    path = request.target.decode("latin-1").split("?")[0]
    if path == "/api/hello":
        server.other_paths.append(path)
        await reply_json(conn, stream, 200, {"message": "hello"})
        return
    if request.method != b"POST" or path not in ("/v1/messages", "/v1/messages/count_tokens"):
        server.other_paths.append(path)
        await reply_json(conn, stream, 404, {"type": "error", "error": {"type": "not_found_error", "message": path}})
        return
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        error = {"type": "invalid_request_error", "message": "body is not a JSON object"}
        await reply_json(conn, stream, 400, {"type": "error", "error": error})
        return
    if path.endswith("/count_tokens"):
        await reply_json(conn, stream, 200, {"input_tokens": 1000})
        return
    served, text = server.answer(parsed)
    if server.child_hold_s and served.kind == "turn" and CHILD_TASK in text:
        await trio.sleep(server.child_hold_s)
    limits = server.rate_limit_headers(parsed, served.kind)
    if not served.stream:
        payload = json.dumps(_message(served, text)).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()), *limits]
        await send(conn, stream, h11.Response(status_code=200, headers=headers), h11.Data(data=payload),
                   h11.EndOfMessage())  # fmt: skip
        return
    headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"), *limits]
    await send(conn, stream, h11.Response(status_code=200, headers=headers))
    for chunk in sse_events(served, text):
        await send(conn, stream, h11.Data(data=chunk))
    await send(conn, stream, h11.EndOfMessage())


@asynccontextmanager
async def fake_messages() -> AsyncIterator[FakeMessages]:
    """Serve on 127.0.0.1:<ephemeral> for the duration of the block."""
    server = FakeMessages()
    async with serving(partial(_serve_one, server)) as port:
        server.port = port
        yield server


def claude_home(home: Any, cwd: Any) -> None:
    """The throwaway HOME the lab used: no first-run dialog, the key approved, the folder trusted."""
    (home / ".claude").mkdir(parents=True, exist_ok=True)
    state = {
        "hasCompletedOnboarding": True,
        "theme": "dark",
        "customApiKeyResponses": {"approved": [API_KEY[-20:]], "rejected": []},
        "projects": {str(cwd): {"hasTrustDialogAccepted": True, "hasCompletedProjectOnboarding": True}},
    }
    (home / ".claude.json").write_text(json.dumps(state))
    (home / ".claude" / "settings.json").write_text("{}\n")


def claude_env(home: Any, base_url: str) -> dict[str, str]:
    """Offline: our server, a fake key, and no traffic anywhere else (lab obstacle 3)."""
    return {
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": API_KEY,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL": "1",
        "TERM": "xterm-256color",
    }
