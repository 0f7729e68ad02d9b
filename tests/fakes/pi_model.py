"""A fake OpenAI-compatible chat-completions server on 127.0.0.1 for the pi and omp live tests.

It follows the lab's (`../shared/lab/pi/README.md`): the usage a reply reports is dictated by a
marker in the last user message, so a test decides exactly what the harness is told it spent.

- `[[u:IN:OUT]]` / `[[u:IN:OUT:CACHED]]`: `prompt_tokens=IN, completion_tokens=OUT`, and CACHED of
  the prompt reported as `prompt_tokens_details.cached_tokens` (pi: input IN-CACHED, cacheRead CACHED).
- `[[overflow]]`: the first request carrying that user text gets HTTP 400 "maximum context length".
- a summarization request (pi's summarization system prompt, omp's summarizer or its "Write a
  handoff document" user message) gets usage 700/120 and a unique summary: pi finds the saved
  compaction entry by its summary text, so repeated summaries would make it report the wrong one.
- `[[task:N:IN:OUT]]` in the last user message (omp): the reply calls omp's `task` tool N times at
  once (N 1..4), child K named `Child<IN+K>` and its assignment carrying `[[child:IN+K:OUT]]`; the
  request carrying the tool results back gets usage 1300/20, and so does a delivered task result
  (another user message). A session whose first user message carries `[[child:IN:OUT]]` is a
  subagent on this same server: usage IN/OUT, and a reply that never repeats the marker, so a
  child's usage never reaches its parent's prompt through the fake.
- anything else: usage 1300/20.

Streaming (SSE, with `stream_options.include_usage`) and plain JSON replies are both served. Every
request body is kept in `requests` for assertions. Only 127.0.0.1 is ever bound, on an ephemeral port.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import h11
import trio

from tests.fakes.http11 import LOOPBACK, json_response, send, serving

HOST = LOOPBACK
MARKER = re.compile(r"\[\[u:(\d+):(\d+)(?::(\d+))?\]\]")
TASK_MARKER = re.compile(r"\[\[task:([1-4]):(\d+):(\d+)\]\]")
CHILD_MARKER = re.compile(r"\[\[child:(\d+):(\d+)\]\]")
OVERFLOW_MARKER = "[[overflow]]"
OVERFLOW_MESSAGE = (
    "This model's maximum context length is 4000 tokens. However, your messages resulted in 5200 tokens. "
    "Please reduce the length of the messages."
)
SUMMARY_USAGE = (700, 120, 0)
DEFAULT_USAGE = (1300, 20, 0)


@dataclass(frozen=True)
class Served:
    kind: str  # "marker" | "summary" | "default" | "overflow_error"
    usage: tuple[int, int, int] | None
    body: dict[str, Any]


@dataclass
class FakeModel:
    port: int = 0
    requests: list[Served] = field(default_factory=list)
    _overflowed: set[str] = field(default_factory=set)
    _summaries: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}/v1"

    def answer(self, body: dict[str, Any]) -> tuple[int, Any, bool]:
        """(status, payload, stream) for one chat-completions request."""
        messages = body.get("messages") if isinstance(body.get("messages"), list) else []
        last_user = _last_user_text(messages)
        stream = bool(body.get("stream"))
        if _is_summary_request(messages, last_user):
            number = next(self._summaries)
            text = f"## Goal\nLive run (fake summary #{number}).\n## Progress\n- turns summarised by the fake model"
            self.requests.append(Served("summary", SUMMARY_USAGE, body))
            return 200, (text, SUMMARY_USAGE), stream
        if OVERFLOW_MARKER in last_user and last_user not in self._overflowed:
            self._overflowed.add(last_user)
            self.requests.append(Served("overflow_error", None, body))
            error = {"message": OVERFLOW_MESSAGE, "type": "invalid_request_error", "code": "context_length_exceeded"}
            return 400, {"error": error}, False
        first_user = _first_user_text(messages)
        child = CHILD_MARKER.search(first_user)
        if child is not None:  # a subagent's session: its assignment is its first user message
            usage = (int(child[1]), int(child[2]), 0)
            self.requests.append(Served("child", usage, body))
            return 200, ("child done (fake)", usage), stream
        delegation = TASK_MARKER.search(last_user)
        if delegation is not None:
            if _answered(messages):
                self.requests.append(Served("task_results", DEFAULT_USAGE, body))
                return 200, ("ok (fake reply after the tasks)", DEFAULT_USAGE), stream
            self.requests.append(Served("task_call", DEFAULT_USAGE, body))
            return 200, ("delegating (fake)", DEFAULT_USAGE, task_calls(delegation)), stream
        found = MARKER.search(last_user)
        if found is None:
            self.requests.append(Served("default", DEFAULT_USAGE, body))
            return 200, ("ok (fake reply)", DEFAULT_USAGE), stream
        usage = (int(found[1]), int(found[2]), int(found[3] or 0))
        self.requests.append(Served("marker", usage, body))
        return 200, (f"ok (fake reply for marker {found[0]})", usage), stream


def task_calls(delegation: re.Match[str]) -> tuple[ToolCall, ...]:
    """omp's `task` tool called once per child, each child's assignment stating its own served usage."""
    count, used, output = (int(group) for group in delegation.groups())
    return tuple(
        ("task", {"name": f"Child{used + index}", "agent": "task",
                  "task": f"Answer briefly. [[child:{used + index}:{output}]]"})
        for index in range(count)
    )  # fmt: skip


def _answered(messages: list[Any]) -> bool:
    """Whether a tool result follows the delegating prompt (the tasks were called already)."""
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            return False
        if isinstance(message, dict) and message.get("role") == "tool":
            return True
    return False


def _first_user_text(messages: list[Any]) -> str:
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "user":
            return _text_of(message.get("content"))
    return ""


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def _last_user_text(messages: list[Any]) -> str:
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            return _text_of(message.get("content"))
    return ""


def _is_summary_request(messages: list[Any], last_user: str) -> bool:
    system = " ".join(
        _text_of(message.get("content"))
        for message in messages
        if isinstance(message, dict) and message.get("role") in ("system", "developer")
    ).lower()
    return (
        "summarization assistant" in system
        or system.startswith("summarize")
        or "write a handoff document" in last_user.lower()
    )


def _usage_json(usage: tuple[int, int, int]) -> dict[str, Any]:
    prompt, completion, cached = usage
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


ToolCall = tuple[str, dict[str, Any]]  # (function name, arguments)


def _tool_calls(calls: tuple[ToolCall, ...]) -> list[dict[str, Any]]:
    return [
        {"index": index, "id": f"call_fake_{index}", "type": "function",
         "function": {"name": name, "arguments": json.dumps(arguments)}}
        for index, (name, arguments) in enumerate(calls)
    ]  # fmt: skip


def _sse_events(model: str, text: str, usage: tuple[int, int, int], calls: tuple[ToolCall, ...] = ()) -> list[bytes]:
    base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": model}
    delta: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        delta["tool_calls"] = _tool_calls(calls)
    chunks: list[dict[str, Any]] = [
        {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls" if calls else "stop"}]},
        {**base, "choices": [], "usage": _usage_json(usage)},
    ]
    return [f"data: {json.dumps(chunk)}\n\n".encode() for chunk in chunks] + [b"data: [DONE]\n\n"]


def _completion(model: str, text: str, usage: tuple[int, int, int], calls: tuple[ToolCall, ...] = ()) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [{key: value for key, value in call.items() if key != "index"}
                                 for call in _tool_calls(calls)]  # fmt: skip
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
        "usage": _usage_json(usage),
    }


async def serve_one(
    model: FakeModel, conn: h11.Connection, stream: trio.SocketStream, request: h11.Request, body: bytes
) -> None:
    path = request.target.decode().split("?")[0]
    if request.method != b"POST" or not path.endswith("/chat/completions"):
        payload = json.dumps({"error": {"message": f"no route {path}"}}).encode()
        await send(conn, stream, *json_response(404, payload))
        return
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = {}
    status, answer, streaming = model.answer(parsed if isinstance(parsed, dict) else {})
    name = str(parsed.get("model", "fake")) if isinstance(parsed, dict) else "fake"
    if status != 200:
        await send(conn, stream, *json_response(status, json.dumps(answer).encode()))
        return
    text, usage, *more = answer  # a third element: the tool calls of the reply
    calls: tuple[ToolCall, ...] = tuple(more[0]) if more else ()
    if not streaming:
        await send(conn, stream, *json_response(200, json.dumps(_completion(name, text, usage, calls)).encode()))
        return
    headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
    events: list[Any] = [h11.Response(status_code=200, headers=headers)]
    events += [h11.Data(data=chunk) for chunk in _sse_events(name, text, usage, calls)]
    events.append(h11.EndOfMessage())
    await send(conn, stream, *events)


@asynccontextmanager
async def fake_model() -> AsyncIterator[FakeModel]:
    """Serve on 127.0.0.1:<ephemeral> for the duration of the block."""
    model = FakeModel()
    async with serving(partial(serve_one, model)) as port:
        model.port = port
        yield model
