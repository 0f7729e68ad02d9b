"""A fake OpenAI-compatible provider on 127.0.0.1 for the OpenCode live tests.

It is the pi/omp fake (`tests/fakes/pi_model.py`: the `[[u:IN:OUT]]` / `[[u:IN:OUT:CACHED]]` marker in
the last user message dictates the reported usage; streaming with a final usage-only chunk) with
OpenCode's two side requests recognised, because both would otherwise read a marker that is not theirs:

- the compaction summary (system prompt "You are a context summarization agent", no tools): OpenCode
  packs the whole transcript, markers included, into one user message, so it gets SUMMARY_USAGE;
- the title request of an untitled session ("You are a title generator"): TITLE_USAGE.

It answers with a tool call only to delegate (issue 28), and then only with the `task` tool: its
glob/grep tools would try to download ripgrep.

- `[[task:IN:OUT]]` (one or more) in the last user message: the reply calls `task` once per marker, in
  parallel, each child's prompt `child task K [[u:IN:OUT]]` (so the child session's own request
  reports IN/OUT), its usage the turn's `[[u:...]]`;
- a request whose newest message is a `task` result: a plain reply, its usage the last `[[a:IN:OUT]]`
  of the user's message, or 1300/20.

It also stands in for the npm registry (`registry_url`): every OpenCode start asks the registry for its
plugin SDK unless the config dir already holds it (tests/live/test_opencode_offline_live.py), and a
live test must reach only 127.0.0.1; what was asked is kept in `registry_requests`.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import h11
import trio

from tests.fakes.http11 import reply_json, serving
from tests.fakes.pi_model import HOST, MARKER, FakeModel, Served, _last_user_text, _text_of, serve_one

# The lab's summary call: prompt 14,321 + completion 222 = tokens.total 14,543.
SUMMARY_USAGE = (14_321, 222, 0)
TITLE_USAGE = (77, 7, 0)
TASK_MARKER = re.compile(r"\[\[task:(\d+):(\d+)\]\]")
AFTER_MARKER = re.compile(r"\[\[a:(\d+):(\d+)\]\]")
TASK_AGENT = "general"
# Where the live tests point OpenCode's npm registry (`npm_config_registry`, which its own npm config
# loader reads): every request there is recorded and answered 404, which npm does not retry.
REGISTRY_PATH = "/npm-registry"


@dataclass
class OpenCodeFakeModel(FakeModel):
    registry_requests: list[str] = field(default_factory=list)  # "GET /@opencode-ai%2fplugin", ...

    @property
    def registry_url(self) -> str:
        return f"http://{HOST}:{self.port}{REGISTRY_PATH}/"

    def answer(self, body: dict[str, Any]) -> tuple[int, Any, bool]:
        messages = body.get("messages") if isinstance(body.get("messages"), list) else []
        system = " ".join(
            _text_of(message.get("content"))
            for message in messages or []
            if isinstance(message, dict) and message.get("role") in ("system", "developer")
        ).lower()
        stream = bool(body.get("stream"))
        if "summarization agent" in system or ("summar" in system and not body.get("tools")):
            self.requests.append(Served("summary", SUMMARY_USAGE, body))
            return 200, ("## Summary\nThe fake model summarised the session.", SUMMARY_USAGE), stream
        if "title generator" in system:
            self.requests.append(Served("title", TITLE_USAGE, body))
            return 200, ("Fake title", TITLE_USAGE), stream
        delegated = self._delegation(messages or [], stream, body)
        return delegated if delegated is not None else super().answer(body)

    def _delegation(self, messages: list[Any], stream: bool, body: dict[str, Any]) -> tuple[int, Any, bool] | None:
        user = _last_user_text(messages)
        newest = messages[-1] if messages and isinstance(messages[-1], dict) else {}
        if newest.get("role") == "tool":
            found = AFTER_MARKER.search(user)
            usage = (int(found[1]), int(found[2]), 0) if found else (1300, 20, 0)
            self.requests.append(Served("after_task", usage, body))
            return 200, ("the children are done", usage), stream
        tasks = TASK_MARKER.findall(user)
        if not tasks:
            return None
        turn = MARKER.search(user)
        usage = (int(turn[1]), int(turn[2]), int(turn[3] or 0)) if turn else (1300, 20, 0)
        calls = [
            ("task", {"description": f"child {number}", "prompt": f"child task {number} [[u:{prompt}:{output}]]",
                      "subagent_type": TASK_AGENT})
            for number, (prompt, output) in enumerate(tasks, 1)
        ]  # fmt: skip
        self.requests.append(Served("task", usage, body))
        return 200, ("", usage, calls), stream

    def kinds(self) -> list[str]:
        return [served.kind for served in self.requests]

    def last_user_texts(self) -> list[str]:
        return [_last_user_text(served.body.get("messages") or []) for served in self.requests]


@asynccontextmanager
async def opencode_fake_model() -> AsyncIterator[OpenCodeFakeModel]:
    """Serve on 127.0.0.1:<ephemeral> for the duration of the block."""
    model = OpenCodeFakeModel()
    async with serving(partial(serve_opencode, model)) as port:
        model.port = port
        yield model


async def serve_opencode(
    model: OpenCodeFakeModel, conn: h11.Connection, stream: trio.SocketStream, request: h11.Request, body: bytes
) -> None:
    target = request.target.decode()
    if target.startswith(f"{REGISTRY_PATH}/"):
        model.registry_requests.append(f"{request.method.decode()} {target.removeprefix(REGISTRY_PATH)}")
        await reply_json(conn, stream, 404, {"error": "Not found"})
        return
    await serve_one(model, conn, stream, request, body)
