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

HTTP is sidecar.http's, a small h11 client: `http://` only (the wrapper always passes
`http://HOST:PORT`, HOST loopback unless the user bound the server elsewhere), never a proxy from
the environment (h11 has none), one connection per request.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Hashable
from typing import Final

import trio

from guard.errors import HttpError
from sidecar import http
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
    "next_backoff",
    "run",
]

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

    def __init__(self, config: OpenCodeTransport, streams: Streams) -> None:
        self.config = config
        self.streams = streams
        self.connections = 0
        self._url = http.parse_url(config.base_url)
        # Every request names the instance, as the `directory` query parameter.
        self._query = {"directory": config.directory} if config.directory else None
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

    async def _follow(self) -> bool:
        """One connection, until the server ends it or it stalls; True when it delivered an event."""
        delivered = False
        async with http.get(
            self._url,
            "/event",
            query=self._query,
            headers=[("accept", "text/event-stream")],
            head_seconds=self.config.headers_seconds,
            read_seconds=self.config.stall_seconds,
        ) as response:
            response.raise_for_status()
            self.connections += 1
            log.info("event stream open", extra={"event": "opencode-stream-open", "n": self.connections})
            await self._pull()
            await self._pull_config()
            events = self.streams.open(SSE_WIRE)
            try:
                async for data in response:
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
        async with http.get(
            self._url, path, query=self._query, head_seconds=REQUEST_SECONDS, read_seconds=REQUEST_SECONDS
        ) as response:
            response.raise_for_status()
            return await response.read(PULL_MAX_BYTES)

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


async def run(config: OpenCodeTransport, streams: Streams) -> None:
    await EventFollower(config, streams).run()
