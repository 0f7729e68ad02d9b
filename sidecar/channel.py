"""The unix-socket channel: moves the bytes of the harness's own processes into decoders.

Each connection's bytes go to a fresh channel decoder (`sidecar.decoding.channel_decoder`: line
framing, the envelope, the harness's frames), the one `hctx replay` uses for a channel recording.
Hostile input costs a log line and the frame, never the sidecar: oversized lines are skipped to the
next newline without being buffered, malformed frames are dropped by the decoder, and a peer of
another uid is refused before a byte is read.

Held connections cannot keep the harness out: every process the harness starts inherits the
channel's address, so a connection is never refused for want of a slot. At MAX_CONNECTIONS the
longest-idle connection is closed to admit the new one (a persistent harness connection that idles
between turns reconnects when it next writes); a connection that sends nothing for SILENT_TIMEOUT_S
after it connected is closed; a frame must be complete PARTIAL_FRAME_TIMEOUT_S after its first byte;
and the partial frames of all connections together hold at most their `ChannelBudget` (the app's:
BUFFER_BUDGET_BYTES unless its config says otherwise), the connection whose partial frame is oldest
giving way first. The budget is the caller's, never the module's: two sidecars in one process (a
test, an embedding) do not share one.

Frame types under `hctx.` are the sidecar's own and refused on the socket, with one exception, the
drop report a tap sends for lines it could not deliver (`hctx.dropped`), which becomes a `Dropped`
event: counted and logged, never fed to a producer (sidecar.decoding.channel_parse).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from guard.constants import CHANNEL_MAX_FRAME_BYTES, CHANNEL_MAX_SOCKET_PATH
from sidecar.decoding import CHANNEL, Dropped, LineDecoder
from sidecar.framing import LineFramer
from sidecar.spec import ChannelPathError, ConfigError
from sidecar.streams import Stream

if TYPE_CHECKING:
    from sidecar.recorder import Recorder

__all__ = [
    "BUFFER_BUDGET_BYTES",
    "MAX_CONNECTIONS",
    "MAX_FRAME_BYTES",
    "MAX_SOCKET_PATH",
    "PARTIAL_FRAME_TIMEOUT_S",
    "SILENT_TIMEOUT_S",
    "ChannelBudget",
    "OpenDecoder",
    "Submit",
    "check_channel_path",
    "peer_uid",
    "serve",
]

log = logging.getLogger(__name__)

MAX_FRAME_BYTES = CHANNEL_MAX_FRAME_BYTES
MAX_SOCKET_PATH = CHANNEL_MAX_SOCKET_PATH
MAX_CONNECTIONS = 128
PARTIAL_FRAME_TIMEOUT_S = 5.0
# Every harness client writes as soon as it connects; one that sends nothing for this long is cut.
SILENT_TIMEOUT_S = 10.0
BUFFER_BUDGET_BYTES = 16 * 1024 * 1024
_READ_SIZE = 64 * 1024
_UCRED = struct.Struct("3i")

Submit = Callable[[object], None]
OpenDecoder = Callable[[], LineDecoder]
_Sink = tuple[OpenDecoder, Submit, "Recorder | None", "ChannelBudget"]


def peer_uid(sock: trio.socket.SocketType) -> int:
    """The connecting process's uid, from the kernel (SO_PEERCRED), not from anything it sent."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    uid: int = _UCRED.unpack(creds)[1]
    return uid


def check_channel_path(path: Path) -> None:
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise ChannelPathError(f"channel path {path} is longer than {MAX_SOCKET_PATH} bytes")
    parent = path.parent.stat()
    if parent.st_uid != os.getuid() or parent.st_mode & 0o077:
        raise ChannelPathError(f"{path.parent} must be owned by this user and closed to others (0700)")


@dataclass(eq=False)
class _Peer:
    """One open connection: when it last sent a byte, and the partial frame it holds."""

    scope: trio.CancelScope
    active_at: float
    spoke: bool = False
    partial_since: float | None = None
    buffered: int = 0

    def deadline(self) -> float:
        """When this connection is cut: its partial frame's timeout, or, before its first byte,
        the silent one."""
        silent = math.inf if self.spoke else self.active_at + SILENT_TIMEOUT_S
        return min(silent, _started(self) + PARTIAL_FRAME_TIMEOUT_S)


class ChannelBudget:
    """The bytes of partial frames held by every connection of one channel, at most `limit_bytes`."""

    def __init__(self, limit_bytes: int = BUFFER_BUDGET_BYTES) -> None:
        if limit_bytes < 0:
            raise ConfigError(f"a channel budget of {limit_bytes} bytes is no budget")
        self.limit_bytes = limit_bytes
        self.total = 0
        self.holders: set[_Peer] = set()

    def hold(self, peer: _Peer, size: int) -> bool:
        """Account `peer`'s partial frame at `size` bytes; False when it does not fit even after
        cutting every connection whose partial frame is older."""
        while self.total - peer.buffered + size > self.limit_bytes:
            oldest = min(self.holders, key=_started, default=None)
            if oldest is None or oldest is peer or _started(oldest) > _started(peer):
                return False
            self.release(oldest)
            oldest.scope.cancel()  # its connection counts the frame it loses
        self.total += size - peer.buffered
        peer.buffered = size
        if size:
            self.holders.add(peer)
        else:
            self.holders.discard(peer)
        return True

    def release(self, peer: _Peer) -> None:
        self.total -= peer.buffered
        peer.buffered = 0
        self.holders.discard(peer)


def _started(peer: _Peer) -> float:
    return math.inf if peer.partial_since is None else peer.partial_since


async def serve(
    path: Path,
    open_decoder: OpenDecoder,
    submit: Submit,
    stop: trio.Event | None = None,
    *,
    recorder: Recorder | None = None,
    budget: ChannelBudget | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Listen at `path` (0600); each connection's bytes go through a decoder of its own, and
    every event they make is submitted, a drop included (the connection's own too: a frame cut
    short or over the buffer budget), which the pipeline counts and logs. Each connection is a
    `sidecar.streams.Stream` of the channel wire, recorded by `recorder` when there is one. Partial
    frames are held within `budget` (the app's; without one, a BUFFER_BUDGET_BYTES one of this call's).

    Runs until cancelled, or until `stop` is set: then it stops accepting, takes the connections
    already queued, and returns once every open connection has delivered its frames, so the last
    status line of a session that just ended is not lost. Bound that drain with a deadline.
    """
    check_channel_path(path)
    path.unlink(missing_ok=True)
    binding = path.with_name(path.name + ".bind")
    binding.unlink(missing_ok=True)
    listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with listener:
        # Bound inside a directory closed to others (check_channel_path), then 0600 before it is
        # named `path`: never open to another user, even briefly. Not by narrowing the umask, which
        # is the whole process's: a directory another thread made meanwhile came out 0600.
        await listener.bind(os.fspath(binding))
        os.chmod(binding, 0o600)
        # A deep backlog absorbs bursts (a fleet of status-line refreshes) while handlers are busy.
        listener.listen(socket.SOMAXCONN)
        # Only a listening socket appears at `path`: a client that finds it can connect.
        os.rename(binding, path)
        peers: set[_Peer] = set()
        sink = (open_decoder, submit, recorder, ChannelBudget() if budget is None else budget)
        task_status.started()
        try:
            async with trio.open_nursery() as connections:
                with trio.CancelScope() as accepting:
                    if stop is not None:
                        connections.start_soon(_cancel_when_set, stop, accepting)
                    while True:
                        await _accept(listener, connections, sink, peers)
                path.unlink(missing_ok=True)
                while True:  # connections that were already queued when the session ended
                    with trio.move_on_after(_QUEUED_WAIT_S) as waited:
                        await _accept(listener, connections, sink, peers)
                    if waited.cancelled_caught:
                        break
        finally:
            path.unlink(missing_ok=True)


_QUEUED_WAIT_S = 0.02


async def _cancel_when_set(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


async def _accept(listener: trio.socket.SocketType, connections: trio.Nursery, sink: _Sink, peers: set[_Peer]) -> None:
    try:
        conn, _ = await listener.accept()
    except OSError as exc:
        log.warning("channel accept failed: %s", exc)  # EMFILE and friends: back off, keep serving
        await trio.sleep(0.05)
        return
    if len(peers) >= MAX_CONNECTIONS:
        idlest = min(peers, key=lambda peer: peer.active_at)
        peers.discard(idlest)
        idlest.scope.cancel()
        log.warning("channel full: closed its longest-idle connection", extra={"event": "connection-evicted"})
    peer = _Peer(trio.CancelScope(), trio.current_time())
    peers.add(peer)
    connections.start_soon(_connection, conn, sink, peers, peer)


async def _connection(conn: trio.socket.SocketType, sink: _Sink, peers: set[_Peer], peer: _Peer) -> None:
    open_decoder, submit, recorder, budget = sink
    try:
        with conn, peer.scope:
            uid = peer_uid(conn)
            if uid != os.getuid():
                log.warning("channel peer of uid %d refused", uid, extra={"event": "peer-refused"})
                return
            decoder = open_decoder()
            stream = Stream(decoder, submit, CHANNEL, recorder)
            await _read_frames(conn, decoder.framer, stream, submit, (peer, budget))
        if peer.scope.cancelled_caught and peer.partial_since is not None:
            submit(Dropped("connection closed mid-frame to make room for others", CHANNEL))
    except OSError as exc:
        log.info("channel connection ended: %s", exc)
    finally:
        peers.discard(peer)
        budget.release(peer)


async def _read_frames(
    conn: trio.socket.SocketType, framer: LineFramer, stream: Stream, submit: Submit, held: tuple[_Peer, ChannelBudget]
) -> None:
    peer, budget = held
    while True:
        with trio.move_on_at(peer.deadline()) as waiting:
            data = await conn.recv(_READ_SIZE)
        if waiting.cancelled_caught:
            if peer.partial_since is not None:
                why = f"frame incomplete {PARTIAL_FRAME_TIMEOUT_S}s after its first byte; connection closed"
                submit(Dropped(why, CHANNEL))
            else:
                log.warning("channel connection silent for %ss closed", SILENT_TIMEOUT_S, extra={"event": "silent-cut"})
            return
        if not data:
            break
        peer.active_at, peer.spoke = trio.current_time(), True
        completed = framer.completed
        stream.receive_data(data)
        if framer.completed != completed:
            peer.partial_since = None  # the partial frame's clock restarts with the next frame
        if framer.mid_frame and peer.partial_since is None:
            peer.partial_since = peer.active_at
        if framer.pending_bytes and not budget.hold(peer, framer.pending_bytes):
            submit(Dropped("partial frame over the channel's buffer budget", CHANNEL))
            framer.discard_partial()
        if not framer.pending_bytes:
            budget.release(peer)
    stream.end_of_data()
