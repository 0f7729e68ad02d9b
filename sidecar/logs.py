"""One JSON-lines log per agent, under `<catalog>/.st2/logs/`, outside the replicated subtree.

The sidecar's diagnostics never reach the harness's terminal and never stall it: the log is opened
the store's way (no symlink at any step, a regular file only), a write the disk refuses costs that
line (counted, and said once space returns), never a traceback on stderr, and a warning repeated in
a flood is written once per RATE_WINDOW_S with the count of those held back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import itertools
import json
import logging
import os
import time
from collections import Counter
from pathlib import Path
from types import TracebackType
from typing import Any

from guard.store import log_name, log_path, open_append, open_logs_dir

__all__ = [
    "LOG_BACKUPS",
    "LOG_BYTES",
    "RATE_WINDOW_S",
    "REOPEN_S",
    "JsonLines",
    "LogFile",
    "RateLimit",
    "configure",
    "silence_stderr",
]

LOG_BYTES = 1024 * 1024
LOG_BACKUPS = 3
# A log that cannot be opened or written (full disk, hostile tree) is tried again this often.
REOPEN_S = 5.0
# The same warning (one logger, one message template) at most once per window.
RATE_WINDOW_S = 5.0

log = logging.getLogger("sidecar")

class LogFile(logging.Handler):
    """Appends to `<catalog>/.st2/logs/<log_name>` through a descriptor of the real logs directory,
    rotating by rename inside it; never raises, never prints."""

    def __init__(self, catalog: Path, host: str, agent: str) -> None:
        super().__init__()
        self.catalog = catalog
        self.name_in_dir = log_name(host, agent)
        self.dir_fd: int | None = None
        self.fd: int | None = None
        self.retry_at = 0.0
        self.lost = 0  # lines the disk refused since the log last worked

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = (self.format(record) + "\n").encode("utf-8", "backslashreplace")
        except Exception:  # a record that cannot be formatted is not worth the sidecar
            return
        if self.fd is None and not self._open():
            self.lost += 1
            return
        try:
            if self.lost:
                self._write(self._lost_line())
                self.lost = 0
            self._write(line)
            self._rotate_if_full()
        except OSError:
            self.lost += 1
            self._close()
            self.retry_at = time.monotonic() + REOPEN_S

    def _open(self) -> bool:
        if time.monotonic() < self.retry_at:
            return False
        try:
            if self.dir_fd is None:
                self.dir_fd = open_logs_dir(self.catalog)
            self.fd = open_append(self.dir_fd, self.name_in_dir)
        except OSError:
            self._close()
            self.retry_at = time.monotonic() + REOPEN_S
            return False
        return True

    def _write(self, data: bytes) -> None:
        assert self.fd is not None
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]

    def _lost_line(self) -> bytes:
        lost = logging.LogRecord("sidecar.logs", logging.WARNING, __file__, 0, "log lines lost: %d", (self.lost,), None)
        lost.event = "log-lost"
        return (self.format(lost) + "\n").encode()

    def _rotate_if_full(self) -> None:
        assert self.fd is not None and self.dir_fd is not None
        if os.fstat(self.fd).st_size < LOG_BYTES:
            return
        names = [self.name_in_dir] + [f"{self.name_in_dir}.{n}" for n in range(1, LOG_BACKUPS + 1)]
        for older, newer in reversed(list(itertools.pairwise(names))):
            with contextlib.suppress(FileNotFoundError):
                os.rename(older, newer, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        os.close(self.fd)
        self.fd = None

    def _close(self) -> None:
        for fd in (self.fd, self.dir_fd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.fd = self.dir_fd = None

    def handleError(self, record: logging.LogRecord) -> None:
        """Never a traceback on stderr: that is the harness's terminal."""

    def close(self) -> None:
        self._close()
        super().close()


class RateLimit(logging.Filter):
    """A warning or error repeated within RATE_WINDOW_S is held back and counted; the next one
    let through carries `suppressed`. Writes and other INFO lines are bounded by the policy."""

    def __init__(self) -> None:
        super().__init__()
        self.last: dict[tuple[str, str], float] = {}
        self.held: Counter[tuple[str, str]] = Counter()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        key = (record.name, str(record.msg))
        now = time.monotonic()
        if now - self.last.get(key, -RATE_WINDOW_S) < RATE_WINDOW_S:
            self.held[key] += 1
            return False
        self.last[key] = now
        if held := self.held.pop(key, 0):
            record.suppressed = held
        if len(self.last) > 1024:  # a hostile stream of distinct templates cannot grow this
            self.last.clear()
        return True


# The attributes every LogRecord has (and `message`, `asctime`, set while formatting): anything else
# on a record is an `extra` field, written after the fixed ones.
_RECORD_ATTRS = frozenset({
    "args", "asctime", "created", "exc_info", "exc_text", "filename", "funcName", "levelname", "levelno",
    "lineno", "module", "msecs", "message", "msg", "name", "pathname", "process", "processName",
    "relativeCreated", "stack_info", "taskName", "thread", "threadName",
})  # fmt: skip


class JsonLines(logging.Formatter):
    """One JSON object per record, the line shape python-json-logger wrote (the dependency is gone,
    and with it half a megabyte of the sidecar): `time` (logging's asctime), `level`, `logger`,
    `message`, the static fields, `exc_info` / `stack_info` when present, then every `extra`
    field in the order it was set, a later key replacing an earlier one in place."""

    def __init__(self, static: dict[str, Any]) -> None:
        super().__init__()
        self.static = dict(static)

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = {}
        if isinstance(record.msg, dict):  # a dict logged as the message is merged, not printed
            fields = record.msg.copy()
            record.message = ""
        else:
            record.message = record.getMessage()
        if record.exc_info and not fields.get("exc_info"):
            fields["exc_info"] = self.formatException(record.exc_info)
        if not fields.get("exc_info") and record.exc_text:
            fields["exc_info"] = record.exc_text
        if record.stack_info and not fields.get("stack_info"):
            fields["stack_info"] = self.formatStack(record.stack_info)
        line: dict[str, Any] = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.message,
            **self.static,
            **fields,
        }
        for key, value in record.__dict__.items():
            if key not in _RECORD_ATTRS and not key.startswith("_"):
                line[key] = value
        return json.dumps(line, default=_json_default)


def _json_default(value: object) -> Any:
    """What python-json-logger's encoder made of a value `json` cannot write (rare: imports here)."""
    import datetime

    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, BaseException):
        return f"{value.__class__.__name__}: {value}"
    if isinstance(value, TracebackType):
        import traceback

        return "".join(traceback.format_tb(value)).strip()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, enum.EnumMeta):
        members: list[enum.Enum] = list(value)
        return [member.value for member in members]
    if isinstance(value, bytes | bytearray):
        import base64

        return base64.urlsafe_b64encode(value).decode("utf8")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, type):
        return value.__name__
    for text in (str, repr):
        try:
            return text(value)
        except Exception:
            pass
    return "__could_not_encode__"


def configure(catalog: Path, host: str, agent: str) -> Path:
    """Route every log record of this process to the agent's size-bounded, rotated JSON log."""
    handler = LogFile(catalog, host, agent)
    handler.addFilter(RateLimit())
    handler.setFormatter(JsonLines({"agent": agent, "host": host}))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    return log_path(catalog, host, agent)


def silence_stderr() -> None:
    """Point fd 2 at /dev/null: whatever Python or a library would print (a traceback, a warning)
    must not land in, or block on, the terminal or pipe the harness shares with this process."""
    devnull = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.dup2(devnull, 2)
    finally:
        os.close(devnull)
