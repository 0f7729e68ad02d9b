"""The board's access token, for `hctx web` on an address that is not loopback (issue 38).

A board on the LAN (a phone, a spare tablet) shows every agent's data to whoever reaches the address,
so there it answers only a holder of a token the command makes when it starts and prints once, as
the URL's `?token=` (stdout, never argv or a log). That URL opened once, the token moves into a
cookie (HttpOnly: no script reads it; SameSite=Strict: no other site's page sends it; Secure under
TLS) and the browser is sent on to the same address without it, so it leaves the address bar and
the history. A script may send it as `Authorization: Bearer TOKEN`. Every request without it is
refused (401), the page's files and its event stream alike; every comparison is hmac.compare_digest.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Iterable
from http.cookies import CookieError, SimpleCookie
from urllib.parse import parse_qsl, urlencode

from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["COOKIE", "QUERY", "TokenGate", "new_token"]

COOKIE = "hctx_board"
QUERY = "token"
_REFUSED = b"hctx web: this board answers only its access token: open the URL `hctx web` printed when it started\n"


def new_token() -> str:
    """256 bits from the system's CSPRNG, URL-safe."""
    return secrets.token_urlsafe(32)


class TokenGate:
    """ASGI middleware: the wrapped board answers a request carrying the token, nothing else.
    `headers`: added to its own answers (the board's security headers)."""

    def __init__(self, app: ASGIApp, token: str, *, secure: bool, headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
        self.app = app
        self.token = token.encode()
        self.secure = secure
        self.headers = list(headers)

    def _matches(self, offered: str | None) -> bool:
        # compare_digest on bytes: the time taken tells nothing of how much of the token matched.
        return offered is not None and hmac.compare_digest(offered.encode("utf-8", "surrogateescape"), self.token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan; hypercorn serves no websocket here
            await self.app(scope, receive, send)
            return
        headers = {name.lower(): value for name, value in scope.get("headers", [])}
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        offered = [value for name, value in query if name == QUERY]
        if offered:
            if len(offered) == 1 and self._matches(offered[0]):
                await self._enter(scope, [(name, value) for name, value in query if name != QUERY], send)
            else:
                await self._refuse(send)
            return
        authorization = headers.get(b"authorization", b"").decode("latin-1")
        if authorization.startswith("Bearer ") and self._matches(authorization.removeprefix("Bearer ")):
            await self.app(scope, receive, send)
            return
        if self._matches(_cookie(headers.get(b"cookie", b""))):
            await self.app(scope, receive, send)
            return
        await self._refuse(send)

    async def _enter(self, scope: Scope, rest: list[tuple[str, str]], send: Send) -> None:
        """The URL with the token: the cookie set, and on to the same address without the token."""
        location = scope.get("root_path", "") + scope["path"] + (f"?{urlencode(rest)}" if rest else "")
        cookie = f"{COOKIE}={self.token.decode()}; Path=/; HttpOnly; SameSite=Strict"
        cookie += "; Secure" if self.secure else ""
        await self._answer(send, 303, b"", [(b"location", location.encode()), (b"set-cookie", cookie.encode())])

    async def _refuse(self, send: Send) -> None:
        await self._answer(send, 401, _REFUSED, [(b"content-type", b"text/plain; charset=utf-8")])

    async def _answer(self, send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        extra = [(b"cache-control", b"no-store"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": [*headers, *extra, *self.headers]})
        await send({"type": "http.response.body", "body": body})


def _cookie(header: bytes) -> str | None:
    """The board's cookie in a Cookie header; None when absent or the header is not one."""
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(header.decode("latin-1"))
    except CookieError:
        return None
    morsel = jar.get(COOKIE)
    return None if morsel is None else morsel.value
