"""A fake ChatGPT backend on 127.0.0.1 for the account live tests (../shared/lab/accounts.md recipe).

Codex logged in with ChatGPT (`auth.json` `auth_mode: chatgpt`, unsigned JWTs: Codex does not verify
them) talks to `chatgpt_base_url` for its account and usage, and on 0.151.0 sends its turns to
`openai_base_url`:

- `GET …/wham/accounts/check` (0.171.0 before `account/read` or a turn): the workspace, with the
  https origin 0.171.0 insists on (it then routes ChatGPT turns there, which no loopback fake serves);
- `GET …/wham/usage`: the account's windows, per `chatgpt-account-id` header (`usage`);
- `POST …/responses`: a turn, answered by `FakeResponses` with the `x-codex-*` headers the real
  service sends.

`seat_auth_json` writes the fake login: the ids Codex keys an account on, and nothing real.
"""

from __future__ import annotations

import base64
import datetime
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import h11
import trio

from tests.fakes.codex_model import FakeResponses, serve_responses
from tests.fakes.http11 import LOOPBACK, reply_json, serving

USAGE_RESET_AFTER_S = 3600


@dataclass
class FakeChatGPT:
    responses: FakeResponses = field(default_factory=FakeResponses)
    # chatgpt-account-id -> (primary %, secondary %) that `wham/usage` reports
    usage: dict[str, tuple[int, int]] = field(default_factory=dict)
    port: int = 0
    paths: list[tuple[str, str, str | None]] = field(default_factory=list)  # method, path, account header

    @property
    def base_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}/backend-api/"


def _usage_body(account_id: str, primary: int, secondary: int) -> dict[str, Any]:
    now = int(time.time())

    def window(percent: int, seconds: int, reset_after: int) -> dict[str, Any]:
        return {"used_percent": percent, "limit_window_seconds": seconds, "reset_after_seconds": reset_after,
                "reset_at": now + reset_after}  # fmt: skip

    return {
        "plan_type": "pro", "account_id": account_id,
        "rate_limit": {"allowed": True, "limit_reached": False,
                       "primary_window": window(primary, 18_000, USAGE_RESET_AFTER_S),
                       "secondary_window": window(secondary, 604_800, 4 * 86_400)},
        "credits": None, "additional_rate_limits": None,
    }  # fmt: skip


async def _serve(server: FakeChatGPT, conn: h11.Connection, stream: trio.SocketStream, request: h11.Request,
                 body: bytes) -> None:  # fmt: skip
    path = request.target.decode("latin-1").split("?")[0]
    headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in request.headers}
    account = headers.get("chatgpt-account-id")
    server.paths.append((request.method.decode(), path, account))
    if path.endswith("/wham/accounts/check"):
        accounts = [{"id": account or "", "name": "Fake WS", "workspace_backend_origin": "https://chatgpt.com",
                     "account_routing_override": "NO_CONSTRAINT"}]  # fmt: skip
        await reply_json(conn, stream, 200, {"accounts": accounts, "account_ordering": [account or ""]})
    elif path.endswith("/wham/usage"):
        primary, secondary = server.usage.get(account or "", (0, 0))
        await reply_json(conn, stream, 200, _usage_body(account or "", primary, secondary))
    elif request.method == b"POST" and path.endswith("/responses"):
        await serve_responses(server.responses, conn, stream, request, body)
    elif headers.get("upgrade", "").lower() == "websocket":
        await reply_json(conn, stream, 426, {"detail": "no websocket here"})
    else:
        await reply_json(conn, stream, 404, {"detail": f"no route {request.method.decode()} {path}"})


@asynccontextmanager
async def fake_chatgpt() -> AsyncIterator[FakeChatGPT]:
    server = FakeChatGPT()
    async with serving(partial(_serve, server)) as port:
        server.port = server.responses.port = port
        yield server


def _b64(value: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


def fake_jwt(claims: dict[str, Any]) -> str:
    """An unsigned JWT (`alg: none`) with a non-empty signature segment, as Codex accepts."""
    return f"{_b64({'alg': 'none', 'typ': 'JWT'})}.{_b64(claims)}.fake-signature"


def seat_auth_json(account_id: str, user_id: str, email: str, plan: str = "pro") -> str:
    """`$CODEX_HOME/auth.json` of a fake ChatGPT login; `last_refresh` now, so Codex refreshes nothing."""
    profile = {"chatgpt_account_id": account_id, "chatgpt_user_id": user_id, "user_id": user_id,
               "chatgpt_plan_type": plan}  # fmt: skip
    claims = {"email": email, "exp": int(time.time()) + 30 * 86_400, "https://api.openai.com/auth": profile}
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    tokens = {"id_token": fake_jwt(claims), "access_token": fake_jwt(claims), "refresh_token": "rt-fake",
              "account_id": account_id}  # fmt: skip
    return json.dumps({"auth_mode": "chatgpt", "OPENAI_API_KEY": None, "tokens": tokens, "last_refresh": stamp})


def chatgpt_config(base_url: str) -> str:
    """CODEX_HOME/config.toml for a ChatGPT login against this fake (the lab's keys)."""
    return f"""\
model = "gpt-5.1-codex"
chatgpt_base_url = "{base_url}"
openai_base_url = "{base_url}codex"
cli_auth_credentials_store = "file"
approval_policy = "never"
sandbox_mode = "read-only"
check_for_update_on_startup = false
"""
