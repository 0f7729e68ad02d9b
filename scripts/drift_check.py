#!/usr/bin/env python3
"""Drift check: the newest build npm serves of each harness, installed and run through the live suite.

    scripts/drift_check.py [--only NAME[,NAME...]] [--root DIR] [--skip-pinned] [--jobs N]

For each harness: `npm view <package> version` names the newest served build;
`scripts/install_harnesses.sh` installs it (HCTX_HARNESS_VERSIONS) into its own ignored root
(default `.harnesses-drift/`, never the pinned `.harnesses/`); then the harness's live tests run
against it (HCTX_HARNESSES_DIR + HCTX_LIVE_VERSIONS, see tests/harnesses.py). Prints one row per
harness: the build, whether it is one the producers verified, the install, and the live tests'
passed / failed / skipped counts. Exit 1 when any install or live test failed. A build that passes
is a candidate for the pins (scripts/install_harnesses.sh, tests/harnesses.py, the producer's
VERIFIED_VERSIONS); this script changes none of them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sidecar.registry import verified_versions  # noqa: E402
from tests.harnesses import _PACKAGES, MARKER, PINNED_VERSIONS  # noqa: E402

# Which live files exercise which harness; `-k` narrows a shared file to this harness's build.
# (A shared file's tests of another harness's pinned builds find nothing installed here: skipped.)
LIVE_TESTS: dict[str, tuple[list[str], str | None]] = {
    "claude": (["tests/live/test_claude_live.py", "tests/live/test_displayed_percent_live.py"], None),
    "codex": (
        [
            "tests/live/test_codex_live.py",
            "tests/live/test_rollout_live.py",
            "tests/live/test_displayed_percent_live.py",
        ],
        None,
    ),
    "opencode": (["tests/live/test_opencode_live.py", "tests/live/test_opencode_sessions_live.py"], None),
    "pi": (["tests/live/test_pi_live.py", "tests/live/test_pi_version_live.py"], "pi-{version}"),
    "omp": (["tests/live/test_pi_live.py", "tests/live/test_pi_version_live.py"], "omp-{version}"),
}


@dataclass
class Row:
    harness: str
    version: str
    verified: bool
    install: str = "-"
    passed: int = 0
    failed: int = 0
    skipped: int = 0

    @property
    def verdict(self) -> str:
        if self.install != "ok":
            return "FAIL (install)"
        if self.failed:
            return "FAIL"
        return "pass" if self.passed else "no test ran"


def newest_served(package: str) -> str:
    result = subprocess.run(["npm", "view", package, "version"], capture_output=True, text=True, check=True)
    return result.stdout.strip()


def install(root: Path, picks: dict[str, str], jobs: int) -> None:
    env = {
        **os.environ,
        "HCTX_HARNESSES_DIR": str(root),
        "HCTX_HARNESS_VERSIONS": ",".join(f"{name}={version}" for name, version in picks.items()),
    }
    command = [str(ROOT / "scripts" / "install_harnesses.sh"), "--only", ",".join(picks), "--jobs", str(jobs)]
    subprocess.run(command, env=env, cwd=ROOT, check=False)


def live(root: Path, row: Row) -> None:
    files, narrow = LIVE_TESTS[row.harness]
    report = root / f".junit-{row.harness}-{row.version}.xml"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", *files]
    if narrow is not None:
        command += ["-k", narrow.format(version=row.version)]
    env = {**os.environ, "HCTX_HARNESSES_DIR": str(root), "HCTX_LIVE_VERSIONS": f"{row.harness}={row.version}"}
    env.pop("CI", None)  # a pinned build of another harness is absent here: skipped, not failed
    subprocess.run(command, env=env, cwd=ROOT, check=False)
    try:
        suite = ElementTree.parse(report).getroot()
    except (OSError, ElementTree.ParseError):
        row.failed = 1  # pytest itself did not get as far as a report
        return
    for case in suite.iter("testcase"):
        outcome = {child.tag for child in case}
        if outcome & {"failure", "error"}:
            row.failed += 1
        elif "skipped" in outcome:
            row.skipped += 1
        else:
            row.passed += 1


def render(rows: list[Row]) -> str:
    header = f"{'harness':9} {'version':9} {'verified':8} {'install':8} {'passed':>6} {'failed':>6} {'skipped':>7}"
    lines = [f"{header}  result"]
    for row in rows:
        lines.append(
            f"{row.harness:9} {row.version:9} {'yes' if row.verified else 'no':8} {row.install:8} "
            f"{row.passed:>6} {row.failed:>6} {row.skipped:>7}  {row.verdict}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(PINNED_VERSIONS), help="harnesses, comma-separated")
    parser.add_argument("--root", type=Path, default=ROOT / ".harnesses-drift", help="install root")
    parser.add_argument("--skip-pinned", action="store_true", help="leave out a newest build that is pinned")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)

    names = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = [name for name in names if name not in PINNED_VERSIONS]
    if unknown:
        parser.error(f"unknown harness {', '.join(unknown)}; known: {', '.join(PINNED_VERSIONS)}")
    rows = []
    for name in names:
        version = newest_served(_PACKAGES[name][0])
        verified = version in verified_versions(name)
        if verified and args.skip_pinned:
            continue
        rows.append(Row(name, version, verified))
    if not rows:
        print("every newest served build is pinned already")
        return 0
    args.root.mkdir(parents=True, exist_ok=True)
    install(args.root, {row.harness: row.version for row in rows}, args.jobs)
    for row in rows:
        row.install = "ok" if (args.root / f"{row.harness}-{row.version}" / MARKER).is_file() else "failed"
        if row.install == "ok":
            live(args.root, row)
    print(render(rows))
    return 1 if any(row.verdict.startswith("FAIL") for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
