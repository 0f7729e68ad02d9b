"""The one JSON rule every decoder applies to the bytes a harness sent.

RFC 8259 JSON in strict UTF-8: `NaN` and `Infinity` are not numbers a harness reported (no harness
emits them: JavaScript's `JSON.stringify` writes `null`, serde refuses), so a frame carrying one
anywhere, even in a field hctx never reads, is malformed as a whole, on every path alike.
"""

from __future__ import annotations

import json
from typing import Any

from guard.errors import MalformedFrame
from guard.record import refuse_json_constant

__all__ = [
    "json_object",
    "loads",
]

_REASON_CHARS = 120


def loads(data: bytes) -> object:
    """The JSON value `data` holds; MalformedFrame says why it holds none."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedFrame(f"not UTF-8: {exc.reason} at byte {exc.start}") from None
    try:
        value: object = json.loads(text, parse_constant=refuse_json_constant)
    except RecursionError:
        raise MalformedFrame("malformed JSON: nested too deep") from None
    except ValueError as exc:
        raise MalformedFrame(f"malformed JSON: {str(exc)[:_REASON_CHARS]}") from None
    return value


def json_object(data: bytes) -> dict[str, Any]:
    """The JSON object `data` holds; MalformedFrame for any other value."""
    value = loads(data)
    if not isinstance(value, dict):
        raise MalformedFrame(f"not a JSON object but {type(value).__name__}")
    return value
