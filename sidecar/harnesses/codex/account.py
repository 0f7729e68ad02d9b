"""The account a Codex seat's own login states (issue 29), read from `$CODEX_HOME/auth.json`: sans-I/O,
bytes in, `guard.account.Account` out. The launch plan (`launch.seat_account`) reads the file.
"""

from __future__ import annotations

import base64
from typing import Any

from guard.account import Account, account_key, id_text, json_object, label_of, plan_text

__all__ = ["codex_account"]


# The account a Codex seat's own login states (issue 29): `$CODEX_HOME/auth.json` `tokens.account_id`
# with the id token's `chatgpt_user_id`.
#
# `account_id` is a ChatGPT workspace: a Team workspace holds several people, so it is keyed with the
# user, as Codex itself compares the two. 0.171.0's `account/read` states the same pair
# (`workspaceRouting.chatgptAccountId`, `userId`); 0.151.0's states no id at all
# (tests/live/test_accounts_live.py, fixtures/accounts/). An API-key login states no account.


def _jwt_claims(token: object) -> dict[str, Any]:
    """The payload of a JWT, unverified (Codex does not verify it either); {} when it is none."""
    if not isinstance(token, str) or token.count(".") != 2 or len(token) > 64 * 1024:
        return {}
    payload = token.split(".")[1]
    try:
        decoded = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
    except ValueError:
        return {}
    return json_object(decoded) or {}


def codex_account(auth_json: bytes, where: str | None = None) -> Account | None:
    """`$CODEX_HOME/auth.json` -> the seat's account, or None (an API key, no ChatGPT user id, or a
    file that is not Codex's). `where` (the config directory as the user knows it) joins the label."""
    auth = json_object(auth_json)
    tokens = None if auth is None else auth.get("tokens")
    if not isinstance(tokens, dict):
        return None
    claims = _jwt_claims(tokens.get("id_token"))
    profile = claims.get("https://api.openai.com/auth")
    profile = profile if isinstance(profile, dict) else {}
    account_id = id_text(tokens.get("account_id")) or id_text(profile.get("chatgpt_account_id"))
    user_id = id_text(profile.get("chatgpt_user_id")) or id_text(profile.get("user_id"))
    if account_id is None or user_id is None:
        return None  # a workspace alone would merge every seat of a Team workspace
    plan = plan_text(profile.get("chatgpt_plan_type"))
    return Account(key=account_key("codex", account_id, user_id), label=label_of("chatgpt", plan, where))
