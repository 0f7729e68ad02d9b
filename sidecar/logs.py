"""One JSON-lines log per agent, under `<catalog>/.st2/logs/`, outside the replicated subtree."""

from __future__ import annotations

import logging
import logging.handlers
from pathlib import Path

from pythonjsonlogger.json import JsonFormatter

from guard.store import log_path

LOG_BYTES = 1024 * 1024
LOG_BACKUPS = 3


def configure(catalog: Path, host: str, agent: str) -> Path:
    """Route every log record of this process to the agent's size-bounded, rotated JSON log."""
    path = log_path(catalog, host, agent)
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.handlers.RotatingFileHandler(path, maxBytes=LOG_BYTES, backupCount=LOG_BACKUPS)
    handler.setFormatter(
        JsonFormatter(
            "{asctime}{levelname}{name}{message}",
            style="{",
            rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
            static_fields={"agent": agent, "host": host},
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    return path
