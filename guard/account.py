"""The account an agent's rate limits belong to (issue 29), as the harness itself states it.

A record names its account by an opaque `key`, a digest of the ids the harness keys its own
login on, and a short `label` a person recognises (plan, config directory). Never an email, a
name or a token: the ids go into the digest and nowhere else. Where nothing states an account the
record's `account` is null and the agent is its own group; nothing guesses one from a model name
or a provider. Which ids a harness keys on is its launch plan's (`sidecar.harnesses.<name>.account`, a sans-I/O parser
of the harness's own file, read when the launch is planned); this is what they share.
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import Annotated, Any, Final

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from guard.errors import JsonRefused
from guard.files import read_bounded
from guard.json_rule import loads_object

__all__ = [
    "ACCOUNT_FILE_MAX_BYTES",
    "ACCOUNT_KEY_PATTERN",
    "EMAIL_SHOWN",
    "LABEL_MAX_CHARS",
    "Account",
    "Label",
    "account_key",
    "clean_label",
    "id_text",
    "json_object",
    "label_of",
    "plan_text",
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
    (so two harnesses' ids that happen to be equal never share a key)."""
    digest = hashlib.sha256("\0".join((kind, *ids)).encode("utf-8", "surrogatepass"))
    return digest.hexdigest()[:32]


# A path component (or word) holding an `@`: an email, whole or in part (`~/.claude-alice@example.com`).
_EMAILISH: Final = re.compile(r"[^\s/\\·]*@[^\s/\\·]*")
EMAIL_SHOWN: Final = "(email)"


def clean_label(value: object) -> str | None:
    """A label as it may be shown: text only, control characters replaced by `?`, any word or path
    component holding an `@` replaced by `(email)` (a config directory named after its login is
    never an email in a record), at most LABEL_MAX_CHARS (cut with `…`); anything but a non-empty
    string is no label."""
    if not isinstance(value, str):
        return None
    # Whole, before cutting: an email cut in half by the length bound would still be half an email.
    value = _EMAILISH.sub(EMAIL_SHOWN, value[: LABEL_MAX_CHARS * 4 + 256])
    text = "".join(char if char.isprintable() else "?" for char in value[: LABEL_MAX_CHARS * 4])
    text = " ".join(text.split())
    if len(text) > LABEL_MAX_CHARS:
        text = text[: LABEL_MAX_CHARS - 1] + "…"
    return text or None


Label = Annotated[str | None, BeforeValidator(clean_label)]


class Account(BaseModel):
    """The record's `account`: `{"key": "<32 hex>", "label": "claude · max · ~/.claude-work"}`."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    key: Annotated[str, Field(pattern=ACCOUNT_KEY_PATTERN, strict=True)]
    label: Label = None


def id_text(value: object) -> str | None:
    if isinstance(value, str) and 0 < len(value) <= _ID_MAX_CHARS and value.isprintable():
        return value
    return None


def json_object(data: bytes) -> dict[str, Any] | None:
    """A login or config file's object, read by the one JSON rule (guard.json_rule); None otherwise."""
    try:
        return loads_object(data)
    except JsonRefused:
        return None


def plan_text(value: object) -> str | None:
    """A plan's name (`pro`, `max`, `team`) is a short word; anything else is not shown."""
    return value if isinstance(value, str) and value.replace("_", "").isalnum() and len(value) <= 24 else None


def label_of(*parts: str | None) -> str | None:
    return clean_label(" · ".join(part for part in parts if part))


def read_account_file(path: str) -> bytes | None:
    """The bytes of a harness's login or config file; None when absent, unreadable, not a regular
    file or larger than ACCOUNT_FILE_MAX_BYTES (then no account is stated, and nothing fails)."""
    return read_bounded(None, path, ACCOUNT_FILE_MAX_BYTES).data


def shown_dir(path: str, home: str | None = None) -> str:
    """A config directory as its user knows it: under the home directory as `~/…`."""
    home = os.path.expanduser("~") if home is None else home
    if home and home != "/" and (path == home or path.startswith(home.rstrip("/") + "/")):
        return "~" + path[len(home.rstrip("/")) :]
    return path
