"""The account a Claude seat's config states (issue 29): sans-I/O readers, bytes or an environment in,
`guard.account.Account` out. The launch plan (`launch.seat_account`) finds and reads the file.
"""

from __future__ import annotations

from collections.abc import Mapping

from guard.account import Account, account_key, id_text, json_object, label_of, plan_text

__all__ = ["claude_account", "claude_env_account"]


# The account a Claude seat's config states (issue 29): `$CLAUDE_CONFIG_DIR/.claude.json` (else
# `~/.claude.json`) `oauthAccount.accountUuid` with `organizationUuid`, else Claude's own env seeding.
#
# 2.1.250 and 2.1.332 send that `accountUuid` with every request and keep the stored `oauthAccount`
# (tests/live/test_accounts_live.py). An API-key seat states no account.


def claude_account(claude_json: bytes, where: str | None = None, plan: str | None = None) -> Account | None:
    """A Claude config dir's `.claude.json` -> the seat's account (`oauthAccount.accountUuid` with
    `organizationUuid`), or None (an API-key seat, or a file that is not Claude's). `plan`: the
    subscription the seat's credentials name (`subscriptionType`), when the caller read one."""
    config = json_object(claude_json)
    oauth = None if config is None else config.get("oauthAccount")
    if not isinstance(oauth, dict):
        return None
    account_uuid, organization_uuid = id_text(oauth.get("accountUuid")), id_text(oauth.get("organizationUuid"))
    if account_uuid is None or organization_uuid is None:
        return None
    key = account_key("claude", account_uuid, organization_uuid)
    return Account(key=key, label=label_of("claude", plan_text(plan), where))


def claude_env_account(env: Mapping[str, str], where: str | None = None, plan: str | None = None) -> Account | None:
    """Claude's own fallback: `CLAUDE_CODE_ACCOUNT_UUID`, `CLAUDE_CODE_ORGANIZATION_UUID` and
    `CLAUDE_CODE_USER_EMAIL` seed `oauthAccount` when the config stores none (2.1.250 and 2.1.332
    both require all three); the email is only a condition, never read into anything."""
    account_uuid = id_text(env.get("CLAUDE_CODE_ACCOUNT_UUID"))
    organization_uuid = id_text(env.get("CLAUDE_CODE_ORGANIZATION_UUID"))
    if account_uuid is None or organization_uuid is None or not env.get("CLAUDE_CODE_USER_EMAIL"):
        return None
    key = account_key("claude", account_uuid, organization_uuid)
    return Account(key=key, label=label_of("claude", plan_text(plan), where))
