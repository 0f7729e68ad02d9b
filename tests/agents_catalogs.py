"""Varied catalogs for `hctx agents --json`'s byte-for-byte proof (issue 38's start-up work).

`build(catalog, seed)` writes a catalog of agents drawn from a seeded generator: every record field
`agents --json` prints, in forms a harness writes and forms it never should (refused, odd, hostile),
stale and future-dated readings, subagents, shared accounts, prompt caches, claims stopped, running
here (this process's pid, alive) or elsewhere, refused claims, and entries that are no agent at
all. Nothing here is adopted: the claims and records carry no adoption mark.

The catalog depends only on the seed, so `fixtures/agents-json/` holds what `hctx agents --json`
printed for each seed at `NOW` before its start-up was cut (tests/test_agents_start.py compares
every byte of stdout and stderr against it). Regenerate only on purpose: `python
tests/agents_catalogs.py fixtures/agents-json` prints with whatever code is checked out.
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent

HOST = "box"
# The spec's Exposure example's clock (tests/readers_catalog.NOW).
NOW = 1_788_000_104_210
MINUTE = 60_000
HOUR = 60 * MINUTE
SEEDS = tuple(range(6))
AGENTS_PER_CATALOG = 40
HOSTS = (HOST, "far", "ws-2")
HARNESSES = ("claude", "codex", "pi", "omp", "opencode")
ACCOUNTS = ("0123456789abcdef0123456789abcdef", "fedcba9876543210fedcba9876543210", "00112233445566778899aabbccddeeff")
# A pid no process has (above Linux's largest pid_max): a claim's wrapper that is gone.
DEAD_PID = 4_194_305


def _maybe(rng: random.Random, value: Any, chance: float = 0.5) -> Any:
    return value if rng.random() < chance else None


def _percent(rng: random.Random) -> Any:
    return rng.choice([0, 33, 33.0, 79.96, 80.0, 95.5, 100, 104.2, 12.345678, 1e-7, 99.999])


def _subagent(rng: random.Random, index: int) -> dict[str, Any]:
    sub: dict[str, Any] = {
        "id": rng.choice([f"a91242bfc47ae88{index}", f"sub-{index}", "x" * 128, "ünïcødé-" + str(index)]),
        "state": rng.choice(["running", "finished"]),
        "observedAtMs": NOW - rng.choice([0, 5_000, 2 * HOUR, -30_000]),
    }
    for key, value in (
        ("name", rng.choice(["general-purpose", "explore", None])),
        ("model", rng.choice(["claude-sonnet-4", None])),
        ("usedTokens", rng.choice([1200, 0, None])),
        ("windowTokens", rng.choice([200_000, None])),
        ("usedPercent", rng.choice([0.6, 50, None])),
        ("windowSource", rng.choice(["harness", "model-table", None])),
        ("compactions", rng.choice([0, 2, None])),
    ):
        if value is not None or rng.random() < 0.3:
            sub[key] = value
    return sub


def _account(rng: random.Random) -> Any:
    return rng.choice([
        {"key": rng.choice(ACCOUNTS), "label": "claude · max · ~/.claude-work"},
        {"key": rng.choice(ACCOUNTS)},
        {"key": rng.choice(ACCOUNTS), "label": "codex · alice@example.com · \x1b[31mred"},
        {"key": rng.choice(ACCOUNTS), "label": "l" * 300},
        {"key": "NOT-A-KEY", "label": "refused, so no account"},
        "a string, not an object",
        None,
    ])  # fmt: skip


def _prompt_cache(rng: random.Random) -> Any:
    return rng.choice([
        {"warm": True, "ttl": "5m", "expiresAtMs": NOW + 3 * MINUTE, "hitRatio": 0.92,
         "recacheTokensIfCold": 48_000, "cacheWriteTokens": 1200, "requests": 14, "misses": 1},
        {"warm": False, "ttl": "1h", "expiresAtMs": None, "recacheTokensIfCold": 90_000},
        {"warm": True, "expiresAtMs": NOW - MINUTE},
        {"warm": "yes"},  # malformed: read as no cache, the record kept
        {"warm": True, "hitRatio": 1.5},
    ])  # fmt: skip


def _record(rng: random.Random, identity: str, harness: str) -> dict[str, Any]:
    observed = NOW - rng.choice([0, 4_210, 59 * MINUTE, HOUR, HOUR + 1, 3 * HOUR, 50 * 24 * HOUR, -30_000, -2 * MINUTE])
    record: dict[str, Any] = {
        "schema": rng.choice(["st2.harness-context.v1", "st2.harness-context.v2"]),
        "agent": identity,
        "harness": harness,
        "usedTokens": rng.choice([92283, 0, 170_000, 2**53, None]),
        "windowTokens": rng.choice([258_400, 200_000, 1_000_000, None]),
        "usedPercent": _percent(rng) if rng.random() < 0.85 else None,
        "model": rng.choice(["gpt-5-codex", "claude-opus-4", None, "model \u202e evil"]),
        "costUsd": rng.choice([None, 0.0, 1.2345, 12]),
        "sessionTotalTokens": rng.choice([None, 2_235_329]),
        "rateLimits": rng.choice(
            [
                None,
                {"fiveHour": 31.0, "sevenDay": 55.0},
                {"fiveHour": 97},
                {"sevenDay": None},
                {"fiveHour": _percent(rng), "sevenDay": _percent(rng)},
            ]
        ),
        "compactions": rng.choice([0, 3]),
        "lastCompactionMs": rng.choice([None, NOW - 10 * MINUTE]),
        "lastCompactionTrigger": rng.choice([None, "manual", "auto", "a-word-from-the-future"]),
        "compactAtTokens": rng.choice([None, 160_000, 80_000]),
        "autoCompaction": rng.choice([None, True, False]),
        "harnessVersion": rng.choice([None, "2.1.332", "0.171.0", "9.9.9"]),
        "sessionId": rng.choice([None, "ses_01HZX"]),
        "incarnation": "inc-" + identity,
        "observedAtMs": observed,
        "writtenAtMs": observed,
    }
    if rng.random() < 0.3:
        record["subagents"] = [_subagent(rng, index) for index in range(rng.choice([1, 2, 3]))]
    if rng.random() < 0.6:
        record["account"] = _account(rng)
    if rng.random() < 0.4:
        record["rateLimitResetsAtMs"] = rng.choice(
            [{"fiveHour": NOW + HOUR, "sevenDay": NOW - HOUR}, {"fiveHour": -1}, "soon", None]
        )
    if rng.random() < 0.4:
        record["rateLimitsAtMs"] = rng.choice(
            [
                {"fiveHour": NOW - 2 * MINUTE, "sevenDay": NOW - 3 * HOUR},
                {"fiveHour": NOW + 10 * MINUTE},
                {"sevenDay": True},
                None,
            ]
        )
    if rng.random() < 0.3:
        record["promptCache"] = _prompt_cache(rng)
    if rng.random() < 0.2:
        record["somethingNew"] = {"additive": [1, 2, 3]}
    required = ("schema", "agent", "harness", "incarnation", "observedAtMs", "writtenAtMs")
    for key in [key for key in record if key not in required and rng.random() < 0.08]:
        del record[key]  # absent is null for every optional field
    return record


# Records no reader takes, each for its own reason (the warning names it).
_REFUSED: tuple[Any, ...] = (
    ("usedTokens", -1),
    ("usedTokens", 1.5),
    ("usedTokens", "92283"),
    ("usedPercent", True),
    ("usedPercent", "33"),
    ("usedPercent", 2**53 + 1),
    ("schema", "st2.harness-context.v9"),
    ("schema", ["st2.harness-context.v1"]),
    ("harness", "nonesuch"),
    ("harness", None),
    ("observedAtMs", -5),
    ("observedAtMs", None),
    ("compactions", None),
    ("autoCompaction", "true"),
    ("subagents", [{"id": "bad\u0007id", "state": "running", "observedAtMs": NOW}]),
    ("subagents", [{"id": f"s{i}", "state": "running", "observedAtMs": NOW} for i in range(17)]),
    ("model", "nul \u0000 inside"),
    ("harnessVersion", "v" * 65),
    ("lastCompactionMs", 1e3),
)
_BROKEN_BYTES = (
    b"",
    b"{",
    b"[1, 2, 3]\n",
    b'{"schema": "st2.harness-context.v1", "usedPercent": NaN}',
    b"\xef\xbb\xbf{}",
    b"\xff\xfe{\x00}\x00",
    b'{"schema": "st2.harness-context.v1", "model": "\\ud800"}',
    b"[" * 100_000,
    b"not json at all \x1b[2J",
)


def _record_bytes(rng: random.Random, identity: str, harness: str) -> bytes | None:
    roll = rng.random()
    if roll < 0.08:
        return None
    if roll < 0.14:
        return rng.choice(_BROKEN_BYTES)
    record = _record(rng, identity, harness)
    if roll < 0.32:
        key, value = rng.choice(_REFUSED)
        record[key] = value
    return (json.dumps(record, ensure_ascii=rng.random() < 0.5) + "\n").encode()


def _claim(rng: random.Random, identity: str, host: str, harness: str) -> bytes | None:
    roll = rng.random()
    if roll < 0.15:
        return None
    claim: dict[str, Any] = {
        "schema": "st2.harness-state.v1",
        "agent": identity,
        "host": host,
        "harness": harness,
        "incarnation": "inc-" + identity,
        "claimedAtMs": NOW - 10 * MINUTE,
        "wrapperPid": rng.choice([os.getpid(), DEAD_PID]),
        "desiredState": rng.choice(["running", "stopped"]),
        "history": rng.choice([[], [{"incarnation": "inc-old", "claimedAtMs": NOW - HOUR, "wrapperPid": 12}]]),
    }
    if rng.random() < 0.4:
        claim["account"] = _account(rng)
    if roll < 0.25:
        claim[rng.choice(["schema", "wrapperPid", "desiredState", "harness"])] = rng.choice(["bogus", -1, None])
    elif roll < 0.28:
        return b"\x00\x01 not a claim"
    return (json.dumps(claim) + "\n").encode()


def build(catalog: Path, seed: int, agents: int = AGENTS_PER_CATALOG) -> None:
    """The seed's catalog under `catalog` (created)."""
    rng = random.Random(seed)
    root = catalog / "agents"
    for index in range(agents):
        host = rng.choice(HOSTS)
        identity = rng.choice(["agent", "builder", "w", "x-1.2"]) + f"-{index:03d}"
        harness = rng.choice(HARNESSES)
        directory = root / host / identity
        directory.mkdir(parents=True)
        shape = rng.random()
        if shape < 0.03:
            (directory / "harness-context").symlink_to("/etc/hostname")
        elif shape < 0.05:
            (directory / "harness-context").mkdir()
        elif shape < 0.07:
            (directory / "harness-context").write_bytes(b'{"pad": "' + b"x" * (70 * 1024) + b'"}')
        else:
            data = _record_bytes(rng, identity, harness)
            if data is not None:
                (directory / "harness-context").write_bytes(data)
        claim = _claim(rng, identity, host if rng.random() < 0.9 else "elsewhere", harness)
        if claim is not None:
            (directory / "harness-state").write_bytes(claim)
    # Entries that are no agent's: each a warning, none a row.
    root.mkdir(parents=True, exist_ok=True)
    if seed % 2 == 0:
        (root / "README").write_text("not a host\n")
        (root / HOST / "stray-file").write_text("not an agent\n") if (root / HOST).is_dir() else None
        (root / "Bad Name").mkdir()
    if seed % 3 == 0:
        (root / "linked-host").symlink_to(root / HOST if (root / HOST).is_dir() else root)


def main(out: Path) -> int:
    """Write `<seed>.out`, `<seed>.err` and `<seed>.code` for every seed with the checked-out code."""
    import contextlib
    import io
    import tempfile

    sys.path.insert(0, str(REPO))
    from wrapper.cli import main as hctx
    from wrapper.readers import roster

    roster.now_ms = lambda: NOW  # type: ignore[assignment]  # the generator's clock, as the tests pin it
    out.mkdir(parents=True, exist_ok=True)
    for seed in SEEDS:
        with tempfile.TemporaryDirectory() as scratch:
            catalog = Path(scratch) / "catalog"
            build(catalog, seed)
            stdout, stderr = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                code = hctx(["agents", "--json", "--catalog", str(catalog), "--host", HOST])
            (out / f"{seed}.out").write_text(stdout.getvalue())
            (out / f"{seed}.err").write_text(stderr.getvalue().replace(str(catalog), "CATALOG"))
            (out / f"{seed}.code").write_text(f"{code}\n")
            # One agent's object too (`agents NAME --json`): the first of this host's, fanned in as the roster is.
            first = sorted(path.name for path in (catalog / "agents" / HOST).iterdir())[0]
            stdout = io.StringIO()
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(io.StringIO()):
                hctx(["agents", f"{HOST}/{first}", "--json", "--catalog", str(catalog), "--host", HOST])
            (out / f"{seed}.one").write_text(stdout.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
