"""The board as an ASGI application (Starlette), served by hypercorn's trio worker.

Read-only: every route is GET (HEAD); nothing changes anything. A request whose Host is not the
listening address or localhost is refused (TrustedHostMiddleware, against DNS rebinding), and every
answer carries a Content-Security-Policy that lets the page load nothing but its own files.

Routes: `/` the fleet, `/agents/HOST/AGENT` one agent, `/assets/*` the page's files (from the
wheel), `/api/agents` (= `hctx agents --json`), `/api/agents/HOST/AGENT` (= `hctx agents
HOST/AGENT --json`), `/api/agents/HOST/AGENT/detail` (the agent page's record, claim and plot),
`/api/board` (the fleet page's views), `/api/events` (Server-Sent Events: the same views as they
change; `?agent=HOST/AGENT` for one) and `/api/status` (agents held, streams open).

The event streams cannot exhaust it: every fleet page's stream sends the same bytes (the board's
`Journal`, each change encoded once), in pieces of at most `PIECE_BYTES` so a page that does not
read holds no more than one piece; past `max_streams` a stream is refused (503, one line on
stderr); a page that stops reading is dropped by the kernel's write timeout (TCP_USER_TIMEOUT on
the listening socket, `hctx web --write-timeout`), since hypercorn's writes cannot be cancelled.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from importlib import resources
from typing import Any

import trio
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from guard.errors import CatalogError
from wrapper.arguments import quiet_guard_logs
from wrapper.readers.render import render_agent_json
from wrapper.readers.roster import AgentNotFound, collect_inspection, now_ms, resolve_agent, view_agent
from wrapper.readers.web.board import agent_detail, read_fill_history
from wrapper.readers.web.feed import GZIP_HEADER, KEEPALIVE_S, Board, packed, sse_event

__all__ = [
    "ASSETS",
    "CSP",
    "CURRENT",
    "KEEPALIVE",
    "KEEPALIVE_S",
    "PIECE_BYTES",
    "REFUSALS_SAID_EVERY_S",
    "SNAPSHOT_SLOT",
    "Refusals",
    "SecurityHeaders",
    "accepts_gzip",
    "batched",
    "make_app",
    "quiet_accept_errors",
]

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
# The page's files, shipped in the wheel (package data) and read from there; nothing else is served.
ASSETS = {
    "board.css": "text/css; charset=utf-8",
    "common.js": "text/javascript; charset=utf-8",
    "board.js": "text/javascript; charset=utf-8",
    "agent.js": "text/javascript; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
_PAGES = ("index.html", "agent.html")
SNAPSHOT_SLOT = b"{{snapshot}}"
PIECE_BYTES = 64 * 1024  # the most one stream's write holds of an event (a snapshot is megabytes)
KEEPALIVE = b": keep-alive\n\n"
CURRENT = b": current\n\n"  # the page holds the current snapshot
KEEPALIVE_PACKED, CURRENT_PACKED = packed(KEEPALIVE), packed(CURRENT)
REFUSALS_SAID_EVERY_S = 10.0


def _asset(name: str) -> bytes:
    return resources.files("wrapper.readers.web").joinpath("assets", name).read_bytes()


class SecurityHeaders:
    """CSP and its companions on every response, the refusals included."""

    HEADERS = (
        (b"content-security-policy", CSP.encode()),
        (b"x-content-type-options", b"nosniff"),
        (b"referrer-policy", b"no-referrer"),
        (b"x-frame-options", b"DENY"),
        (b"cross-origin-resource-policy", b"same-origin"),
    )

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *self.HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)


class Refusals:
    """Streams refused past the cap, said on stderr: the first at once, then at most one line per
    REFUSALS_SAID_EVERY_S with how many since (a flood of pages is a few lines, never a traceback)."""

    def __init__(self, cap: int) -> None:
        self.cap, self.count, self.unsaid, self.said_at = cap, 0, 0, -REFUSALS_SAID_EVERY_S

    def note(self, now: float) -> None:
        self.count += 1
        self.unsaid += 1
        if now - self.said_at >= REFUSALS_SAID_EVERY_S:
            print(f"hctx web: refused {self.unsaid} event stream(s): {self.cap} open, the most --max-streams "
                  "allows", file=sys.stderr, flush=True)  # fmt: skip
            self.unsaid, self.said_at = 0, now


class _OneLine(logging.Handler):
    """trio's accept loop logs running out of descriptors with a traceback, every 0.1 s: one line
    instead, at most every REFUSALS_SAID_EVERY_S."""

    def __init__(self) -> None:
        super().__init__()
        self.said_at = -REFUSALS_SAID_EVERY_S

    def emit(self, record: logging.LogRecord) -> None:
        if record.created - self.said_at >= REFUSALS_SAID_EVERY_S:
            self.said_at = record.created
            error = record.exc_info[1] if record.exc_info else None
            why = getattr(error, "strerror", None) or record.getMessage()
            print(f"hctx web: cannot accept a connection: {why}; retrying", file=sys.stderr, flush=True)


def quiet_accept_errors() -> None:
    accepting = logging.getLogger("trio.serve_listeners")
    if not any(isinstance(handler, _OneLine) for handler in accepting.handlers):
        accepting.addHandler(_OneLine())
    accepting.propagate = False


class _Asgi:
    """A plain ASGI callable as a route's endpoint (Starlette wraps a function as a request handler)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


def batched(events: list[bytes]) -> Iterator[bytes | memoryview]:
    """`events` as writes of at most PIECE_BYTES: small ones joined (a stream's only copy, bounded
    by PIECE_BYTES), a large one in pieces of its own bytes."""
    batch: list[bytes] = []
    size = 0
    for data in events:
        if batch and size + len(data) > PIECE_BYTES:
            yield b"".join(batch)
            batch, size = [], 0
        if len(data) > PIECE_BYTES:
            yield from _pieces(data)
        else:
            batch.append(data)
            size += len(data)
    if batch:
        yield b"".join(batch)


def _pieces(data: bytes) -> Iterator[bytes | memoryview]:
    """`data` in pieces of at most PIECE_BYTES, none of them a copy."""
    if len(data) <= PIECE_BYTES:
        yield data
        return
    view = memoryview(data)
    for start in range(0, len(data), PIECE_BYTES):
        yield view[start : start + PIECE_BYTES]


def accepts_gzip(header: str) -> bool:
    """Whether an Accept-Encoding header takes gzip (every browser's does): named, or `*`, without q=0."""
    for item in header.split(","):
        name, _, parameters = item.partition(";")
        if name.strip().lower() in ("gzip", "*"):
            quality = parameters.strip().lower().removeprefix("q=").strip()
            return not (parameters.strip().lower().startswith("q=") and quality.strip("0.") == "")
    return False


def _json(body: str, status: int = 200) -> Response:
    return Response(body, status, media_type="application/json", headers={"cache-control": "no-store"})


def _error(message: str, status: int) -> Response:
    return _json(json.dumps({"error": message}, ensure_ascii=False) + "\n", status)


def make_app(board: Board, allowed_hosts: Sequence[str], *, max_streams: int) -> Starlette:
    catalog, here = board.catalog, board.here
    quiet_guard_logs()
    quiet_accept_errors()
    refusals = Refusals(max_streams)
    pages = {name: _asset(name) for name in _PAGES}
    assets = {name: _asset(name) for name in ASSETS}

    def page(name: str) -> Response:
        return Response(pages[name], media_type="text/html; charset=utf-8", headers={"cache-control": "no-store"})

    async def fleet_page(_: Request) -> Response:
        # The first snapshot rides in the page as a JSON data block (never run, so the CSP allows
        # it): the rows paint without waiting for the event stream's handshake.
        await board.ready.wait()
        body = pages["index.html"].replace(SNAPSHOT_SLOT, board.page_data(), 1)
        return Response(body, media_type="text/html; charset=utf-8", headers={"cache-control": "no-store"})

    async def agent_page(_: Request) -> Response:
        return page("agent.html")

    async def asset(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in assets:
            return PlainTextResponse("not found\n", 404)
        return Response(assets[name], media_type=ASSETS[name], headers={"cache-control": "no-cache"})

    async def favicon(_: Request) -> Response:
        return Response(assets["favicon.svg"], media_type=ASSETS["favicon.svg"])

    async def agents(_: Request) -> Response:
        # From the board's cache, never the catalog read again per request (board.agents_json).
        body = await board.agents_json()
        if board.problem is not None:
            return _error(board.problem, 503)
        return Response(body, media_type="application/json", headers={"cache-control": "no-store"})

    def _resolved(request: Request) -> tuple[str, str]:
        return resolve_agent(catalog, f"{request.path_params['host']}/{request.path_params['agent']}", here=here)

    async def one_agent(request: Request) -> Response:
        def read() -> str:
            host, identity = _resolved(request)
            return render_agent_json(view_agent(catalog, host, identity, now_ms(), here=here, alive=board.alive).row)

        try:
            return _json(await trio.to_thread.run_sync(read))
        except AgentNotFound as exc:
            return _error(str(exc.args[0]), 404)
        except CatalogError as exc:
            return _error(f"cannot read the catalog: {exc}", 503)

    async def detail(request: Request) -> Response:
        def read() -> dict[str, Any]:
            host, identity = _resolved(request)
            now = now_ms()
            inspection = collect_inspection(catalog, host, identity, now, here=here, alive=board.alive)
            return agent_detail(inspection, read_fill_history(catalog, host, identity, here=here), now)

        try:
            found = await trio.to_thread.run_sync(read)
        except AgentNotFound as exc:
            return _error(str(exc.args[0]), 404)
        except CatalogError as exc:
            return _error(f"cannot read the catalog: {exc}", 503)
        return _json(json.dumps(found, ensure_ascii=False, allow_nan=False))

    async def board_views(_: Request) -> Response:
        await board.ready.wait()
        return _json(board.encoded())

    async def status(_: Request) -> Response:
        await board.ready.wait()
        found = {"agents": len(board.views), "streams": board.streams, "problem": board.problem}
        return _json(json.dumps(found) + "\n")

    async def fleet_stream(held: str | None, gzip: bool) -> AsyncIterator[bytes | memoryview]:
        """The journal's events from the snapshot the page holds (sent again if it is not the
        current one, or if the page fell further behind than the journal keeps); `gzip`: the
        packed events after a gzip header (each packed once, whichever stream sends it)."""
        journal = board.journal
        await board.ready.wait()
        current = CURRENT_PACKED if gzip else CURRENT
        first = current if held == str(board.version) else board.snapshot_event(gzip=gzip)
        cursor = journal.next
        for data in (GZIP_HEADER if gzip else b"", first, board.ages_event(gzip=gzip)):
            for piece in _pieces(data):
                yield piece
        while True:
            # Nothing new since the last write: wait for the journal's next event (or its keep-alive
            # beat), one wake-up shared by every stream. Otherwise send everything since the cursor
            # at once: a stream still writing when events arrive takes them all in its next write,
            # so a stream batches by itself exactly when it is behind, and never waits when it is not.
            if cursor >= journal.next:
                await journal.news()
                if cursor >= journal.next:
                    yield KEEPALIVE_PACKED if gzip else KEEPALIVE
                    continue
            pending = journal.since(cursor, gzip=gzip)
            # Further behind than the journal keeps: the snapshot again (never joined: megabytes).
            again = [board.snapshot_event(gzip=gzip), board.ages_event(gzip=gzip)] if pending is None else []
            sent = pending or again
            cursor = journal.next
            for piece in batched(sent):
                yield piece

    async def agent_stream(only: str) -> AsyncIterator[bytes]:
        with board.subscribe(only) as box:
            await board.ready.wait()
            yield sse_event("snapshot", board.snapshot(only))
            while True:
                taken = None
                with trio.move_on_after(KEEPALIVE_S):  # no yield inside a cancel scope
                    taken = await box.take()
                if taken is None:
                    yield KEEPALIVE
                    continue
                rows, panel, ages, problem_changed = taken
                if problem_changed:
                    yield sse_event("problem", {"problem": board.problem})
                if rows or panel is not None:
                    yield sse_event("rows", {"rows": rows, "panel": panel})
                if ages:
                    yield sse_event("ages", ages)

    async def events(scope: Scope, receive: Receive, send: Send) -> None:
        # Counted here, with no checkpoint between the look at the count and the count: however
        # many arrive at once, no more than `max_streams` are served.
        if board.streams >= max_streams:
            refusals.note(trio.current_time())
            refused = _error(f"too many event streams open (the most is {max_streams}); try again later", 503)
            refused.headers["retry-after"] = "10"
            refused.headers["connection"] = "close"
            await refused(scope, receive, send)
            return
        with board.stream():
            request = Request(scope, receive)
            only = request.query_params.get("agent")
            held = request.query_params.get("since")  # the version of the snapshot the page already holds
            gzip = only is None and accepts_gzip(request.headers.get("accept-encoding", ""))
            body = fleet_stream(held, gzip) if only is None else agent_stream(only)
            headers = {"cache-control": "no-store", "x-accel-buffering": "no"}
            if gzip:
                headers |= {"content-encoding": "gzip", "vary": "accept-encoding"}
            response = StreamingResponse(body, media_type="text/event-stream", headers=headers)
            await response(scope, receive, send)

    routes = [
        Route("/", fleet_page),
        Route("/agents/{host}/{agent}", agent_page),
        Route("/assets/{name}", asset),
        Route("/favicon.ico", favicon),
        Route("/api/agents", agents),
        Route("/api/agents/{host}/{agent}", one_agent),
        Route("/api/agents/{host}/{agent}/detail", detail),
        Route("/api/board", board_views),
        Route("/api/events", _Asgi(events), methods=["GET"]),
        Route("/api/status", status),
    ]
    middleware = [Middleware(SecurityHeaders), Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts))]
    return Starlette(routes=routes, middleware=middleware)
