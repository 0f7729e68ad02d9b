"""OpenCode: follow the server's `GET /event` stream and pull `GET /config/providers` for windows.

`config` is the wrapper's launch plan's `sidecar.harnesses.opencode.producer.OpenCodeTransport`: `base_url`
(the address the wrapper made the server listen on), optionally `directory` (the instance whose
events to follow, for the TUI started on a project path), and the timings tests shorten.

Bytes only: the `/event` body goes as it arrives into a `sse` stream (one per connection), each
`GET /config/providers` and `GET /config` answer body into the `providers` and `config` streams;
the harness's decoders (sidecar.harnesses.opencode.producer) make the events, as `hctx replay` does. The one
fact of the sidecar's own, the `OPENCODE_EXPERIMENTAL_OUTPUT_TOKEN_MAX` the server inherited from
the same environment, is submitted as its typed event.

Providers are pulled once per connection (a restarted server may carry a new config) and again
when the producer wants a window no answer supplied yet (`wants`: a message named a new
`providerID/modelID`): the decoded events are handed on one at a time, and the pull happens right
after the event that made the window wanted, before the next. OpenCode announces every assistant
message with a token-less frame before its completion, so the completion finds its window. The
server sends `server.heartbeat` about every 10 s, so a stream silent for `stall_seconds` is dead
even when its socket is not; it is dropped and reopened, as is a stream the server ended (a
restart), with a capped, doubling back-off.

HTTP is httpx's (on trio through anyio), one `AsyncClient` per transport: `trust_env=False`, so a
proxy in the environment never sees loopback traffic, and explicit timeouts: the response head of
`/event` within `headers_seconds` (a just-started server may leave a first request unanswered),
then each wait for more of its body within `stall_seconds`; each pull within REQUEST_SECONDS. The
wrapper always passes `http://HOST:PORT`, HOST loopback unless the user bound the server elsewhere,
so the client's TLS context (`tls_context`) trusts no certificate at all: httpx's default loads the
CA bundle, 1.7 MB of every OpenCode sidecar for TLS that never happens, and a TLS URL fails its
verification rather than going unverified.
Every way a request can fail is one `HttpError` whose message is the sentence to log (`_why`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import ssl
import urllib.parse
from collections.abc import AsyncIterator, Hashable
from typing import Final

import trio

from guard.errors import Unavailable
from sidecar.harnesses.opencode.lean_httpx import httpx
from sidecar.harnesses.opencode.producer import (
    CONFIG_WIRE,
    PROVIDERS_WIRE,
    SSE_WIRE,
    OpenCodeTransport,
    output_token_max,
)
from sidecar.spec import Stream, Streams

__all__ = [
    "FIRST_BACKOFF_SECONDS",
    "OUTPUT_TOKEN_MAX_ENV",
    "PULL_MAX_BYTES",
    "REPULL_SECONDS",
    "REQUEST_SECONDS",
    "EventFollower",
    "HttpError",
    "next_backoff",
    "run",
    "tls_context",
]


class HttpError(Unavailable):
    """An HTTP request did not deliver; the message is the sentence to log."""


log = logging.getLogger(__name__)

FIRST_BACKOFF_SECONDS: Final = 0.2
# A model a pull did not supply is asked for again no sooner than this (a config edit may add it).
REPULL_SECONDS: Final = 30.0
REQUEST_SECONDS: Final = 10.0
# A providers or config answer larger than this is a failed pull (the decoders cap theirs at 16 MiB).
PULL_MAX_BYTES: Final = 64 * 1024 * 1024
OUTPUT_TOKEN_MAX_ENV: Final = "OPENCODE_EXPERIMENTAL_OUTPUT_TOKEN_MAX"


def next_backoff(current: float, cap: float) -> float:
    """Doubling from FIRST_BACKOFF_SECONDS, never above `cap`."""
    return min(max(current * 2, FIRST_BACKOFF_SECONDS), cap)


class EventFollower:
    """One server's event stream, followed across restarts, with the providers pulls it needs."""

    def __init__(self, config: OpenCodeTransport, streams: Streams, client: httpx.AsyncClient) -> None:
        self.config = config
        self.streams = streams
        self.client = client
        self.connections = 0
        self._base = config.base_url.rstrip("/")
        # Every request names the instance, as the `directory` query parameter (%20 for a space,
        # as OpenCode's own clients send it).
        self._query = "" if not config.directory else "?directory=" + urllib.parse.quote(config.directory, safe="")
        self._providers = streams.open(PROVIDERS_WIRE)
        self._config = streams.open(CONFIG_WIRE)
        self._asked_at: dict[Hashable, float] = {}

    async def run(self) -> None:
        log.info(
            "following OpenCode events",
            extra={"event": "opencode-follow", "url": self.config.base_url, "directory": self.config.directory},
        )
        # The server inherited this environment from the wrapper, as the sidecar did.
        self.streams.submit(output_token_max(os.environ.get(OUTPUT_TOKEN_MAX_ENV)))
        backoff = 0.0
        while True:
            try:
                if await self._follow():
                    backoff = 0.0
            except HttpError as exc:
                log.info(
                    "event stream lost: %s",
                    exc,
                    extra={"event": "opencode-stream-lost", "why": str(exc)[:200]},
                )
            backoff = next_backoff(backoff, self.config.max_backoff_seconds)
            await trio.sleep(backoff)

    @contextlib.asynccontextmanager
    async def _get(
        self, path: str, head_seconds: float, read_seconds: float, **headers: str
    ) -> AsyncIterator[httpx.Response]:
        """`GET path` streamed: the 2xx response once its head came within `head_seconds`, each
        wait for more of its body bounded by `read_seconds`; an HttpError for every failure."""
        url = f"{self._base}{path}{self._query}"
        shown = f"{self._base}{path}"
        timeout = httpx.Timeout(head_seconds, read=read_seconds)
        try:
            async with contextlib.AsyncExitStack() as stack:
                with trio.move_on_after(head_seconds) as head:
                    request = self.client.stream("GET", url, headers=headers, timeout=timeout)
                    response = await stack.enter_async_context(request)
                if head.cancelled_caught:
                    raise HttpError(f"GET {shown}: no response head within {head_seconds:g} s")
                if not response.is_success:
                    raise HttpError(f"GET {shown} answered {response.status_code} {response.reason_phrase}".rstrip())
                yield response
        except httpx.HTTPError as exc:
            raise HttpError(f"GET {shown}: {_why(exc, read_seconds)}") from None

    async def _follow(self) -> bool:
        """One connection, until the server ends it or it stalls; True when it delivered an event."""
        delivered = False
        config = self.config
        async with self._get("/event", config.headers_seconds, config.stall_seconds, accept="text/event-stream") as (
            response
        ):
            self.connections += 1
            log.info("event stream open", extra={"event": "opencode-stream-open", "n": self.connections})
            await self._pull()
            await self._pull_config()
            events = self.streams.open(SSE_WIRE)
            try:
                async for data in response.aiter_bytes():
                    delivered |= events.receive_data(data) > 0
                    if self._pull_due():  # the producer met a model whose window it lacks
                        await self._pull()
            finally:
                events.end_of_data()  # the event the server closed in the middle of: a drop
        return delivered

    def _pull_due(self) -> bool:
        now = trio.current_time()
        for key in self.streams.wants():
            asked = self._asked_at.get(key)
            if asked is None or now - asked >= REPULL_SECONDS:
                return True
        return False

    async def _answer(self, path: str) -> bytes:
        """A whole 2xx answer's body; an HttpError otherwise."""
        async with self._get(path, REQUEST_SECONDS, REQUEST_SECONDS) as response:
            body = bytearray()
            async for data in response.aiter_bytes():
                body += data
                if len(body) > PULL_MAX_BYTES:
                    raise HttpError(f"GET {self._base}{path}: the body is larger than {PULL_MAX_BYTES} bytes")
            return bytes(body)

    async def _pull(self) -> None:
        now = trio.current_time()
        for key in self.streams.wants():
            self._asked_at[key] = now
        await self._pull_into(self._providers, "/config/providers", "providers")  # else the window stays withheld

    async def _pull_config(self) -> None:
        """`GET /config`, once per connection: its `compaction` block and the server's output cap
        make the compaction point (sidecar.harnesses.opencode.producer); a failed pull leaves it unknown."""
        await self._pull_into(self._config, "/config", "config")

    async def _pull_into(self, stream: Stream, path: str, what: str) -> None:
        """One answer's body into its stream; a failed pull is logged, and the event stream goes on."""
        try:
            body = await self._answer(path)
        except HttpError as exc:
            log.warning(
                f"{what} pull failed: %s", exc, extra={"event": f"opencode-{what}-failed", "why": str(exc)[:200]}
            )
            return
        stream.receive_data(body)


def _why(exc: httpx.HTTPError, read_seconds: float) -> str:
    """The sentence for a failed request (httpx's own text where it is one already)."""
    text = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect: {text}"
    if isinstance(exc, httpx.ReadTimeout):
        return f"nothing more for {read_seconds:g} s"
    if isinstance(exc, httpx.TimeoutException):
        return f"timed out ({type(exc).__name__})"
    if "complete message body" in text:  # h11's words for a body cut short of its declared end
        return f"the server closed the connection before the end of the body ({text})"
    return text


def tls_context() -> ssl.SSLContext:
    """Verification required, hostnames checked, and no certificate trusted (none loaded)."""
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


async def run(config: OpenCodeTransport, streams: Streams) -> None:
    limits = httpx.Limits(max_connections=4, max_keepalive_connections=2)
    client = httpx.AsyncClient(trust_env=False, verify=tls_context(), timeout=REQUEST_SECONDS, limits=limits)
    async with client:
        await EventFollower(config, streams, client).run()
