"""The sixth harness's launch plan: its agent needs nothing but the channel the wrapper sets."""

from __future__ import annotations

from sidecar.launching import LaunchPlan


def prepare(plan: LaunchPlan) -> LaunchPlan:
    return plan
