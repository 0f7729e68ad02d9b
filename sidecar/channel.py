"""The unix-socket channel: newline-delimited JSON frames from the harness's own processes.

Hostile input costs a log line and the frame, never the sidecar: oversized lines are skipped to the
next newline without being buffered, malformed JSON and frames without a `type` are dropped, and a
peer of another uid is refused before a byte is read.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from guard.constants import CHANNEL_MAX_FRAME_BYTES, CHANNEL_MAX_SOCKET_PATH
from sidecar.producers.base import Frame

log = logging.getLogger(__name__)

MAX_FRAME_BYTES = CHANNEL_MAX_FRAME_BYTES
MAX_SOCKET_PATH = CHANNEL_MAX_SOCKET_PATH
MAX_CONNECTIONS = 128
_READ_SIZE = 64 * 1024
_UCRED = struct.Struct("3i")

Submit = Callable[[Frame], None]


class ChannelPathError(ValueError):
    pass


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


def decode_frame(line: bytes) -> Frame | str:
    """The frame in one line, or why it was dropped."""
    try:
        frame: Any = json.loads(line)
    except (ValueError, RecursionError) as exc:
        return f"malformed JSON: {str(exc)[:120]}"
    if not isinstance(frame, dict):
        return f"not a JSON object but {type(frame).__name__}"
    if not isinstance(frame.get("type"), str):
        return "no string 'type'"
    return frame


async def serve(
    path: Path,
    submit: Submit,
    stop: trio.Event | None = None,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Listen at `path` (0600) and submit every well-formed frame.

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
        # Bind under a 0077 umask so the socket is never, even briefly, open to others.
        old_umask = os.umask(0o177)
        try:
            await listener.bind(os.fspath(binding))
        finally:
            os.umask(old_umask)
        # A deep backlog absorbs bursts (a fleet of status-line refreshes) while handlers are busy.
        listener.listen(socket.SOMAXCONN)
        # Only a listening socket appears at `path`: a client that finds it can connect.
        os.rename(binding, path)
        slots = trio.Semaphore(MAX_CONNECTIONS)
        task_status.started()
        try:
            async with trio.open_nursery() as connections:
                with trio.CancelScope() as accepting:
                    if stop is not None:
                        connections.start_soon(_cancel_when_set, stop, accepting)
                    while True:
                        await _accept(listener, connections, submit, slots)
                path.unlink(missing_ok=True)
                while True:  # connections that were already queued when the session ended
                    with trio.move_on_after(_QUEUED_WAIT_S) as waited:
                        await _accept(listener, connections, submit, slots)
                    if waited.cancelled_caught:
                        break
        finally:
            path.unlink(missing_ok=True)


_QUEUED_WAIT_S = 0.02


async def _cancel_when_set(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


async def _accept(
    listener: trio.socket.SocketType, connections: trio.Nursery, submit: Submit, slots: trio.Semaphore
) -> None:
    await slots.acquire()
    try:
        conn, _ = await listener.accept()
    except BaseException as exc:
        slots.release()
        if not isinstance(exc, OSError):
            raise
        log.warning("channel accept failed: %s", exc)  # EMFILE and friends: back off, keep serving
        await trio.sleep(0.05)
        return
    connections.start_soon(_connection, conn, submit, slots)


async def _connection(conn: trio.socket.SocketType, submit: Submit, slots: trio.Semaphore) -> None:
    try:
        with conn:
            uid = peer_uid(conn)
            if uid != os.getuid():
                log.warning("channel peer of uid %d refused", uid, extra={"event": "peer-refused"})
                return
            await _read_frames(conn, submit)
    except OSError as exc:
        log.info("channel connection ended: %s", exc)
    finally:
        slots.release()


async def _read_frames(conn: trio.socket.SocketType, submit: Submit) -> None:
    buffer = bytearray()
    skipping = False  # inside an oversized line: discard until its newline
    while data := await conn.recv(_READ_SIZE):
        start = 0
        while (end := data.find(b"\n", start)) != -1:
            if skipping:
                skipping = False
            else:
                buffer += data[start:end]
                if len(buffer) > MAX_FRAME_BYTES:
                    _drop(f"frame over {MAX_FRAME_BYTES} bytes")
                else:
                    _deliver(bytes(buffer), submit)
            buffer.clear()
            start = end + 1
        if not skipping:
            buffer += data[start:]
            if len(buffer) > MAX_FRAME_BYTES:
                _drop(f"frame over {MAX_FRAME_BYTES} bytes")
                buffer.clear()
                skipping = True
    if buffer.strip():
        _drop(f"truncated frame ({len(buffer)} bytes without a newline)")


def _deliver(line: bytes, submit: Submit) -> None:
    if not line.strip():
        return
    frame = decode_frame(line)
    if isinstance(frame, str):
        _drop(frame)
    else:
        submit(frame)


def _drop(why: str) -> None:
    log.warning("frame dropped: %s", why, extra={"event": "frame-dropped", "why": why})
