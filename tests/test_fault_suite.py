"""The fault campaign of issue 15 at CI scale: every row of scripts/fault_suite.py must pass."""

from __future__ import annotations

import pytest

from scripts import fault_suite

pytestmark = pytest.mark.fault


@pytest.mark.parametrize("name", sorted(fault_suite.FAULTS))
def test_the_fault_holds(name: str) -> None:
    rows = fault_suite.run("ci", [name])
    print("\n" + fault_suite.render(rows))
    assert rows and all(row.ok for row in rows), fault_suite.render(rows)
