"""The shared framers: the same frames however the bytes break, bounded memory, honest offsets."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.framing import Line, LineFramer, Oversized, SseFramer

LIMIT = 64


def fed(framer: LineFramer, data: bytes, cuts: list[int]) -> list[Line | Oversized]:
    edges = [0, *sorted({cut for cut in cuts if 0 < cut < len(data)}), len(data)]
    frames = [frame for a, b in itertools.pairwise(edges) for frame in framer.receive_data(data[a:b])]
    tail = framer.end_of_data()
    return frames if tail is None else [*frames, tail]


lines = st.lists(st.binary(max_size=2 * LIMIT).map(lambda b: b.replace(b"\n", b"")), max_size=12)


@settings(max_examples=400, deadline=None)
@given(lines, st.booleans(), st.lists(st.integers(0, 2000), max_size=20), st.integers(0, 10**6))
def test_line_frames_and_their_offsets_do_not_depend_on_where_the_bytes_break(
    parts: list[bytes], terminated: bool, cuts: list[int], offset: int
) -> None:
    data = b"\n".join(parts) + (b"\n" if terminated and parts else b"")
    whole = fed(LineFramer(LIMIT, offset=offset, head_bytes=8), data, [])
    assert fed(LineFramer(LIMIT, offset=offset, head_bytes=8), data, cuts) == whole
    for frame in whole:
        if isinstance(frame, Line):
            assert len(frame.data) <= LIMIT
            assert data[frame.start - offset : frame.start - offset + len(frame.data)] == frame.data
        else:
            assert frame.limit == LIMIT
            assert data[frame.start - offset :].startswith(frame.head) and len(frame.head) == 8
    expected = [part if len(part) <= LIMIT else None for part in parts]
    if parts and not terminated and not parts[-1]:
        expected.pop()  # a stream that ends on its newline has no tail
    assert [frame.data if isinstance(frame, Line) else None for frame in whole] == expected


def test_an_oversized_frame_is_reported_once_at_its_end_and_never_held() -> None:
    framer = LineFramer(LIMIT, head_bytes=4)
    assert framer.receive_data(b"abcdefgh" * 20) == []
    assert framer.pending_bytes == 0 and framer.held_bytes == 4 and framer.mid_frame
    [report, line] = framer.receive_data(b"tail\nok\n")
    assert report == Oversized(LIMIT, 0, b"abcd") and line == Line(b"ok", 165)
    assert not framer.mid_frame


def test_a_partial_given_up_is_skipped_silently_to_its_newline() -> None:
    framer = LineFramer(LIMIT)
    assert framer.receive_data(b"half a fr") == []
    framer.discard_partial()  # the caller ran out of budget, and says so itself
    assert framer.receive_data(b"ame\nnext\n") == [Line(b"next", 13)]
    assert framer.end_of_data() is None


def test_the_tail_of_a_stream_is_a_frame_cut_short() -> None:
    framer = LineFramer(LIMIT)
    assert framer.receive_data(b"one\ntw") == [Line(b"one", 0)]
    assert framer.end_of_data() == Line(b"tw", 4)
    assert framer.end_of_data() is None


def sse(data: bytes, cuts: list[int]) -> list[bytes | Oversized]:
    framer = SseFramer(LIMIT)
    edges = [0, *sorted({cut for cut in cuts if 0 < cut < len(data)}), len(data)]
    events = [event for a, b in itertools.pairwise(edges) for event in framer.receive_data(data[a:b])]
    return events + framer.end_of_data()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"").replace(b"\r", b"")), max_size=8),
       st.lists(st.integers(0, 600), max_size=12), st.booleans())  # fmt: skip
def test_sse_events_do_not_depend_on_where_the_bytes_break(payloads: list[bytes], cuts: list[int], crlf: bool) -> None:
    end = b"\r\n" if crlf else b"\n"
    data = b"".join(b": comment" + end + b"data: " + payload + end + end for payload in payloads)
    events = sse(data, [])
    assert sse(data, cuts) == events
    assert events == [payload if len(payload) + 1 <= LIMIT else Oversized(LIMIT) for payload in payloads]


def test_an_sse_event_is_over_the_limit_as_a_whole_not_line_by_line() -> None:
    half = b"x" * (LIMIT // 2)
    assert sse(b"data: " + half + b"\ndata: " + half + b"\n\ndata: ok\n\n", []) == [Oversized(LIMIT), b"ok"]
    assert sse(b"data: a\ndata: b\n\n", []) == [b"a\nb"]
    assert sse(b"data: cut short", []) == [b"cut short"]  # the server closed mid-event
