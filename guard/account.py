"""The account an agent's rate limits belong to (issue 29), as the harness itself states it.

A record names its account by an opaque `key`, a digest of the ids the harness keys its own
login on, and a short `label` a person recognises (plan, config directory). Never an email, a
name or a token: the ids go into the digest and nowhere else. Where nothing states an account the
record's `account` is null and the agent is its own group; nothing here guesses one from a model
name or a provider.

The ids, per harness (../shared/lab/accounts.md, verified live in tests/live/test_accounts_live.py):

- Codex: `$CODEX_HOME/auth.json` `tokens.account_id` with the id token's `chatgpt_user_id` (the
  same pair 0.171.0's `account/read` states as `workspaceRouting.chatgptAccountId` and `userId`).
  `account_id` is a ChatGPT workspace: a Team workspace holds several people, so it is keyed with
  the user, as Codex itself compares the two. An API-key login states no account.
- Claude: `$CLAUDE_CONFIG_DIR/.claude.json` (else `~/.claude.json`) `oauthAccount.accountUuid`
  with `organizationUuid`. An API-key seat states no account.

The parsers are sans-I/O (bytes in), so the wrapper, the sidecar and the tests share them.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
from collections.abc import Mapping
from typing import Annotated, Any, Final

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

__all__ = [
    "ACCOUNT_FILE_MAX_BYTES",
    "ACCOUNT_KEY_PATTERN",
    "LABEL_MAX_CHARS",
    "Account",
    "account_key",
    "claude_account",
    "claude_env_account",
    "clean_label",
    "codex_account",
    "read_account_file",
    "shown_dir",
]

# 128 bits of sha256, hex: opaque, fixed-width, and a Prometheus label value as it is.
ACCOUNT_KEY_PATTERN: Final = r"^[0-9a-f]{32}$"
# A label is for a column: a longer one (a hostile 10 kB) is cut, never a reason to refuse a record.
LABEL_MAX_CHARS: Final = 64
# Logins and configs are a few kB (a `.claude.json` with many projects more); a larger file is not read.
ACCOUNT_FILE_MAX_BYTES: Final = 4 * 1024 * 1024
# An id longer than this is not one a harness issued (UUIDs, `acct-…`, `user-…` are tens of chars).
_ID_MAX_CHARS: Final = 256


def account_key(kind: str, *ids: str) -> str:
    """The opaque key of one account: its ids, NUL-separated after the family they belong to
    (so a Codex id and a Claude id that happen to be equal never share a key)."""
    digest = hashlib.sha256("\0".join((kind, *ids)).encode("utf-8", "surrogatepass"))
    return digest.hexdigest()[:32]


def clean_label(value: object) -> str | None:
    """A label as it may be shown: text only, control characters replaced by `?`, at most
    LABEL_MAX_CHARS (cut with `…`); anything but a non-empty string is no label."""
    if not isinstance(value, str):
        return None
    text = "".join(char if char.isprintable() else "?" for char in value[: LABEL_MAX_CHARS * 4])
    text = " ".join(text.split())
    if len(text) > LABEL_MAX_CHARS:
        text = text[: LABEL_MAX_CHARS - 1] + "…"
    return text or None


Label = Annotated[str | None, BeforeValidator(clean_label)]


class Account(BaseModel):
    """The record's `account`: `{"key": "<32 hex>", "label": "chatgpt pro · ~/.codex"}`."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    key: Annotated[str, Field(pattern=ACCOUNT_KEY_PATTERN, strict=True)]
    label: Label = None


def _id(value: object) -> str | None:
    if isinstance(value, str) and 0 < len(value) <= _ID_MAX_CHARS and value.isprintable():
        return value
    return None


def _json_object(data: bytes) -> dict[str, Any] | None:
    try:
        raw = json.loads(data)
    except (ValueError, RecursionError):
        return None
    return raw if isinstance(raw, dict) else None


def _jwt_claims(token: object) -> dict[str, Any]:
    """The payload of a JWT, unverified (Codex does not verify it either); {} when it is none."""
    if not isinstance(token, str) or token.count(".") != 2 or len(token) > 64 * 1024:
        return {}
    payload = token.split(".")[1]
    try:
        decoded = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
    except ValueError:
        return {}
    return _json_object(decoded) or {}


def _plan(value: object) -> str | None:
    """A plan's name (`pro`, `max`, `team`) is a short word; anything else is not shown."""
    return value if isinstance(value, str) and value.replace("_", "").isalnum() and len(value) <= 24 else None


def _label(*parts: str | None) -> str | None:
    return clean_label(" · ".join(part for part in parts if part))


def codex_account(auth_json: bytes, where: str | None = None) -> Account | None:
    """`$CODEX_HOME/auth.json` -> the seat's account, or None (an API key, no ChatGPT user id, or a
    file that is not Codex's). `where` (the config directory as the user knows it) joins the label."""
    auth = _json_object(auth_json)
    tokens = None if auth is None else auth.get("tokens")
    if not isinstance(tokens, dict):
        return None
    claims = _jwt_claims(tokens.get("id_token"))
    profile = claims.get("https://api.openai.com/auth")
    profile = profile if isinstance(profile, dict) else {}
    account_id = _id(tokens.get("account_id")) or _id(profile.get("chatgpt_account_id"))
    user_id = _id(profile.get("chatgpt_user_id")) or _id(profile.get("user_id"))
    if account_id is None or user_id is None:
        return None  # a workspace alone would merge every seat of a Team workspace
    plan = _plan(profile.get("chatgpt_plan_type"))
    return Account(key=account_key("codex", account_id, user_id), label=_label("chatgpt", plan, where))


def claude_account(claude_json: bytes, where: str | None = None, plan: str | None = None) -> Account | None:
    """A Claude config dir's `.claude.json` -> the seat's account (`oauthAccount.accountUuid` with
    `organizationUuid`), or None (an API-key seat, or a file that is not Claude's). `plan`: the
    subscription the seat's credentials name (`subscriptionType`), when the caller read one."""
    config = _json_object(claude_json)
    oauth = None if config is None else config.get("oauthAccount")
    if not isinstance(oauth, dict):
        return None
    account_uuid, organization_uuid = _id(oauth.get("accountUuid")), _id(oauth.get("organizationUuid"))
    if account_uuid is None or organization_uuid is None:
        return None
    key = account_key("claude", account_uuid, organization_uuid)
    return Account(key=key, label=_label("claude", _plan(plan), where))


def claude_env_account(env: Mapping[str, str], where: str | None = None, plan: str | None = None) -> Account | None:
    """Claude's own fallback: `CLAUDE_CODE_ACCOUNT_UUID`, `CLAUDE_CODE_ORGANIZATION_UUID` and
    `CLAUDE_CODE_USER_EMAIL` seed `oauthAccount` when the config stores none (2.1.250 and 2.1.332
    both require all three); the email is only a condition, never read into anything."""
    account_uuid = _id(env.get("CLAUDE_CODE_ACCOUNT_UUID"))
    organization_uuid = _id(env.get("CLAUDE_CODE_ORGANIZATION_UUID"))
    if account_uuid is None or organization_uuid is None or not env.get("CLAUDE_CODE_USER_EMAIL"):
        return None
    key = account_key("claude", account_uuid, organization_uuid)
    return Account(key=key, label=_label("claude", _plan(plan), where))




def read_account_file(path: str) -> bytes | None:
    """The bytes of a harness's login or config file; None when absent, unreadable, not a regular
    file or larger than ACCOUNT_FILE_MAX_BYTES (then no account is stated, and nothing fails)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > ACCOUNT_FILE_MAX_BYTES:
            return None
        return os.read(fd, ACCOUNT_FILE_MAX_BYTES + 1)[:ACCOUNT_FILE_MAX_BYTES]
    except OSError:
        return None
    finally:
        os.close(fd)


def shown_dir(path: str, home: str | None = None) -> str:
    """A config directory as its user knows it: under the home directory as `~/…`."""
    home = os.path.expanduser("~") if home is None else home
    if home and home != "/" and (path == home or path.startswith(home.rstrip("/") + "/")):
        return "~" + path[len(home.rstrip("/")) :]
    return path
