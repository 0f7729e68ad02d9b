"""httpx without what it loads only because it is installed, for the OpenCode sidecar (the only
process of hctx's that loads httpx).

- httpx's package init imports its command line (`httpx._main`: click and pygments) whenever click
  is installed, and apprise (hctx's notifications) depends on click: 2.5 MB of PSS;
- httpcore's imports its HTTP/2 connection (h2, hpack, hyperframe) whenever h2 is installed, and
  Hypercorn (the board's server) depends on h2: 1.4 MB. OpenCode's server speaks HTTP/1.1 and the
  client never asks for HTTP/2 (httpx's default).

Together they took an OpenCode seat to 2.42x a trio process (`scripts/bench_footprint.py`), past
issue 24's 2.3x. Both packages allow for the import failing (`except ImportError`: httpx's `main`
then asks for httpx[cli], HTTP/2 for httpcore[http2]); a None in sys.modules makes it fail at once.
The None is there only while httpx and httpcore are imported: anything else in the process imports
h2 as ever.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["httpx"]


@contextmanager
def _absent(*names: str) -> Iterator[None]:
    """`names` cannot be imported inside the block (unless already imported before it)."""
    blocked = [name for name in names if name not in sys.modules]
    for name in blocked:
        sys.modules[name] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        for name in blocked:
            if sys.modules.get(name, ...) is None:
                del sys.modules[name]


with _absent("httpx._main", "h2"):
    import httpcore  # noqa: F401  (httpx loads it with its first client: here, inside the block)
    import httpx
