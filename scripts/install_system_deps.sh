#!/usr/bin/env bash
# Debian packages the tests drive: tmux (terminal tests: Ctrl-C, hctx top, Claude's TUI), jq (the
# README's examples), prometheus (the live `hctx metrics` test; promtool comes with it), syncthing and
# iproute2's ip (the two-daemon replication test, in a private network namespace), chromium (the
# `hctx web` browser tests, driven by Playwright with executable_path), and Debian's own python3
# with venv and pip (the README's first command on an externally managed Python), dbus-daemon (a
# real session bus for `hctx watch --notify dbus://`'s test) and the libdbus and GLib headers that
# dbus-python (apprise's desktop path, a test dependency) is built against. Installed only when
# missing, in one apt-get call; scripts/test runs it before pip, for dbus-python's build.
#
# The body is one function, read whole before it runs: bash reads a script as it executes it, so an
# edit to this file during a slow apt-get could otherwise run a line out of place.
set -euo pipefail

main() {
  local -A package=([tmux]=tmux [jq]=jq [prometheus]=prometheus [promtool]=prometheus [syncthing]=syncthing
    [ip]=iproute2 [chromium]=chromium [dbus-daemon]=dbus-daemon)
  local missing=() tool
  for tool in tmux jq prometheus promtool syncthing ip chromium dbus-daemon; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("${package[$tool]}")
  done
  # Debian's own python3 with venv and pip: the interpreter that refuses `pip install .` (PEP 668),
  # on which the README's first command is tested as printed.
  /usr/bin/python3 -c 'import ensurepip, pip, venv' >/dev/null 2>&1 || missing+=(python3 python3-venv python3-pip)
  pkg-config --exists dbus-1 2>/dev/null || missing+=(pkg-config libdbus-1-dev)
  pkg-config --exists glib-2.0 2>/dev/null || missing+=(pkg-config libglib2.0-dev)
  [ ${#missing[@]} -eq 0 ] && return 0
  mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
  if [ "$(id -u)" -ne 0 ]; then
    echo "install_system_deps: missing ${missing[*]}; install them (apt-get install ${missing[*]})" >&2
    return 1
  fi
  # Debian's prometheus and syncthing would start services (prometheus on every interface) from
  # their postinst. A policy-rc.d that refuses every start is put in place for the install, unless
  # the machine has one of its own (a container's), which is left as it is.
  local policy=/usr/sbin/policy-rc.d
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    trap 'rm -f -- /usr/sbin/policy-rc.d' EXIT
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

main "$@"
