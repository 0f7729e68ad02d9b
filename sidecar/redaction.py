"""A recording's redaction (`hctx wrap --record`, issue 40): what a session says stays in it.

A recording is offered to whoever reads a bug report, so by default it keeps only what the
decoders read for numbers, and the shape around it: every JSON string value is replaced by as many
`x` bytes as it had, except the values of the keys its harness's decoders read
(`HarnessSpec.recorded_strings`: `type`, `model`, ids, times, ...). Numbers, booleans, nulls,
object keys, brackets and whitespace stay as they were. No prompt, message, tool input or output,
file content, instruction text, email, token or key is under a key a decoder reads, so none is
recorded; `hctx wrap --record-raw` records the whole session instead.

The replacement keeps every byte's place: a line is as long as it was, a frame ends where it
ended, a line over a decoder's bound is still over it, a rollout's byte offsets are the file's. So
the redacted bytes frame exactly as the session's did, and each frame a decoder read carries the
same strings it read: the recording replays to the same records (tests/test_recording.py holds
every capture under fixtures/ to that). A redactor is a streaming lexer, one per recorded stream,
fed each chunk in order: a string that spans two chunks is redacted across them.

What is not JSON on a wire (a damaged line, an SSE comment) is replaced whole, up to the next line
(or, on a wire of whole messages, to the end of the message); bytes the recorder dropped (a gap)
leave the stream's redactor unsure where it is, so it replaces everything up to the next line or
message, where it knows again. A string is redacted whole or kept whole: the choice is made by the
key it is the value of (for an array's items, the key of the array).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, Literal

from sidecar.decoding import MessageDecoder, SseDecoder

if TYPE_CHECKING:
    from sidecar.spec import HarnessSpec

__all__ = [
    "FILLER",
    "KEY_BYTES",
    "MAX_DEPTH",
    "MAX_EMBEDDED_BYTES",
    "Framing",
    "Redactor",
    "redactors",
]

# A wire's framing, as its decoder frames it (sidecar.decoding): JSON lines, one JSON message a
# chunk (a websocket message, an HTTP answer's body), or a `text/event-stream`.
Framing = Literal["lines", "messages", "sse"]

FILLER: Final = ord("x")
# Deeper than a harness ever nests (a hostile `[[[[...`): the rest of the frame is replaced.
MAX_DEPTH: Final = 256
# An embedded JSON text longer than this is over every frame's bound (the channel's is 1 MiB).
MAX_EMBEDDED_BYTES: Final = 4 * 1024 * 1024
# A key longer than this is no key a decoder reads: remembered by this much only.
KEY_BYTES: Final = 128
_STRING_END: Final = re.compile(rb'["\\]')
_SPACE: Final = re.compile(rb"[ \t\r]+")
# A number's bytes (`-1.5e+3`), read on across a chunk's end: only `e` and `E` of all letters.
_NUMBER_START: Final = frozenset(b"-0123456789")
_NUMBER_BYTES: Final = frozenset(b"-+0123456789.eE")
_NUMBER: Final = re.compile(rb"[-+0-9.eE]+")
_LITERALS: Final = {ord("t"): b"true", ord("f"): b"false", ord("n"): b"null"}
_NEWLINE: Final = ord("\n")


class Redactor:
    """One recorded stream's redaction: `redact(chunk)` is the chunk as a redacted recording holds
    it, byte for byte as long. `kept`: the keys whose string values are recorded as they were."""

    def __init__(self, kept: frozenset[str], framing: Framing, embedded: frozenset[str] = frozenset()) -> None:
        self._kept = frozenset(key.encode() for key in kept)
        self._kept_names = kept
        self._embedded_keys = frozenset(key.encode() for key in embedded)
        self._framing = framing
        self._held = bytearray()  # an embedded string's bytes so far (None of them recorded yet)
        self._edits: list[tuple[int, int, bytes]] = []
        self._reset()
        self._sse_line_start = True
        self._sse_name = b""

    def _reset(self) -> None:
        # Each open container: its kind (`{` or `[`) and the key its string values are judged by.
        self._stack: list[tuple[int, bytes | None]] = []
        self._expect_key = False  # in an object, before a member's key
        self._in_string = False
        self._escaped = False
        self._keep = False  # the string being read is kept
        self._key: bytearray | None = None  # the key being read, when the string is one
        self._literal = b""  # the rest of a `true`/`false`/`null` being read
        self._in_number = False  # a number reached the end of the last chunk
        self._junk = False  # not JSON (or lost track): everything replaced until the next frame
        self._embedding = False  # the string being read is JSON text itself (a tap's stdout line)
        self._escape_cut = False
        self._held_from = 0

    def lost(self) -> None:
        """Bytes of this stream were not recorded: the next ones are replaced until a frame starts."""
        self._held.clear()
        self._reset()
        self._junk = True
        self._sse_line_start = False
        self._sse_name = b""

    def redact(self, data: bytes) -> bytes:
        out = bytearray(data)
        if self._framing == "messages":
            self._reset()  # each chunk is one whole message
        i, n = 0, len(data)
        self._held_from = 0
        while i < n:
            i = self._step(data, out, i, n)
        if self._embedding:  # held until the string ends: its bytes are recorded with that chunk
            self._hold(data, n)
            if self._framing == "messages" or len(self._held) > MAX_EMBEDDED_BYTES:
                self._give_up_embedded()  # a message cut inside it, or over any frame's bound
        if self._framing == "messages":
            self._reset()
        if not self._edits:
            return bytes(out)
        pieces: list[bytes] = []
        at = 0
        for start, end, replacement in self._edits:
            pieces += [bytes(out[at:start]), replacement]
            at = end
        self._edits.clear()
        return b"".join([*pieces, bytes(out[at:])])

    def _give_up_embedded(self) -> None:
        """The embedded string held is no JSON text to keep: recorded as as many `x`, and the rest of
        its frame too."""
        start, end, _ = self._edits[-1]
        self._edits[-1] = (start, end, bytes([FILLER]) * len(self._held))
        self._held.clear()
        self._embedding = False
        self._junk = True

    def _hold(self, data: bytes, end: int) -> None:
        self._held += data[self._held_from : end]
        self._edits.append((self._held_from, end, b""))
        self._held_from = end

    def _step(self, data: bytes, out: bytearray, i: int, n: int) -> int:
        """Redact from `data[i]` on, as far as one decision goes; the index it reached."""
        byte = data[i]
        if byte == _NEWLINE and self._framing != "messages":
            return self._newline(i)
        if self._framing == "sse" and self._sse_line_start:
            return self._sse_field(data, out, i)
        if self._junk:
            end = data.find(b"\n", i) if self._framing != "messages" else -1
            end = n if end < 0 else end
            out[i:end] = bytes([FILLER]) * (end - i)
            return end
        if self._embedding:
            return self._embedded(data, i, n)
        if self._in_string:
            return self._string(data, out, i, n)
        if self._literal:
            if byte == self._literal[0]:
                self._literal = self._literal[1:]
                return i + 1
            return self._not_json(out, i)
        if byte in _NUMBER_START or (self._in_number and byte in _NUMBER_BYTES):
            end = _NUMBER.match(data, i).end()  # type: ignore[union-attr]  # byte i is one
            self._in_number = end == n
            return end
        self._in_number = False
        space = _SPACE.match(data, i)
        if space is not None:
            return space.end()
        return self._structure(byte, out, i)

    def _newline(self, i: int) -> int:
        if self._framing == "lines" or self._junk or self._in_string:
            self._reset()  # a JSON line ends here (a newline in a string: the line was not JSON)
        elif self._framing == "sse" and self._sse_line_start:
            self._reset()  # a blank line ends an event
        self._sse_line_start = True
        self._sse_name = b""
        return i + 1

    def _sse_field(self, data: bytes, out: bytearray, i: int) -> int:
        """A `text/event-stream` line's start: its field name. Only `data`'s value is JSON to be
        read; any other line (a comment, `event:`, `id:`) is ignored by the framer and replaced whole,
        its name too (an `x` line is ignored as it was). A CR before the newline stays: a blank
        line ends an event."""
        byte = data[i]
        if byte == ord("\r") and not self._sse_name:
            return i + 1
        if byte == ord(":") and self._sse_name == b"data":
            self._sse_line_start = False
            return i + 1
        name = self._sse_name + bytes([byte])
        if b"data".startswith(name):
            self._sse_name = name  # a name may be cut by a chunk's end: judged by its whole
            return i + 1
        self._sse_line_start = False
        self._junk = True
        return i

    def _string(self, data: bytes, out: bytearray, i: int, n: int) -> int:
        if self._escaped:
            self._escaped = False
            self._hide(out, i, i + 1)
            return i + 1
        found = _STRING_END.search(data, i)
        end = n if found is None else found.start()
        self._hide(out, i, end)
        if end == n:
            return n
        if data[end] == ord("\\"):
            self._escaped = True
            self._hide(out, end, end + 1)
            return end + 1
        self._in_string = False
        if self._key is not None:
            self._stack[-1] = (ord("{"), bytes(self._key))
            self._key = None
        return end + 1

    def _embedded(self, data: bytes, i: int, n: int) -> int:
        """A string that is JSON text (Codex's stdout line in a tap frame): held whole, then
        recorded as that text redacted by the same keys, escaped again, and padded with spaces
        (which JSON reads past) to the length it had."""
        if self._escape_cut:  # the byte a backslash at the last chunk's end escaped
            self._escape_cut = False
            i += 1
        # A JSON string holds no raw newline: one ends the frame, and the string was no JSON.
        line_end = data.find(b"\n", i) if self._framing != "messages" else -1
        limit = n if line_end < 0 else line_end
        while True:
            found = _STRING_END.search(data, i, limit)
            if found is None:
                if line_end >= 0:
                    self._hold(data, line_end)
                    self._give_up_embedded()
                    return line_end
                return n
            if data[found.start()] == ord("\\"):
                i = found.start() + 2  # past the escaped byte
                if i > n:
                    self._escape_cut = True
                    return n
                continue
            break
        end = found.start()
        self._hold(data, end)
        self._edits[-1] = (self._edits[-1][0], end, self._redacted_text(bytes(self._held)))
        self._held.clear()
        self._embedding = False
        return end + 1

    def _redacted_text(self, held: bytes) -> bytes:
        try:
            text = json.loads(b'"' + held + b'"')
            inner = Redactor(self._kept_names, "messages").redact(text.encode("utf-8"))
            escaped = json.dumps(inner.decode("utf-8"), ensure_ascii=False)[1:-1].encode("utf-8")
        except (ValueError, UnicodeError):  # not a JSON string: nothing in it is kept
            return bytes([FILLER]) * len(held)
        if len(escaped) > len(held):  # never (the shortest escaping of less text), but never longer
            return bytes([FILLER]) * len(held)
        return escaped + b" " * (len(held) - len(escaped))

    def _hide(self, out: bytearray, start: int, end: int) -> None:
        if self._key is not None:
            if len(self._key) <= KEY_BYTES:
                self._key += out[start:end]
        elif not self._keep:
            out[start:end] = bytes([FILLER]) * (end - start)

    def _structure(self, byte: int, out: bytearray, i: int) -> int:
        top = self._stack[-1] if self._stack else None
        if byte == ord('"'):
            self._in_string = True
            if top is not None and top[0] == ord("{") and self._expect_key:
                self._key = bytearray()  # keys are the shape: kept, and remembered for their value
                self._expect_key = False
            elif top is not None and top[1] in self._embedded_keys:
                self._in_string, self._embedding, self._held_from = False, True, i + 1
            else:
                self._keep = top is not None and top[1] in self._kept
            return i + 1
        if byte in (ord("{"), ord("[")):
            if len(self._stack) >= MAX_DEPTH:
                return self._not_json(out, i)
            self._stack.append((byte, None if top is None else top[1]))
            self._expect_key = byte == ord("{")
            return i + 1
        if byte in (ord("}"), ord("]")):
            if top is None:
                return self._not_json(out, i)
            self._stack.pop()
            self._expect_key = False
            return i + 1
        if byte == ord(","):
            self._expect_key = top is not None and top[0] == ord("{")
            return i + 1
        if byte == ord(":"):
            return i + 1
        literal = _LITERALS.get(byte)
        if literal is not None:
            self._literal = literal[1:]
            return i + 1
        return self._not_json(out, i)

    def _not_json(self, out: bytearray, i: int) -> int:
        self._reset()
        self._junk = True
        return i


def redactors(spec: HarnessSpec) -> Callable[[str], Redactor]:
    """A fresh redactor for one stream of a wire of `spec`'s harness: framed as the wire's decoder
    frames it, keeping the strings the harness's decoders read."""

    def redactor(wire: str) -> Redactor:
        decoder = spec.decoder(wire)
        framing: Framing = (
            "messages" if isinstance(decoder, MessageDecoder) else "sse" if isinstance(decoder, SseDecoder) else "lines"
        )
        return Redactor(spec.recorded_strings, framing, spec.recorded_json_strings)

    return redactor
