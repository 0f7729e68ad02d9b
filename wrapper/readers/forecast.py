"""When does the account run out (issue 39): one shared window's forecast at the fleet's pace.

Sans-I/O: `forecast` takes the points one account's window has been seen at (every agent's snapshot
of it, as `wrapper.readers.rate_history` keeps them) and the time now, and returns the burn rate over the
recent span, the time the window reaches 100% at that rate from where it stands, and how that time
compares with the reset the harness stated. No number is made up: the answer is null (`status`
"unknown", with a `reason`) from fewer than two points, from a newest point past the hour horizon or
past its stated reset, and when the percent fell at the newest point (a reset happened). The span
and the number of points it rests on are always part of the answer, so a reader shows them beside it.

Odd input is taken as it comes: points in any order (sorted here), points dated after `now` (left
out: a clock ahead of this host's, never the future), non-finite percents (left out), duplicate
times (kept; the fit weighs each). A reset time that jumps without the percent falling (a known
harness bug: anthropics/claude-code#85259, #92834, and #32421 of OpenAI's CLI) does not cut the series;
the newest point's reset is the one compared with. A window has reset between two points when the
percent fell, or when the earlier point's stated reset had passed by the later one's time: only the
points after the last such cut are the current window's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final, Literal

from guard.constants import HARNESS_CONTEXT_STALE_MS

__all__ = [
    "FORECAST_SPAN_MS",
    "Forecast",
    "Point",
    "Status",
    "forecast",
    "point_order",
]

# The burn rate is the fleet's pace over this much of the newest points: long enough to see a few
# turns of several agents, short enough to follow a change of pace.
FORECAST_SPAN_MS: Final = 60 * 60 * 1000
# A percent that moved by less than this is the same reading (harnesses round to whole or tenths).
_FELL_BY: Final = 1e-9

Status = Literal["runs-out", "not-before-reset", "unknown"]


@dataclass(frozen=True, slots=True)
class Point:
    """One snapshot of one window: when it was taken, its percent, the reset it stated (None unstated)."""

    at_ms: int
    used_percent: float
    resets_at_ms: int | None = None


def point_order(point: Point) -> tuple[int, float, int]:
    """Oldest first; at one time the lower percent first (a fall is never made up of a tie), then
    an unstated reset first."""
    return point.at_ms, point.used_percent, -1 if point.resets_at_ms is None else point.resets_at_ms


@dataclass(frozen=True, slots=True)
class Forecast:
    """One window's forecast. `exhausted_at_ms` is set only when the window reaches 100% before its
    stated reset (or, none stated, within `horizon_ms` of now); `projected_at_ms` is where the line
    crosses 100% whatever the reset (None when the pace is flat or falling)."""

    status: Status
    reason: str | None  # why unknown; None otherwise
    exhausted_at_ms: int | None
    projected_at_ms: int | None
    resets_at_ms: int | None
    percent_per_hour: float | None
    span_ms: int  # from the first to the last point the rate rests on
    points: int  # how many points the rate rests on

    def wire(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "reason": self.reason,
            "exhaustedAtMs": self.exhausted_at_ms,
            "projectedAtMs": self.projected_at_ms,
            "resetsAtMs": self.resets_at_ms,
            "percentPerHour": self.percent_per_hour,
            "spanMs": self.span_ms,
            "points": self.points,
        }


def _unknown(reason: str, *, resets: int | None = None, span_ms: int = 0, points: int = 0) -> Forecast:
    return Forecast("unknown", reason, None, None, resets, None, span_ms, points)


def _current_window(points: list[Point]) -> list[Point]:
    """The trailing points of the newest window: after the last fall of the percent, or the last
    point whose own stated reset had passed by the next point's time."""
    start = 0
    for index in range(1, len(points)):
        before, after = points[index - 1], points[index]
        fell = after.used_percent < before.used_percent - _FELL_BY
        rolled = before.resets_at_ms is not None and before.resets_at_ms <= after.at_ms
        if fell or rolled:
            start = index
    return points[start:]


def _slope_per_ms(points: list[Point]) -> float:
    """The least-squares slope of percent over time: every agent's point weighs the same."""
    origin = points[0].at_ms
    xs = [float(point.at_ms - origin) for point in points]
    ys = [point.used_percent for point in points]
    mean_x, mean_y = math.fsum(xs) / len(xs), math.fsum(ys) / len(ys)
    spread = math.fsum((x - mean_x) ** 2 for x in xs)
    return math.fsum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread


def forecast(
    seen: Iterable[Point],
    now: int,
    *,
    span_ms: int = FORECAST_SPAN_MS,
    horizon_ms: int,
    stale_ms: int = HARNESS_CONTEXT_STALE_MS,
) -> Forecast:
    """The window's forecast from the points it was seen at. `horizon_ms`: the window's length, how
    far ahead a projection means anything when the harness stated no reset."""
    points = sorted(
        (point for point in seen if point.at_ms <= now and math.isfinite(point.used_percent)), key=point_order
    )
    if not points:
        return _unknown("no snapshot")
    newest = points[-1]
    resets = newest.resets_at_ms
    if now - newest.at_ms > stale_ms:
        return _unknown("stale", resets=resets)
    if resets is not None and resets <= now:
        return _unknown("window passed", resets=resets)
    window = _current_window(points)
    recent = [point for point in window if point.at_ms >= newest.at_ms - span_ms]
    span = recent[-1].at_ms - recent[0].at_ms
    if len(window) < len(points) and len(recent) < 2:
        return _unknown("percent fell", resets=resets, span_ms=span, points=len(recent))
    if len(recent) < 2 or span <= 0:
        return _unknown("fewer than two snapshots", resets=resets, span_ms=span, points=len(recent))
    slope = _slope_per_ms(recent)
    per_hour = slope * 3_600_000
    if not math.isfinite(per_hour):  # percents no harness states (1e308): no pace, not a NaN date
        return _unknown("no finite pace", resets=resets, span_ms=span, points=len(recent))
    if newest.used_percent >= 100:
        projected: int | None = newest.at_ms
    elif slope <= 0:
        projected = None  # flat: never at this pace
    else:
        ahead = (100 - newest.used_percent) / slope
        # Past any reset or horizon a reader compares with: not a date anyone is shown.
        projected = newest.at_ms + int(ahead) if ahead < 100 * 365 * 86_400_000 else None
    limit = resets if resets is not None else now + horizon_ms
    if projected is not None and projected < limit:
        return Forecast("runs-out", None, projected, projected, resets, per_hour, span, len(recent))
    return Forecast("not-before-reset", None, None, projected, resets, per_hour, span, len(recent))
