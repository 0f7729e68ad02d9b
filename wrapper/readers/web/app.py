"""The board as an ASGI application (Starlette), served by hypercorn's trio worker.

Read-only: every route is GET (HEAD); nothing changes anything. A request whose Host is not the
listening address or localhost is refused (TrustedHostMiddleware, against DNS rebinding), and every
answer carries a Content-Security-Policy that lets the page load nothing but its own files.

Routes: `/` the fleet, `/agents/HOST/AGENT` one agent, `/assets/*` the page's files (from the
wheel), `/api/agents` (= `hctx agents --json`), `/api/agents/HOST/AGENT` (= `hctx agents
HOST/AGENT --json`), `/api/agents/HOST/AGENT/detail` (the agent page's record, claim and plot),
`/api/board` (the fleet page's views), `/api/events` (Server-Sent Events: the same views as they
change; `?agent=HOST/AGENT` for one) and `/api/status` (agents held, streams open).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
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
from wrapper.readers.render import render_agent_json, render_agents_json
from wrapper.readers.roster import AgentNotFound, collect_inspection, collect_roster, now_ms, resolve_agent, view_agent
from wrapper.readers.web.board import agent_detail, read_fill_history
from wrapper.readers.web.feed import Board

__all__ = [
    "ASSETS",
    "CSP",
    "KEEPALIVE_S",
    "SNAPSHOT_SLOT",
    "SecurityHeaders",
    "make_app",
]

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
KEEPALIVE_S = 15.0
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


def _json(body: str, status: int = 200) -> Response:
    return Response(body, status, media_type="application/json", headers={"cache-control": "no-store"})


def _error(message: str, status: int) -> Response:
    return _json(json.dumps({"error": message}, ensure_ascii=False) + "\n", status)


def make_app(board: Board, allowed_hosts: Sequence[str]) -> Starlette:
    catalog, here = board.catalog, board.here
    quiet_guard_logs()
    pages = {name: _asset(name) for name in _PAGES}
    assets = {name: _asset(name) for name in ASSETS}

    def page(name: str) -> Response:
        return Response(pages[name], media_type="text/html; charset=utf-8", headers={"cache-control": "no-store"})

    async def fleet_page(_: Request) -> Response:
        # The first snapshot rides in the page as a JSON data block (never run, so the CSP allows
        # it): the rows paint without waiting for the event stream's handshake.
        await board.ready.wait()
        data = board.encoded().replace("<", "\\u003c").encode()
        body = pages["index.html"].replace(SNAPSHOT_SLOT, data, 1)
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
        def read() -> str:
            return render_agents_json(collect_roster(catalog, now_ms(), here=here, alive=board.alive).rows)

        try:
            return _json(await trio.to_thread.run_sync(read))
        except CatalogError as exc:
            return _error(f"cannot read the catalog: {exc}", 503)

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
        found = {"agents": len(board.views), "streams": len(board.mailboxes), "problem": board.problem}
        return _json(json.dumps(found) + "\n")

    async def events(request: Request) -> Response:
        only = request.query_params.get("agent")
        held = request.query_params.get("since")  # the version of the snapshot the page already holds

        async def stream() -> AsyncIterator[str]:
            with board.subscribe(only) as box:
                await board.ready.wait()
                if only is not None:
                    yield _event("snapshot", board.snapshot(only))
                elif held != str(board.version):
                    yield f"event: snapshot\ndata: {board.encoded()}\n\n"
                else:
                    yield ": current\n\n"
                while True:
                    taken = None
                    with trio.move_on_after(KEEPALIVE_S):  # no yield inside a cancel scope
                        taken = await box.take()
                    if taken is None:
                        yield ": keep-alive\n\n"
                        continue
                    rows, panel, ages, problem_changed = taken
                    if problem_changed:
                        yield _event("problem", {"problem": board.problem})
                    if rows or panel is not None:
                        yield _event("rows", {"rows": rows, "panel": panel})
                    if ages:
                        yield _event("ages", ages)

        return StreamingResponse(
            stream(), media_type="text/event-stream", headers={"cache-control": "no-store", "x-accel-buffering": "no"}
        )

    routes = [
        Route("/", fleet_page),
        Route("/agents/{host}/{agent}", agent_page),
        Route("/assets/{name}", asset),
        Route("/favicon.ico", favicon),
        Route("/api/agents", agents),
        Route("/api/agents/{host}/{agent}", one_agent),
        Route("/api/agents/{host}/{agent}/detail", detail),
        Route("/api/board", board_views),
        Route("/api/events", events),
        Route("/api/status", status),
    ]
    middleware = [Middleware(SecurityHeaders), Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts))]
    return Starlette(routes=routes, middleware=middleware)


def _event(kind: str, data: object) -> str:
    return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False, allow_nan=False)}\n\n"
