"""httpx without its command line, for the OpenCode sidecar (the only one that loads httpx).

httpx's package init imports its command line (`httpx._main`: click, pygments, rich) whenever click
is installed, and apprise (hctx's notifications) depends on click: 2.5 MB of PSS in every OpenCode
sidecar for a command nobody runs there (`scripts/bench_footprint.py`: 2.42x a trio process, past
issue 24's 2.3x; 2.2x without). A None in sys.modules makes that one import fail at once, which
httpx's init allows for (`except ImportError`: its `main` then asks for httpx[cli]).
"""

from __future__ import annotations

import sys

sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]

import httpx  # noqa: E402  (after the line above, or the command line is loaded)

__all__ = ["httpx"]
