"""The one JSON rule: how every bytes-to-object step in hctx reads JSON.

Records, claims, watch state, channel frames, app-server messages, SSE events, transcript lines,
a transport's config and the model table all go through `loads`. The rule is RFC 8259 in strict
UTF-8, and nothing that RFC leaves to a parser's taste:
- not UTF-8 (UTF-16, UTF-32, a stray byte): refused — `json.loads` on bytes would detect UTF-16;
- a byte-order mark: refused — RFC 8259 forbids writing one and no harness does, `json.loads`
  would skip it on bytes and refuse it on text;
- a NUL: refused with its own reason — it is how UTF-16 without a BOM reads as UTF-8;
- `NaN`, `Infinity`: refused — not JSON numbers, and no harness emits them (JavaScript's
  `JSON.stringify` writes `null`, serde refuses them), so a value carrying one anywhere is
  malformed as a whole, even in a field hctx never reads;
- a lone surrogate (`"\\ud800"`, a key or a value): refused — no UTF-8 text holds it, and a
  reader that prints it fails;
- nesting too deep for the interpreter: refused, never a RecursionError.

Callers name the exception they raise (`error=`), so a refusal is a `RecordRefused` where a record
is read and a `MalformedFrame` where a frame is; the message is the rule's own, the same everywhere.
The Claude tee keeps a stdlib copy of the rule for its start-up time
(`sidecar.harnesses.claude.frames.load_json`), tested equal to this one (tests/test_json_rule.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from guard.errors import JsonRefused

__all__ = [
    "holds_lone_surrogate",
    "loads",
    "loads_object",
    "strings_of",
]

_REASON_CHARS = 120
# A backslash-u escape of a surrogate: only such a text can hold a lone one once parsed, so the walk
# runs only when one is spelled.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_LONE_SURROGATE = "holds a lone surrogate (\\ud800-\\udfff), which is not text"


def _refuse_constant(name: str) -> float:
    raise JsonRefused(f"{name} is not a JSON number")  # through json.loads, which lets it out


def loads(data: bytes | str, *, error: type[Exception] = JsonRefused) -> object:
    """The JSON value `data` holds; `error` (with the rule's reason) when it holds none."""
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise error(f"not UTF-8: {exc.reason} at byte {exc.start} (UTF-16 and UTF-32 are refused)") from None
    else:
        text = data
        if _SURROGATE.search(text):  # a str can hold one raw (surrogateescape); bytes cannot
            raise error(_LONE_SURROGATE)
    if text.startswith("\ufeff"):
        raise error("starts with a byte-order mark (JSON is UTF-8 without one)")
    if "\x00" in text:
        raise error("holds NUL bytes: UTF-16 or UTF-32, not UTF-8 JSON")
    try:
        value: object = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise error("malformed JSON: nested too deep") from None
    except ValueError as exc:  # JsonRefused from _refuse_constant too
        raise error(f"malformed JSON: {str(exc)[:_REASON_CHARS]}") from None
    if _SURROGATE_ESCAPE.search(text) and holds_lone_surrogate(value):
        raise error(_LONE_SURROGATE)
    return value


def loads_object(data: bytes | str, *, error: type[Exception] = JsonRefused) -> dict[str, Any]:
    """The JSON object `data` holds; `error` for any other value."""
    value = loads(data, error=error)
    if not isinstance(value, dict):
        raise error(f"not a JSON object but {type(value).__name__}")
    return value


def holds_lone_surrogate(value: object) -> bool:
    """Whether any string of a parsed value, key or value, at any depth, holds a surrogate."""
    return any(_SURROGATE.search(text) for text in strings_of(value))


def strings_of(value: object) -> Iterator[str]:
    """Every string of a parsed value, keys included, at any depth. A walk with its own stack: a
    value as deep as `json.loads` allows is deeper than a recursive check (or `json.dumps`) may go."""
    pending: list[object] = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            pending += item.keys()
            pending += item.values()
        elif isinstance(item, list):
            pending += item
