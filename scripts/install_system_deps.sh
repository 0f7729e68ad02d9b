#!/usr/bin/env bash
# Debian packages the tests drive: tmux (terminal tests: Ctrl-C, hctx top, Claude's TUI) and jq (the
# README's examples). Installed only when missing.
set -euo pipefail
missing=()
for tool in tmux jq; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "install_system_deps: missing ${missing[*]}; install them (apt-get install ${missing[*]})" >&2
  exit 1
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
