"""Claude's frames on the sidecar's channel: what the tee sends and the Claude decoder reads.

Its own module, importing nothing but C modules, so the tee (which Claude spawns every few
seconds) and the sidecar's Claude decoder share these definitions without either paying for the
other's imports: the tee's sockets and select stay out of the sidecar, the sidecar's JSON and
pydantic out of the tee.
"""

__all__ = [
    "HOOK_FRAME",
    "HOOK_TYPE",
    "MAX_RECORDED_BYTES",
    "STATUSLINE_FRAME",
    "STATUSLINE_TYPE",
    "SUBAGENT_STATUSLINE_FRAME",
    "SUBAGENT_STATUSLINE_TYPE",
    "channel_line",
    "load_json",
    "unwrap",
]

# The channel frames' types, defined here only, and the envelope each is sent in.
STATUSLINE_TYPE = "claude.statusline"
HOOK_TYPE = "claude.hook"
# Issue 37: the payload Claude hands its `subagentStatusLine` command (`tasks[]`, one row a subagent).
SUBAGENT_STATUSLINE_TYPE = "claude.subagentstatusline"
STATUSLINE_FRAME = b'{"type":"' + STATUSLINE_TYPE.encode() + b'","payload":'
HOOK_FRAME = b'{"type":"' + HOOK_TYPE.encode() + b'","payload":'
SUBAGENT_STATUSLINE_FRAME = b'{"type":"' + SUBAGENT_STATUSLINE_TYPE.encode() + b'","payload":'
_FRAME_END = b"}\n"
# The sidecar's channel drops lines over 1 MiB; a payload that large is not Claude's anyway.
MAX_RECORDED_BYTES = 1024 * 1024 - 64
_JSON_SPACE = b" \t\r\n"


# --- JSON without the json package -------------------------------------------------------------


class _Strict:
    """The context `_json.make_scanner` reads: plain JSON, no NaN/Infinity, no hooks."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int

    @staticmethod
    def parse_constant(name: str) -> object:
        raise ValueError(f"{name} is not JSON")


def load_json(text: str) -> object:
    """One JSON value filling `text`; ValueError otherwise.

    The one JSON rule (`guard.json_rule`, which the tee does not import for its start-up time) on
    text already strictly decoded: no NaN/Infinity, no lone surrogate, never a RecursionError.
    tests/test_json_rule.py holds the two equal."""
    try:
        import _json

        scan = _json.make_scanner(_Strict)  # type: ignore[arg-type]  # it reads only these attributes
    except (ImportError, AttributeError):  # an interpreter without the C scanner
        import json

        try:
            value = json.loads(text, parse_constant=_Strict.parse_constant)
        except RecursionError:
            raise ValueError("nested too deeply") from None
    else:
        body = text.strip(" \t\r\n")
        try:
            value, end = scan(body, 0)
        except StopIteration:
            raise ValueError("not JSON") from None
        except RecursionError:
            raise ValueError("nested too deeply") from None
        if end != len(body):
            raise ValueError("trailing data after the JSON value")
    if "\\u" in text and _holds_surrogate(value):
        raise ValueError("a lone surrogate is not text")
    return value


def _holds_surrogate(value: object) -> bool:
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if any("\ud800" <= char <= "\udfff" for char in item):
                return True
        elif isinstance(item, dict):
            pending += item.keys()
            pending += item.values()
        elif isinstance(item, list):
            pending += item
    return False


def _object_bytes(data: bytes) -> bytes | None:
    """`data` as one line if it is exactly one JSON object; the channel is line-delimited."""
    try:
        value = load_json(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(value, dict):
        return None
    # In valid JSON a raw CR or LF can only be whitespace between tokens.
    return data.strip(_JSON_SPACE).replace(b"\n", b" ").replace(b"\r", b" ")


# --- the channel line ----------------------------------------------------------------------


def channel_line(prefix: bytes, data: bytes) -> bytes:
    """The one channel line the tee sends for stdin `data` in the envelope `prefix` opens
    (STATUSLINE_FRAME, SUBAGENT_STATUSLINE_FRAME or HOOK_FRAME); ValueError says why `data` is not sent at all.

    `hctx replay` builds a Claude capture's channel bytes with this very function, so a recorded
    payload reaches the sidecar's decoder exactly as the tee would have sent it.
    """
    if len(data) > MAX_RECORDED_BYTES:
        raise ValueError(f"payload of {len(data)} bytes is too large to record")
    payload = _object_bytes(data)
    if payload is None:
        raise ValueError("stdin is not one JSON object: not recorded")
    return prefix + payload + _FRAME_END


def unwrap(line: bytes) -> tuple[str, bytes] | None:
    """The inverse of `channel_line`: (entry point, the payload it was sent for) of one of the
    tee's lines, or None for a line it did not build. The payload sent again builds the same line
    (its normalisation is idempotent): `hctx demo` plays a recording back through the real tee."""
    frames = (("statusline", STATUSLINE_FRAME), ("subagentstatusline", SUBAGENT_STATUSLINE_FRAME), ("hook", HOOK_FRAME))
    for entry, prefix in frames:
        if line.startswith(prefix) and line.endswith(_FRAME_END):
            return entry, line[len(prefix) : -len(_FRAME_END)]
    return None
