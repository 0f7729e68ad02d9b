"""Claude: follow each subagent's own transcript, and only where Claude writes it (issue 28).

The producer says which transcripts it wants (`ClaudeProducer.wants`: the subagents its record
carries, each at the path its hooks name); this transport reads each from its first byte as it
grows into its own `subagent` stream, the harness's decoder (`SubagentDecoder`) making the events,
as `hctx replay` does with a recording of them. A finished subagent's file is read on until it has
not grown for FINISHED_QUIET_S (measured: a loaded 2.1.250 writes the subagent's last lines seconds
after its SubagentStop), then its stream is closed; one that never appears is given up after
ABSENT_GIVE_UP_S. Polled every `poll_seconds` while a subagent runs or is being finished; asleep
otherwise, until the producer was fed (a SubagentStart names a new one).

The sidecar reads only where the harness writes: a path is read only when it is
`<projects>/<project>/<session>/subagents/agent-<its agent_id>.jsonl` under the projects directory
the launch named, every directory below that opened without following a symlink, the file
itself a regular file (never a symlink or a FIFO) of at most MAX_TRANSCRIPT_BYTES. Anything else is
refused once, with the reason logged, and its row keeps null numbers.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Final

import trio

from guard.errors import CatalogError
from guard.files import open_regular
from guard.walk import open_chain
from sidecar.harnesses.claude.subagents import (
    MAX_TRANSCRIPT_BYTES,
    SUBAGENT_WIRE,
    ClaudeTransport,
    ModelWindows,
    SubagentTranscript,
)
from sidecar.spec import Stream, Streams

__all__ = [
    "ABSENT_GIVE_UP_S",
    "FINISHED_QUIET_S",
    "READ_PER_POLL",
    "SubagentFollower",
    "open_subagent_transcript",
    "run",
]

log = logging.getLogger(__name__)

# A finished subagent's file is read until it has been quiet this long, then its stream ends.
FINISHED_QUIET_S: Final = 5.0
# A finished subagent whose file never appeared is given up after this long.
ABSENT_GIVE_UP_S: Final = 30.0
# At most this much of one transcript per poll: a big file is caught up on over several.
READ_PER_POLL: Final = 8 * 1024 * 1024
_CHUNK: Final = 1024 * 1024


def open_subagent_transcript(projects: Path, agent_id: str, path: str) -> tuple[int, int] | str | None:
    """`(fd, size)` of the subagent's transcript, which the caller closes; None while it does not
    exist yet; else why it is refused."""
    roots = {PurePosixPath(os.path.abspath(projects)), PurePosixPath(os.path.realpath(projects))}
    relative = next((PurePosixPath(path).relative_to(root) for root in roots
                     if PurePosixPath(path).is_relative_to(root)), None)  # fmt: skip
    if relative is None:
        return f"is outside Claude's projects directory {projects}; not read"
    parts = relative.parts
    if len(parts) != 4 or parts[2] != "subagents" or parts[3] != f"agent-{agent_id}.jsonl" or ".." in parts:
        return "is not where Claude writes a subagent's transcript (<project>/<session>/subagents/agent-<id>.jsonl)"
    try:
        dir_fd = open_chain(projects, parts[:3])
    except FileNotFoundError:
        return None
    except (CatalogError, OSError) as exc:
        return str(exc) if isinstance(exc, CatalogError) else f"unreadable: {exc.strerror or exc}"
    try:
        opened = open_regular(parts[3], dir_fd)
    finally:
        os.close(dir_fd)
    if isinstance(opened, tuple) and opened[1] > MAX_TRANSCRIPT_BYTES:
        os.close(opened[0])
        return f"is {opened[1]} bytes, over the {MAX_TRANSCRIPT_BYTES}-byte bound; not read"
    return opened


@dataclass
class _Followed:
    stream: Stream
    inode: int
    grew_at: float
    offset: int = 0
    ended: bool = False


class SubagentFollower:
    """The wanted transcripts, each followed into its own stream."""

    def __init__(self, config: ClaudeTransport, streams: Streams) -> None:
        self.projects = Path(config.projects_dir)
        self.streams = streams
        self.followed: dict[str, _Followed] = {}
        self.refused: dict[str, str] = {}  # agent id -> why (said once)
        self.finished_at: dict[str, float] = {}  # agent id -> when the follower first saw it finished

    def poll(self, now: float) -> bool:
        """Read what each wanted transcript gained; whether a transcript is still being followed."""
        wanted = {want.agent_id: want for want in self.streams.wants() if isinstance(want, SubagentTranscript)}
        for agent_id in set(self.followed) - set(wanted):  # out of the record's newest: let go
            self._end(self.followed.pop(agent_id))
        self.refused = {agent_id: why for agent_id, why in self.refused.items() if agent_id in wanted}
        self.finished_at = {agent_id: at for agent_id, at in self.finished_at.items() if agent_id in wanted}
        busy = False
        for want in wanted.values():
            if want.finished:
                self.finished_at.setdefault(want.agent_id, now)
            followed = self.followed.get(want.agent_id)
            if want.agent_id not in self.refused and not (followed is not None and followed.ended):
                busy |= self._read(want, self.followed.get(want.agent_id), now)
        return busy

    def _read(self, want: SubagentTranscript, followed: _Followed | None, now: float) -> bool:
        """Read what the transcript gained; whether it is still followed."""
        opened = open_subagent_transcript(self.projects, want.agent_id, want.path)
        if isinstance(opened, str):
            self.refused[want.agent_id] = opened
            log.warning("subagent transcript %s %s", want.path[:512], opened,
                        extra={"event": "subagent-transcript-refused", "agentId": want.agent_id})  # fmt: skip
            return False
        finished_at = self.finished_at.get(want.agent_id)
        if opened is None:
            if finished_at is not None and now - finished_at >= ABSENT_GIVE_UP_S:
                self.refused[want.agent_id] = "was never written"  # a subagent that stopped with no file
                return False
            return True
        fd, size = opened
        try:
            inode = os.fstat(fd).st_ino
            if followed is None or followed.inode != inode or size < followed.offset:  # new, replaced, cut
                if followed is not None:
                    self._end(followed)
                followed = self.followed[want.agent_id] = _Followed(self.streams.open(SUBAGENT_WIRE), inode, now)
            budget = READ_PER_POLL
            while followed.offset < size and budget > 0:
                data = os.pread(fd, min(_CHUNK, size - followed.offset, budget), followed.offset)
                if not data:
                    break
                followed.stream.receive_data(data)
                followed.offset += len(data)
                followed.grew_at = now
                budget -= len(data)
        except OSError as exc:
            log.warning("subagent transcript %s unreadable: %s", want.path[:512], exc,
                        extra={"event": "subagent-transcript-unreadable", "agentId": want.agent_id})  # fmt: skip
            return True
        finally:
            os.close(fd)
        if (
            finished_at is not None
            and followed.offset >= size
            and now - max(finished_at, followed.grew_at) >= FINISHED_QUIET_S
        ):
            self._end(followed)
            return False
        return True

    def _end(self, followed: _Followed) -> None:
        if not followed.ended:
            followed.ended = True
            followed.stream.end_of_data()


async def run(config: ClaudeTransport, streams: Streams) -> None:
    streams.submit(ModelWindows(dict(config.windows)))
    if config.compaction is not None:
        streams.submit(config.compaction)
    follower = SubagentFollower(config, streams)
    while True:
        busy = follower.poll(trio.current_time())
        await streams.fed(config.poll_seconds if busy else None)
