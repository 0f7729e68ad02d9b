"""Issue 37: the prompt cache as Claude states it (2.1.332's status-line `prompt_cache`; 2.1.250
states none), in the record, in `agents` and `inspect`."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from readers_catalog import HOST, NOW, hctx, put_record

from guard.policy import Reading, WriteGuard
from guard.projection import cache_cold_in_ms
from guard.record import ContextFields, PromptCache
from sidecar.harnesses.claude import producer as claude
from sidecar.replay import replay_recording
from tests.conftest import FIXTURE_ROOT
from wrapper.readers.render import render_agents
from wrapper.readers.roster import collect_roster, now_ms

RECORDINGS = FIXTURE_ROOT / "recordings" / "claude"
CAPTURE = FIXTURE_ROOT / "claude" / "statusline-2.1.332.jsonl"


def stated_caches() -> list[dict[str, Any] | None]:
    """The `prompt_cache` of each payload of the lab's 2.1.332 session, read here independently."""
    return [json.loads(line).get("prompt_cache") for line in CAPTURE.read_bytes().splitlines()]


def test_2_1_332_states_its_prompt_cache_and_the_record_carries_it_as_stated() -> None:
    writes, summary = replay_recording(claude.SPEC, RECORDINGS / "session-2.1.332.rec")
    assert not summary.problems
    last = stated_caches()[-1]
    assert last is not None
    cache = writes[-1].record.prompt_cache
    assert cache == PromptCache(
        warm=last["warm"], ttl=last["ttl"], expires_at_ms=None, hit_ratio=last["hit_ratio"],
        recache_tokens_if_cold=last["recache_tokens_if_cold"], cache_write_tokens=last["cache_write_tokens"],
        requests=last["requests"], misses=last["misses"],
    )  # fmt: skip
    warm = [w.record.prompt_cache for w in writes if w.record.prompt_cache and w.record.prompt_cache.warm]
    stated = {c["expires_at"] * 1000 for c in stated_caches() if c and c["warm"]}
    assert warm and {c.expires_at_ms for c in warm} <= stated  # epoch seconds, in ms, as stated
    assert writes[0].record.prompt_cache is None  # before the first reply Claude states none
    assert json.loads(writes[-1].record.to_json())["promptCache"]["recacheTokensIfCold"] == 12_500


def test_2_1_250_states_none_so_the_record_keeps_its_bytes() -> None:
    writes, _ = replay_recording(claude.SPEC, RECORDINGS / "session-2.1.250.rec")
    assert writes and all(w.record.prompt_cache is None for w in writes)
    assert all("promptCache" not in json.loads(w.record.to_json()) for w in writes)


def test_a_change_of_warmth_or_expiry_is_written_within_one_bucket() -> None:
    """A 5-minute cache outlives no 5-minute heartbeat: when it goes cold is written when it moves."""
    guard = WriteGuard("a", "i")

    def offer(expires: int | None, warm: bool, at: int) -> str | None:
        cache = PromptCache(warm=warm, expires_at_ms=expires)
        fields = ContextFields(harness="claude", used_tokens=20_001, window_tokens=200_000, used_percent=10,
                               prompt_cache=cache, observed_at_ms=at)  # fmt: skip
        write = guard.offer(Reading(fields), at)
        if write is not None:
            guard.committed(write)
        return None if write is None else write.reason

    assert offer(NOW + 300_000, True, NOW) == "bucket"
    assert offer(NOW + 300_000, True, NOW + 5_000) is None  # a refresh restating it
    assert offer(NOW + 305_000, True, NOW + 10_000) == "prompt-cache"
    assert offer(None, False, NOW + 15_000) == "prompt-cache"


@pytest.mark.parametrize(
    ("cache", "left"),
    [
        (PromptCache(warm=True, expires_at_ms=NOW + 90_000), 90_000),
        (PromptCache(warm=True, expires_at_ms=NOW - 1), 0),
        (PromptCache(warm=False), None),
        (PromptCache(warm=True), None),
        (None, None),
    ],
)
def test_time_to_cold(cache: PromptCache | None, left: int | None) -> None:
    assert cache_cold_in_ms(cache, NOW) == left


def put(catalog: Path, name: str, cache: dict[str, Any] | None) -> None:
    fields = {"harness": "claude", "observedAtMs": NOW - 1000}
    put_record(catalog, name, **fields, **({} if cache is None else {"promptCache": cache}))


def test_agents_shows_when_each_cache_goes_cold_and_what_a_cold_one_costs(tmp_path: Path) -> None:
    put(tmp_path, "warm-one", {"warm": True, "ttl": "5m", "expiresAtMs": NOW + 192_000})
    put(tmp_path, "cold-one", {"warm": False, "expiresAtMs": None, "recacheTokensIfCold": 754_995})
    put(tmp_path, "codex-like", None)
    rows = collect_roster(tmp_path, NOW, here=HOST, alive=lambda _pid: False).rows
    lines = render_agents(rows, colour=False, now=NOW).splitlines()
    assert lines[0].split()[-1] == "CACHE"
    by_agent = {line.split()[1]: line for line in lines[1:]}
    assert by_agent["warm-one"].rstrip().endswith("warm 3m12s")
    assert by_agent["cold-one"].rstrip().endswith("cold ↻755k")
    assert by_agent["codex-like"].rstrip().endswith("-")
    # Without a stated cache anywhere, no column.
    assert "CACHE" not in render_agents([r for r in rows if r.identity == "codex-like"], colour=False, now=NOW)
    agents = json.loads(hctx("agents", "--json", "--catalog", str(tmp_path)).stdout)
    contexts = {a["identity"]: a["context"] for a in agents}
    assert contexts["cold-one"]["promptCache"]["recacheTokensIfCold"] == 754_995
    assert "promptCache" not in contexts["codex-like"]


def test_inspect_says_each_stated_figure(tmp_path: Path) -> None:
    put(tmp_path, "alpha", {"warm": True, "ttl": "5m", "expiresAtMs": NOW + 192_000, "hitRatio": 0.8254,
                            "recacheTokensIfCold": 754_995, "requests": 3, "misses": 0})  # fmt: skip
    done = hctx("inspect", "alpha", "--catalog", str(tmp_path))
    [line] = [line for line in done.stdout.splitlines() if "prompt cache" in line]
    assert "warm" in line and str(NOW + 192_000) in line and "hit ratio 0.825" in line
    assert "re-cache if cold 754995 tokens" in line and "requests 3" in line and "misses 0" in line


def test_hctx_cache_lists_the_warm_caches_soonest_to_go_cold_first(tmp_path: Path) -> None:
    """Issue 37's fleet view: each agent with a stated warm cache, the soonest cold first, with when
    and the tokens a re-cache writes; a cold cache, an unstated one and no cache are not listed."""
    now = now_ms()
    put(tmp_path, "later", {"warm": True, "ttl": "1h", "expiresAtMs": now + 3_000_000, "recacheTokensIfCold": 40_000})
    put(tmp_path, "soon", {"warm": True, "ttl": "5m", "expiresAtMs": now + 90_000, "recacheTokensIfCold": 754_995,
                           "hitRatio": 0.8254})  # fmt: skip
    put(tmp_path, "middle", {"warm": True, "expiresAtMs": now + 200_000})
    put(tmp_path, "cold-one", {"warm": False, "expiresAtMs": None, "recacheTokensIfCold": 12_500})
    put(tmp_path, "codex-like", None)
    done = hctx("cache", "--catalog", str(tmp_path))
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["HOST", "AGENT", "HARNESS", "COLD", "IN", "AT", "RE-CACHE", "TTL", "HIT"]
    assert [line.split()[1] for line in lines[1:]] == ["soon", "middle", "later"]
    soon = lines[1].split()
    assert soon[3].startswith("1m") and soon[5:] == ["755k", "5m", "83%"]
    assert re.fullmatch(r"\d\d:\d\d:\d\dZ", soon[4])
    assert lines[2].split()[5:] == ["-", "-", "-"]  # what the harness did not state, never a number
    listed = json.loads(hctx("cache", "--json", "--catalog", str(tmp_path)).stdout)
    assert [item["identity"] for item in listed] == ["soon", "middle", "later"]
    first = listed[0]
    assert first["cacheExpiresAtMs"] == now + 90_000 and first["recacheTokensIfCold"] == 754_995
    assert 0 < first["cacheColdInMs"] <= 90_000 and first["promptCache"]["hitRatio"] == 0.8254
    empty = tmp_path / "empty"
    put(empty, "codex-like", None)
    assert hctx("cache", "--catalog", str(empty)).stdout == "no warm prompt cache stated\n"
    assert json.loads(hctx("cache", "--json", "--catalog", str(empty)).stdout) == []
