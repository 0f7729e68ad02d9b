"""One JSON-lines log per agent, under `<catalog>/.st2/logs/`, outside the replicated subtree.

The sidecar's diagnostics never reach the harness's terminal and never stall it: the log is opened
the store's way (no symlink at any step, a regular file only), a write the disk refuses costs that
line (counted, and said once space returns), never a traceback on stderr, and a warning repeated in
a flood is written once per RATE_WINDOW_S with the count of those held back.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

from guard.layout import LOG_BACKUPS, log_name, log_path
from guard.walk import open_append, open_logs_dir

__all__ = [
    "LOG_BACKUPS",
    "LOG_BYTES",
    "RATE_WINDOW_S",
    "REOPEN_S",
    "LogFile",
    "RateLimit",
    "configure",
    "json_lines",
    "silence_stderr",
]

LOG_BYTES = 1024 * 1024
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


def json_lines(static: dict[str, Any]) -> logging.Formatter:
    """python-json-logger's formatter, one JSON object per record: `time` (logging's asctime),
    `level`, `logger`, `message`, the static fields, then every `extra` field in the order it was
    set (a later key replacing an earlier one in place), `exc_info` / `stack_info` when present."""
    from pythonjsonlogger.json import JsonFormatter

    return JsonFormatter(
        "{asctime}{levelname}{name}{message}",
        style="{",
        rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
        static_fields=static,
        json_ensure_ascii=True,
    )


def configure(catalog: Path, host: str, agent: str) -> Path:
    """Route every log record of this process to the agent's size-bounded, rotated JSON log."""
    handler = LogFile(catalog, host, agent)
    handler.addFilter(RateLimit())
    handler.setFormatter(json_lines({"agent": agent, "host": host}))
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
