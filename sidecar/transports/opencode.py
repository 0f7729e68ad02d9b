"""OpenCode: follow the server's `GET /event` stream and pull `GET /config/providers` for windows.

`config` (from the wrapper's launch plan): `base_url` (the loopback address the wrapper made the
server listen on), optionally `directory` (the instance whose events to follow, for the TUI started
on a project path), `stall_seconds` and `max_backoff_seconds` (tests shorten them).

Every event object goes to the producer as it arrived. A providers answer goes as
`{"type": "hctx.providers", "payload": …}`: once per connection (a restarted server may carry a new
config) and again, BEFORE the frame that needed it, when a message names a `providerID/modelID`
whose window no answer supplied yet. The server sends `server.heartbeat` about every 10 s, so a
stream silent for `stall_seconds` is dead even when its socket is not; it is dropped and reopened,
as is a stream the server ended (a restart), with a capped, doubling back-off.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Annotated, Any, Final

import httpx
import trio
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sidecar.producers.base import Frame, FrameRejected
from sidecar.producers.opencode import (
    CONFIG_FRAME,
    ModelKey,
    SseParser,
    WindowCatalog,
    model_named_by,
    providers_frame,
)
from sidecar.transports import Submit

log = logging.getLogger(__name__)

# Heartbeats come every ~10 s: two and a half missed ones mean the stream is gone.
STALL_SECONDS: Final = 25.0
FIRST_BACKOFF_SECONDS: Final = 0.2
# SSE has no replay: what the server emits while no stream is open is lost, so retries stay close.
MAX_BACKOFF_SECONDS: Final = 2.0
# A model a pull did not supply is asked for again no sooner than this (a config edit may add it).
REPULL_SECONDS: Final = 30.0
REQUEST_SECONDS: Final = 10.0
# Measured on 1.18.25: the first request a just-started server accepts is never answered, while
# the next one is at once. A connection whose response headers do not come promptly is retried.
HEADERS_SECONDS: Final = 3.0
OUTPUT_TOKEN_MAX_ENV: Final = "OPENCODE_EXPERIMENTAL_OUTPUT_TOKEN_MAX"


class OpenCodeTransportConfig(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    base_url: Annotated[str, Field(pattern=r"^https?://", max_length=2048)]
    directory: str | None = None
    stall_seconds: Annotated[float, Field(gt=0)] = STALL_SECONDS
    headers_seconds: Annotated[float, Field(gt=0)] = HEADERS_SECONDS
    max_backoff_seconds: Annotated[float, Field(gt=0)] = MAX_BACKOFF_SECONDS


def next_backoff(current: float, cap: float) -> float:
    """Doubling from FIRST_BACKOFF_SECONDS, never above `cap`."""
    return min(max(current * 2, FIRST_BACKOFF_SECONDS), cap)


class EventFollower:
    """One server's event stream, followed across restarts, with the providers pulls it needs."""

    def __init__(self, config: OpenCodeTransportConfig, submit: Submit) -> None:
        self.config = config
        self.submit = submit
        self.catalog = WindowCatalog()
        self.connections = 0
        self._asked_at: dict[ModelKey, float] = {}

    async def run(self) -> None:
        log.info(
            "following OpenCode events",
            extra={"event": "opencode-follow", "url": self.config.base_url, "directory": self.config.directory},
        )
        params = {"directory": self.config.directory} if self.config.directory else None
        timeout = httpx.Timeout(REQUEST_SECONDS, read=self.config.stall_seconds)
        # trust_env=False: a proxy from the environment must never see loopback traffic.
        async with httpx.AsyncClient(
            base_url=self.config.base_url, timeout=timeout, params=params, trust_env=False
        ) as client:
            backoff = 0.0
            while True:
                try:
                    if await self._follow(client):
                        backoff = 0.0
                except (httpx.HTTPError, httpx.StreamError, trio.TooSlowError) as exc:
                    log.info(
                        "event stream lost: %s",
                        exc.__class__.__name__,
                        extra={"event": "opencode-stream-lost", "why": str(exc)[:200]},
                    )
                backoff = next_backoff(backoff, self.config.max_backoff_seconds)
                await trio.sleep(backoff)

    async def _follow(self, client: httpx.AsyncClient) -> bool:
        """One connection, until the server ends it or it stalls; True when it delivered a frame."""
        delivered = False
        request = client.build_request("GET", "/event", headers={"accept": "text/event-stream"})
        with trio.fail_after(self.config.headers_seconds):
            response = await client.send(request, stream=True)
        try:
            response.raise_for_status()
            self.connections += 1
            log.info("event stream open", extra={"event": "opencode-stream-open", "n": self.connections})
            await self._pull(client)
            await self._pull_config(client)
            parser = SseParser()
            async for line in response.aiter_lines():
                payload = parser.feed(line)
                if payload is None:
                    continue
                frame = _decode(payload)
                if frame is None:
                    continue
                delivered = True
                key = model_named_by(frame)
                if self.catalog.note(key) and key is not None and self._pull_due(key):
                    await self._pull(client)
                self.submit(frame)
        finally:
            await response.aclose()
        return delivered

    def _pull_due(self, key: ModelKey) -> bool:
        asked = self._asked_at.get(key)
        return asked is None or trio.current_time() - asked >= REPULL_SECONDS

    async def _pull(self, client: httpx.AsyncClient) -> None:
        now = trio.current_time()
        for key in self.catalog.missing:
            self._asked_at[key] = now
        try:
            response = await client.get("/config/providers", timeout=REQUEST_SECONDS)
            response.raise_for_status()
            payload: Any = json.loads(response.content)
            self.catalog.learn(payload)
        except (httpx.HTTPError, ValueError, RecursionError, FrameRejected) as exc:
            # FrameRejected is a ValueError; the stream goes on, and the window stays withheld.
            log.warning(
                "providers pull failed: %s",
                exc.__class__.__name__,
                extra={"event": "opencode-providers-failed", "why": str(exc)[:200]},
            )
            return
        self.submit(providers_frame(payload))

    async def _pull_config(self, client: httpx.AsyncClient) -> None:
        """`GET /config`, once per connection: its `compaction` block and the server's output cap
        make the compaction point (sidecar.producers.opencode); a failed pull leaves it unknown."""
        try:
            response = await client.get("/config", timeout=REQUEST_SECONDS)
            response.raise_for_status()
            payload: Any = json.loads(response.content)
        except (httpx.HTTPError, ValueError, RecursionError) as exc:
            log.warning(
                "config pull failed: %s",
                exc.__class__.__name__,
                extra={"event": "opencode-config-failed", "why": str(exc)[:200]},
            )
            return
        # The server inherited this environment from the wrapper, as the sidecar did.
        cap = os.environ.get(OUTPUT_TOKEN_MAX_ENV)
        self.submit({"type": CONFIG_FRAME, "payload": payload, **({} if cap is None else {"outputTokenMax": cap})})


def _decode(payload: str) -> Frame | None:
    try:
        value: Any = json.loads(payload)
    except (ValueError, RecursionError):
        value = None
    if isinstance(value, dict):
        return value
    log.warning("event is not a JSON object", extra={"event": "opencode-bad-event", "why": payload[:200]})
    return None


async def run(config: dict[str, Any], submit: Submit) -> None:
    try:
        settings = OpenCodeTransportConfig.model_validate(config)
    except ValidationError as exc:
        log.error("no OpenCode transport: %s", exc, extra={"event": "opencode-bad-config"})
        return
    await EventFollower(settings, submit).run()
