"""The harness's stdout tap, for a harness that speaks on stdout (an app-server on stdio): a copy of
its stdout to the wrapper's, each line sent to the sidecar on the side (`Tap`). Part of the
resident: the standard library only, on its loop.
"""

from __future__ import annotations

import os

from wrapper.launch.loop import READ, WRITE, Loop, suppress

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: the typing module is not worth its import here
    from collections.abc import Callable
    from typing import Any

__all__ = ["TAP_QUEUE_BYTES", "TAP_RECONNECT_S", "Tap", "TapQueue", "run_tap"]

TAP_QUEUE_BYTES = 4 * 1024 * 1024
TAP_RECONNECT_S = 0.5


class TapQueue:
    """Tapped lines owed to the sidecar, bounded in bytes; when full, the oldest give way."""

    def __init__(self, where: str) -> None:
        import collections  # a tapped harness only

        self.where = where  # the drop report's `where`
        self.lines: collections.deque[bytes] = collections.deque()
        self.size = 0
        self.dropped = 0  # lines that gave way (or were lost with the sidecar) since the last report

    def put(self, line: bytes) -> None:
        self.lines.append(line)
        self.size += len(line)
        while self.size > TAP_QUEUE_BYTES:
            self.size -= len(self.lines.popleft())
            self.dropped += 1

    def __bool__(self) -> bool:
        return bool(self.lines or self.dropped)

    def take(self) -> tuple[bytes, int]:
        """Everything queued in one batch, led by a drop report when lines gave way; and how many
        lines the batch carries, to count them if it is lost."""
        import json  # a tapped harness only

        from guard.constants import CHANNEL_DROP_REPORT

        report = b""
        if self.dropped:
            frame = {"type": CHANNEL_DROP_REPORT, "where": self.where, "count": self.dropped}
            report = json.dumps(frame).encode() + b"\n"
        batch, count = report + b"".join(self.lines), len(self.lines) + self.dropped
        self.lines.clear()
        self.size = self.dropped = 0
        return batch, count


class Tap:
    """Copy the harness's stdout to ours untouched; send each line to the sidecar on the side.

    Lines are framed by the sidecar's own `LineFramer` at the channel's limit, and each goes as the
    harness's tap frame (its spec's `tap_frame`, named `module:name` by the launch: the line's very
    bytes; that harness's module brings its decoding along, so a tapped resident costs more), so
    the sidecar decodes exactly the bytes a replay of the same stdout does. The copy never waits on
    the sidecar: tapped lines queue up to TAP_QUEUE_BYTES, and past that the oldest give way, so
    after a burst (thousands of deltas) the newest lines, the usage update among them, still go.
    What gave way is counted and reported to the sidecar, which logs it. A line over the limit, or
    one whose frame would be (the sidecar refuses those on every wire), is not sent.

    When the sidecar is gone, its channel is tried again (a sidecar started again listens on the
    same path) while the queue keeps the newest lines. Nothing is printed here: a write to a stderr
    nobody drains would stall the copy, and the wrapper already says when its sidecar died; the
    lines lost meanwhile reach the sidecar's log as a drop report.
    """

    def __init__(
        self, loop: Loop, source: int, frame: str, channel: str, out: int = 1, where: str = "stdout tap"
    ) -> None:
        import socket

        from guard.constants import CHANNEL_MAX_FRAME_BYTES
        from sidecar.framing import LineFramer

        self._socket_module = socket
        self.loop, self.source, self.out = loop, source, out
        from sidecar.framing import tap_frame

        self.tap_frame: Callable[[bytes], bytes] = lambda line: tap_frame(line, frame)
        self.channel = channel
        self.max_frame = CHANNEL_MAX_FRAME_BYTES
        self.framer = LineFramer(CHANNEL_MAX_FRAME_BYTES)
        self.queue = TapQueue(where)
        self.copy = bytearray()  # owed to `out`
        self.ended = False  # the harness's stdout reached its end
        self.sock: Any = None
        self.batch = b""
        self.batch_count = 0
        self._retry: list[Any] | None = None
        self._out_was_blocking = os.get_blocking(out)
        os.set_blocking(source, False)
        os.set_blocking(out, False)
        loop.watch(source, READ, self._read)

    @property
    def done(self) -> bool:
        """The copy is complete and every line sent, or given up with the sidecar."""
        return self.ended and not self.copy and not self.batch and (not self.queue or self._given_up)

    _given_up = False

    def close(self) -> None:
        for fd in (self.source, self.out):
            self.loop.unwatch(fd)
        with suppress(OSError):
            os.close(self.source)
        with suppress(OSError):
            os.set_blocking(self.out, self._out_was_blocking)
        Loop.cancel(self._retry)
        if self.sock is not None:
            self.loop.unwatch(self.sock.fileno())
            self.sock.close()
            self.sock = None

    def _read(self) -> None:
        from sidecar.framing import Line

        try:
            chunk = os.read(self.source, 65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.ended = True
            self.loop.unwatch(self.source)
            self._send()
            return
        self.copy.extend(chunk)
        for line in self.framer.receive_data(chunk):
            if isinstance(line, Line) and line.data.strip():
                frame = self.tap_frame(line.data)
                if len(frame) <= self.max_frame:
                    self.queue.put(frame + b"\n")
        self.loop.unwatch(self.source)  # read on once the copy is out: the harness waits on us, not on the sidecar
        self._write()
        self._send()

    def _write(self) -> None:
        try:
            while self.copy:
                del self.copy[: os.write(self.out, self.copy)]
        except BlockingIOError:
            self.loop.unwatch(self.out)
            self.loop.watch(self.out, WRITE, self._write)
            return
        except OSError:
            self.copy.clear()  # our stdout is gone: the harness's output has nowhere to go
        self.loop.unwatch(self.out)
        if not self.ended:
            self.loop.unwatch(self.source)
            self.loop.watch(self.source, READ, self._read)

    def _send(self) -> None:
        socket = self._socket_module
        if not self.batch and self.queue:
            self.batch, self.batch_count = self.queue.take()
        if not self.batch or self._retry is not None:
            return
        if self.sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
            try:
                sock.connect(self.channel)
            except OSError:
                sock.close()
                if self.ended:  # no sidecar to take what is left, and nothing more to come
                    self._lose()
                    self._given_up = True
                    return
                self._retry = self.loop.call_later(TAP_RECONNECT_S, self._retried)
                return
            self.sock = sock
        try:
            while self.batch:
                self.batch = self.batch[self.sock.send(self.batch) :]
        except BlockingIOError:
            self.loop.unwatch(self.sock.fileno())
            self.loop.watch(self.sock.fileno(), WRITE, self._send)
            return
        except OSError:
            self._lose()
            self.loop.unwatch(self.sock.fileno())
            self.sock.close()
            self.sock = None
            if not self.ended:
                self._retry = self.loop.call_later(TAP_RECONNECT_S, self._retried)
            else:
                self._given_up = True
            return
        self.batch_count = 0
        self.loop.unwatch(self.sock.fileno())
        if self.queue:
            self._send()

    def _lose(self) -> None:
        self.queue.dropped += self.batch_count
        self.batch, self.batch_count = b"", 0

    def _retried(self) -> None:
        self._retry = None
        self._send()


def run_tap(
    source: int, frame: str, channel: str, out: int = 1, where: str = "stdout tap", timeout: float = 30.0
) -> None:
    """The tap on its own loop until `source` ends and its lines are sent (a test drives it so)."""
    loop = Loop()
    tap = Tap(loop, source, frame, channel, out, where)
    try:
        loop.run_until(lambda: tap.done, timeout=timeout)
    finally:
        tap.close()
