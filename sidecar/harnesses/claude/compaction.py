"""Claude's own compaction point (issue 37), where the user's settings or environment state
`autoCompactWindow`. Pure: the launch reads the settings (`sidecar.harnesses.claude.launch`), the
producer applies the rule to each status line's window.

The rule, read from the bundled code of both pinned builds (the names are the minified ones):

    2.1.250  JE(model, configured): CLAUDE_CODE_AUTO_COMPACT_WINDOW first (at least 100,000), else the
             `autoCompactWindow` setting (an integer 100,000..1,000,000, anything else dropped):
             window = Math.min(modelWindow, configured)
             L$(model, configured) = window - Math.min(maxOutputTokens(model), 20000)
             M4(e, t) { let r = e - 13000, o = t.testPctOverride;   // CLAUDE_AUTOCOMPACT_PCT_OVERRIDE
                        if (o !== void 0 && !isNaN(o) && o > 0 && o <= 100)
                            return Math.min(Math.floor(e * (o / 100)), r);
                        return r }
             and the query loop compacts at `tokens >= M4(L$(model, configured))`, only while
             `Hf()` (`autoCompactEnabled`, default true) holds; DISABLE_COMPACT turns it off.
    2.1.332  the same arithmetic renamed: XS (the window), gse (window - min(maxOutputTokens, 20000)),
             QG (the 13,000 below, or the percentage), `_m()` the switch.

Measured live (tests/live/test_claude_compact_window_live.py, both builds): `autoCompactWindow`
150,000 on a 200,000 model (status line `context_window_size` 200,000, the model's, not the
configured one): a session at 116,000 did not compact at its next turn; at 117,000
(150,000 - 20,000 - 13,000) the next turn compacted first, `trigger: auto`.

Published only where every input is stated: a configured window hctx can read as Claude reads it, a
model window the status line states, no `CLAUDE_CODE_MAX_OUTPUT_TOKENS` hctx cannot read (every
model these builds serve defaults to an output limit over 20,000). Not covered, so null: 2.1.332's
per-model object form of the setting, managed settings and `--settings` files, and 2.1.332's
postponement right after a compaction whose summary was small.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "MARGIN",
    "MAX_CONFIGURED",
    "MIN_CONFIGURED",
    "SUMMARY_RESERVE",
    "ClaudeCompaction",
    "compact_at",
]

# Claude's bounds on a configured window (2.1.250 `I4`, `Cde`; the setting's schema min/max).
MIN_CONFIGURED = 100_000
MAX_CONFIGURED = 1_000_000
# Kept free for the summary, at most (2.1.250 `oje`, 2.1.332 `kfo`), and the margin below it.
SUMMARY_RESERVE = 20_000
MARGIN = 13_000


class ClaudeCompaction(BaseModel):
    """What the launch read of Claude's auto-compaction: switched off, or the window the user
    configured and the inputs Claude's rule takes beside it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool
    configured_window: Annotated[int, Field(ge=MIN_CONFIGURED, le=MAX_CONFIGURED)] | None = None
    # CLAUDE_AUTOCOMPACT_PCT_OVERRIDE, where it is a percentage Claude applies (0 < p <= 100).
    pct_override: Annotated[float, Field(gt=0, le=100, allow_inf_nan=False)] | None = None
    # CLAUDE_CODE_MAX_OUTPUT_TOKENS, where set to a positive integer.
    max_output_tokens: Annotated[int, Field(gt=0)] | None = None


def compact_at(settings: ClaudeCompaction | None, model_window: int | None) -> int | None:
    """The occupancy Claude compacts at, by its own rule (the module doc); None where not stated."""
    if settings is None or not settings.enabled or settings.configured_window is None or not model_window:
        return None
    window = min(model_window, settings.configured_window)
    reserve = min(settings.max_output_tokens or SUMMARY_RESERVE, SUMMARY_RESERVE)
    effective = window - reserve
    point = effective - MARGIN
    if settings.pct_override is not None:
        point = min(int(effective * (settings.pct_override / 100)), point)
    return point if point > 0 else None
