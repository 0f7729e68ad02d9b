"""A small JSON-RPC client for `codex app-server`, over stdio or websocket, as the lab's client.py.

It keeps every server→client message exactly as it arrived (`raw`: the stdout lines, or the
websocket text messages) beside its decoded form (`messages`), so a test can compare bytes as well
as meaning. Every wait is bounded.
"""

from __future__ import annotations

import itertools
import json
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio
import trio_websocket

Message = dict[str, Any]
REQUEST_TIMEOUT_S = 60.0
MAX_MESSAGE_BYTES = 256 * 1024 * 1024


class RpcError(RuntimeError):
    pass


class CodexClient:
    def __init__(self, send_text: Callable[[str], Awaitable[None]]) -> None:
        self._send_text = send_text
        self._ids = itertools.count(1)
        self._changed = trio.Event()
        self.raw: list[str] = []
        self.messages: list[Message] = []
        self.sent: list[str] = []

    def received(self, text: str) -> None:
        self.raw.append(text)
        self.messages.append(json.loads(text))
        self._changed.set()
        self._changed = trio.Event()

    async def send(self, message: Message) -> None:
        await self.send_raw(json.dumps(message))

    async def send_raw(self, text: str) -> None:
        self.sent.append(text)
        await self._send_text(text)

    async def wait_for(self, predicate: Callable[[list[Message]], Any], limit_s: float = REQUEST_TIMEOUT_S) -> Any:
        with trio.fail_after(limit_s):
            while not (found := predicate(self.messages)):
                await self._changed.wait()
            return found

    async def request(self, method: str, params: Message | None = None, limit_s: float = REQUEST_TIMEOUT_S) -> Any:
        ident = next(self._ids)
        await self.send({"method": method, "id": ident, "params": params or {}})
        response: Message = await self.wait_for(
            lambda messages: next((m for m in messages if m.get("id") == ident and "method" not in m), None),
            limit_s,
        )
        if "error" in response:
            raise RpcError(f"{method}: {response['error']}")
        return response.get("result")

    async def notify(self, method: str) -> None:
        await self.send({"method": method})

    def count(self, method: str) -> int:
        return sum(1 for m in self.messages if m.get("method") == method)

    # -- the lab's scenario steps -----------------------------------------------------------------

    async def initialize(self) -> Message:
        result: Message = await self.request(
            "initialize",
            {
                "clientInfo": {"name": "hctx_live_test", "title": "hctx live test", "version": "0.0.1"},
                "capabilities": {"experimentalApi": True, "requestAttestation": False},
            },
        )
        await self.notify("initialized")
        return result

    async def start_thread(self, cwd: Path) -> str:
        result = await self.request(
            "thread/start", {"cwd": str(cwd), "approvalPolicy": "never", "sandbox": "read-only"}
        )
        thread_id: str = result["thread"]["id"]
        return thread_id

    async def turn(self, thread_id: str, text: str, limit_s: float = REQUEST_TIMEOUT_S) -> None:
        done = self.count("turn/completed")
        await self.request("turn/start", {"threadId": thread_id, "input": [{"type": "text", "text": text}]})
        await self.wait_for(lambda _: self.count("turn/completed") > done, limit_s)

    async def compact(self, thread_id: str, limit_s: float = REQUEST_TIMEOUT_S) -> None:
        done = self.count("turn/completed")
        await self.request("thread/compact/start", {"threadId": thread_id})
        await self.wait_for(lambda _: self.count("turn/completed") > done, limit_s)

    async def resume(self, thread_id: str) -> Message:
        result: Message = await self.request("thread/resume", {"threadId": thread_id})
        return result


@asynccontextmanager
async def stdio_client(
    argv: Sequence[str], *, env: dict[str, str], cwd: Path, stderr: Path
) -> AsyncIterator[tuple[CodexClient, trio.Process, bytearray]]:
    """Run `argv` (an app-server, or `hctx wrap -- app-server`) and talk to its stdin/stdout.

    Yields the client, the process and every stdout byte as received. On exit stdin is closed and
    the process is given a bounded time to leave before it is terminated by PID.
    """
    with stderr.open("wb") as errors:
        process = await trio.lowlevel.open_process(
            list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors, env=env, cwd=cwd
        )
    assert process.stdin is not None and process.stdout is not None
    stdin, stdout = process.stdin, process.stdout

    async def send_line(text: str) -> None:
        await stdin.send_all(text.encode() + b"\n")

    client = CodexClient(send_line)
    everything = bytearray()

    async def read() -> None:
        pending = b""
        while chunk := await stdout.receive_some(65536):
            everything.extend(chunk)
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                if line.strip():
                    client.received(line.decode())

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            try:
                yield client, process, everything
            finally:
                await stdin.aclose()
                with trio.move_on_after(15):
                    await process.wait()
                if process.returncode is None:
                    process.terminate()
                    with trio.move_on_after(5):
                        await process.wait()
                    if process.returncode is None:
                        process.kill()
                        await process.wait()
                nursery.cancel_scope.cancel()
    finally:
        if process.returncode is None:
            process.kill()


@asynccontextmanager
async def ws_client(url: str, *, connect_limit_s: float = 30.0) -> AsyncIterator[CodexClient]:
    """Connect (retrying while nothing listens yet) and read every text message into the client."""
    async with trio.open_nursery() as nursery:
        connection = await _connect(nursery, url, connect_limit_s)
        client = CodexClient(connection.send_message)

        async def read() -> None:
            try:
                while True:
                    message = await connection.get_message()
                    assert isinstance(message, str)
                    client.received(message)
            except trio_websocket.ConnectionClosed:
                return

        nursery.start_soon(read)
        try:
            yield client
        finally:
            await connection.aclose()
            nursery.cancel_scope.cancel()


async def _connect(nursery: trio.Nursery, url: str, limit_s: float) -> trio_websocket.WebSocketConnection:
    with trio.fail_after(limit_s):
        while True:
            try:
                return await trio_websocket.connect_websocket_url(nursery, url, max_message_size=MAX_MESSAGE_BYTES)
            except (OSError, trio_websocket.HandshakeError):
                await trio.sleep(0.05)
