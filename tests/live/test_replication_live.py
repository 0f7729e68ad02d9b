"""Live: host A's catalog replicated to host B by two real Syncthing daemons, docs/replication.md's way.

The scenario runs once, in `tests/live/syncthing_pair.py` under `unshare -n` (a private network
namespace holding only loopback, so nothing but loopback traffic is even possible); these tests
assert what it observed. Debian's `syncthing` is installed by scripts/install_system_deps.sh.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from typing import Any

import pytest

from guard.constants import CONTEXT_RECORD_NAME, REPLICATED_RECORD_NAMES
from tests.live.syncthing_pair import BURST_WRITES, HOST_A, PULSES
from tests.wrapping import REPO, pid_gone
from wrapper.demo import FLEET

pytestmark = pytest.mark.live

DRIVER = REPO / "tests" / "live" / "syncthing_pair.py"
IDENTITIES = sorted([*(agent.identity for agent in FLEET), "burst", "pulse", "relaunched"])
# A 1 s watcher delay, then a few blocks over loopback: well under this, or something is wrong.
LATENCY_BOUND_MS = 5000


def _missing() -> str | None:
    tools = [tool for tool in ("syncthing", "unshare", "ip") if shutil.which(tool) is None]
    if tools:
        return f"{', '.join(tools)} not installed; run scripts/install_system_deps.sh (Debian's syncthing)"
    return None


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    reason = _missing()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI requires the real Syncthing", pytrace=False)
        pytest.skip(reason)
    work = tmp_path_factory.mktemp("syncthing")
    # As root a network namespace of its own; otherwise inside a user namespace that maps us to root.
    unshare = ["unshare", "--net"] if os.geteuid() == 0 else ["unshare", "--map-root-user", "--net"]
    run = subprocess.run([*unshare, sys.executable, str(DRIVER), str(work)], capture_output=True, text=True,
                         timeout=600, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    result_path = work / "result.json"
    assert result_path.exists(), f"the driver wrote no result: {run.returncode}\n{run.stderr[-4000:]}"
    result: dict[str, Any] = json.loads(result_path.read_text())
    if "error" in result:
        logs = "".join(f"\n--- {log}\n{log.read_text()[-3000:]}" for log in sorted(work.glob("*/syncthing/*.log")))
        pytest.fail(f"{result['error']}\n{run.stderr[-4000:]}{logs}", pytrace=False)
    return result


def _options(config: str) -> dict[str, str]:
    root = ET.fromstring(config)
    options = root.find("options")
    assert options is not None
    return {child.tag: child.text or "" for child in options}


def test_both_daemons_run_with_only_loopback_and_every_outward_feature_off(observed: dict[str, Any]) -> None:
    assert observed["interfaces"] == ["lo"]
    for host, config in observed["configured"].items():
        options = _options(config)
        for key in ("globalAnnounceEnabled", "localAnnounceEnabled", "relaysEnabled", "natEnabled",
                    "crashReportingEnabled", "startBrowser"):  # fmt: skip
            assert options[key] == "false", (host, key)
        assert (options["urAccepted"], options["autoUpgradeIntervalH"]) == ("-1", "0")
        assert re.fullmatch(r"tcp://127\.0\.0\.1:[0-9]+", options["listenAddress"]), host
        gui = ET.fromstring(config).find("gui/address")
        assert gui is not None and (gui.text or "").startswith("127.0.0.1:")
    for host, devices in observed["devices"].items():
        (peer,) = [device for device in devices if device["name"] != host]  # the other daemon, statically
        assert re.fullmatch(r"tcp://127\.0\.0\.1:[0-9]+", "".join(peer["addresses"])), host


def test_the_ignore_file_is_the_readmes_and_includes_exactly_the_pinned_names(observed: dict[str, Any]) -> None:
    readme = (REPO / "docs" / "replication.md").read_text()
    assert observed["readme_block"] in re.findall(r"```sh\n(.*?)```", readme, re.S)  # what ran is docs/replication.md's
    printed = subprocess.run([sys.executable, "-m", "wrapper.cli", "replication", "syncthing", "--catalog",
                              observed["a_catalog"]], capture_output=True, text=True, check=True, cwd=REPO)  # fmt: skip
    assert observed["stignore"] == printed.stdout
    patterns = [line for line in observed["stignore"].splitlines() if line and not line.startswith("//")]
    assert patterns == [*(f"!/*/*/{name}" for name in REPLICATED_RECORD_NAMES), "*"]
    assert REPLICATED_RECORD_NAMES == ("harness-state", "harness-context")
    folder = observed["folder_config"][HOST_A]
    for key, value in observed["settings"].items():
        assert folder[key] == value if key != "versioning" else folder[key]["type"] == "", key
    assert (folder["fsWatcherDelayS"], folder["maxConflicts"], folder["ignoreDelete"]) == (1, 0, False)
    assert observed["folder_config"]["host-b"]["type"] == "receiveonly"


def test_every_record_arrives_on_b_and_b_lists_it_with_host_a(observed: dict[str, Any]) -> None:
    a_rows, b_listing = observed["a_roster"], observed["b_roster"]
    assert b_listing["stderr"] == ""
    b_rows = b_listing["stdout"]
    assert [(row["host"], row["identity"]) for row in b_rows] == [(HOST_A, name) for name in IDENTITIES]
    assert [(row["host"], row["identity"]) for row in a_rows] == [(HOST_A, name) for name in IDENTITIES]

    def reading(row: dict[str, Any]) -> Any:
        context = row["context"]
        return None if context is None else {k: v for k, v in context.items() if k not in ("ageMs", "stale")}

    assert [reading(row) for row in b_rows] == [reading(row) for row in a_rows]
    assert [row["harness"] for row in b_rows] == [row["harness"] for row in a_rows]
    assert sum(row["context"] is not None for row in b_rows) == len(IDENTITIES) - 1  # relaunched: removed
    assert any("advisory: host-a/" in line for line in observed["b_doctor"].splitlines())  # the demo's 83%


def test_200_replacements_on_a_are_never_seen_torn_on_b(observed: dict[str, Any]) -> None:
    watch = observed["watch"]
    assert observed["burst_writes_on_a"] == BURST_WRITES
    assert watch["torn"] == []
    assert watch["reads"] > 10 * BURST_WRITES  # B's records were read over and over, every read parsed
    assert observed["latency_ms"]["burst_versions_seen_on_b"] >= 1


def test_staging_lock_log_and_temporary_files_never_appear_on_b(observed: dict[str, Any]) -> None:
    assert observed["watch"]["forbidden"] == []
    records = {f"{HOST_A}/{name}/{record}" for name in IDENTITIES for record in REPLICATED_RECORD_NAMES}
    removed = f"{HOST_A}/relaunched/{CONTEXT_RECORD_NAME}"
    assert observed["b_tree"] == sorted({".stignore", *records} - {removed})
    a_modes, b_modes = observed["modes"][HOST_A], observed["modes"]["host-b"]
    assert set(b_modes) < set(a_modes) and all(b_modes[path] == a_modes[path] for path in b_modes)
    assert f"{HOST_A}/.harness-context.tmp-4242-7" in a_modes  # the legacy file A holds stayed home


def test_a_relaunch_claims_removal_propagates(observed: dict[str, Any]) -> None:
    relaunch = observed["relaunch"]
    assert relaunch["oldIncarnation"] != relaunch["newIncarnation"]
    assert (relaunch["recordOnA"], relaunch["recordOnB"]) == (False, False)
    assert relaunch["rosterOnB"]["context"] is None and relaunch["rosterOnB"]["host"] == HOST_A


def test_b_readers_print_no_warning_while_syncthing_is_writing(observed: dict[str, Any]) -> None:
    watch = observed["watch"]
    assert watch["temporaries"], "Syncthing's .syncthing.*.tmp files were never seen: nothing was written meanwhile"
    assert watch["readerWarnings"] == [] and watch["rosterPasses"] > 100
    runs = observed["reader_runs"]
    assert len(runs) > 20
    assert [run for run in runs if run["status"] != 0 or run["stderr"]] == []
    assert {tuple(run["command"]) for run in runs} == {("agents", "--json"), ("doctor",), ("top", "--once"),
                                                        ("agents",)}  # fmt: skip


def test_replication_latency(observed: dict[str, Any], record_property: Any) -> None:
    latency = observed["latency_ms"]
    assert len(latency["pulse"]) == PULSES  # every isolated write was seen arriving
    record_property("replication_latency_median_ms", latency["median"])
    record_property("replication_latency_p95_ms", latency["p95"])
    print(f"\nreplication latency over {PULSES} writes: median {latency['median']} ms, p95 {latency['p95']} ms")
    assert 0 < latency["median"] <= latency["p95"] < LATENCY_BOUND_MS


def test_both_daemons_it_started_are_stopped(observed: dict[str, Any]) -> None:
    assert all(status is not None for status in observed["daemon_exit"].values())
    assert all(pid_gone(pid) for pid in observed["daemon_pids"])
    assert observed["folder_errors"][HOST_A]["errors"] is None and observed["folder_errors"]["host-b"]["errors"] is None
