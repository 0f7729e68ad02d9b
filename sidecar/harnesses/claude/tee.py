"""Claude Code's status-line tee and hook forwarder: stdin JSON to the sidecar's channel.

`hctx-statusline` (the settings' statusLine command) records the payload, then runs the operator's
own renderer on the same bytes and prints exactly what it printed (HC-R18, DQ-C2), the first of:
    1. $ST_CLAUDE_STATUSLINE_RENDERER, a shell command line (hctx wrap sets it to the statusLine
       the user had in .claude/settings.local.json, the file hctx renders into)
    2. ~/.claude/statusline-renderer.json -> "command"
    3. the status line Claude would show without hctx: "statusLine" -> "command" in the next file
       of Claude's own precedence (managed > --settings > .claude/settings.local.json >
       .claude/settings.json > ~/.claude/settings.json; the two above the local file would have
       beaten hctx's too, so the tee never runs under them), that is
       $HCTX_CLAUDE_PROJECT_DIR/.claude/settings.json (else the cwd's), then
       $CLAUDE_CONFIG_DIR/settings.json (else ~/.claude/settings.json)
    4. where that file's statusLine is hctx's own (`hctx setup` put it there, issue 36), the one it
       replaced, which setup keeps beside it: "statusLine" -> "command" in
       $CLAUDE_CONFIG_DIR/hctx-renderers.json (else ~/.claude/hctx-renderers.json); so it ranks
       where Claude ranks the user's settings, below a project's own status line, and counts only
       while the user's settings still run hctx's tee
None resolving, or a renderer that cannot start or exits non-zero, leaves stdout empty (a slot
echoing machine JSON is worse than a blank one) and says why on stderr, naming every source.

`hctx-subagent-statusline` (the settings' `subagentStatusLine` command, issue 37) records the payload
Claude hands it (`tasks[]`, one row a Task subagent: `id`, `model`, `contextWindowSize`, `tokenCount`,
...) and answers Claude's row protocol with the operator's own `subagentStatusLine`: its stdout, one
`{"id", "content"}` JSON object a line, passed through byte for byte, the first of
$ST_CLAUDE_SUBAGENT_STATUSLINE_RENDERER (hctx wrap sets it to the one the user had in
.claude/settings.local.json), then "subagentStatusLine" -> "command" in the project's
.claude/settings.json, in $CLAUDE_CONFIG_DIR/settings.json (else ~/.claude/settings.json) and, where
that is hctx's own, in hctx-renderers.json beside it (what `hctx setup` moved there). None,
or one that fails, prints nothing: Claude then draws its own rows (an empty answer decorates none).

`hctx-hook` (PreCompact / PostCompact / SessionStart) forwards the payload and prints nothing.

A Claude started without `hctx wrap` (no $HCTX_CHANNEL: the user-level settings `hctx setup` wrote
run the tee) is adopted (issue 36): the frame goes to the adoption channel of the Claude process
that ran the tee (`sidecar.adoption`); the first call of either kind finds nothing listening there
and starts `hctx adopt` for that Claude, handing it the frame, so none is lost.

Claude spawns the tee every few seconds per seat and waits for it, so the rendered settings run it
under `python -I -S` (sidecar.harnesses.claude.launch) and it imports only C modules the interpreter loads
in microseconds: no json (it pulls in re), no socket (enum), no subprocess, not even os, nothing
of hctx but its own frames (`sidecar.harnesses.claude.frames`; scripts/bench_statusline.py
measures it).
Both entry points always drain stdin and never fail the harness.
"""

import posix  # os itself, minus the ~1 ms of Python modules os.py imports around it
import select
import sys
import time

from sidecar.adoption import CHANNEL_NAME, REFUSED_NAME, adoption_dir, deliver, process_stat
from sidecar.harnesses.claude.frames import (
    HOOK_FRAME,
    STATUSLINE_FRAME,
    SUBAGENT_STATUSLINE_FRAME,
    channel_line,
    load_json,
)

__all__ = [
    "ADOPTER_TIMEOUT_S",
    "CHANNEL_ENV",
    "CHANNEL_TIMEOUT_S",
    "INSIDE_RENDERER_ENV",
    "MAX_RENDERED_BYTES",
    "MAX_STDIN_BYTES",
    "NO_ADOPT_ENV",
    "PROJECT_DIR_ENV",
    "RENDERERS_FILE",
    "RENDERER_ENV",
    "RENDERER_FILE",
    "RENDER_TIMEOUT_S",
    "SHELLS",
    "SOURCES",
    "SUBAGENT_RENDERER_ENV",
    "SUBAGENT_SOURCES",
    "TEE_MODULE",
    "claude_process",
    "hook_main",
    "main",
    "render",
    "resolve_renderer",
    "statusline_main",
    "subagent_statusline_main",
]

RENDERER_ENV = "ST_CLAUDE_STATUSLINE_RENDERER"
RENDERER_FILE = "~/.claude/statusline-renderer.json"
# Beside the user's settings.json: the statusLine and subagentStatusLine `hctx setup` replaced there.
RENDERERS_FILE = "hctx-renderers.json"
PROJECT_DIR_ENV = "HCTX_CLAUDE_PROJECT_DIR"
CHANNEL_ENV = "HCTX_CHANNEL"
NO_ADOPT_ENV = "HCTX_NO_ADOPT"  # sidecar.adoption.ADOPT_ENV_GUARDS: this session is never adopted
# In a statusLine found in Claude's settings: hctx's own tee is no renderer (see INSIDE_RENDERER_ENV).
TEE_MODULE = "sidecar.harnesses.claude.tee"
_EARLIER_TEE_MODULE = "sidecar.claude_tee"  # what an earlier install rendered
_OWN_TEE = "running hctx's own tee"
# Set for the renderer: a renderer that is (or calls) the tee again must not recurse without end.
INSIDE_RENDERER_ENV = "HCTX_INSIDE_STATUSLINE_RENDERER"
SOURCES = f"${RENDERER_ENV}, {RENDERER_FILE}, .claude/settings.json and ~/.claude/settings.json"
SUBAGENT_RENDERER_ENV = "ST_CLAUDE_SUBAGENT_STATUSLINE_RENDERER"
SUBAGENT_SOURCES = f"${SUBAGENT_RENDERER_ENV}, .claude/settings.json and ~/.claude/settings.json"

# Kept for the renderer beyond that; past it stdin is drained and dropped.
MAX_STDIN_BYTES = 4 * 1024 * 1024
MAX_RENDERED_BYTES = 1024 * 1024
CHANNEL_TIMEOUT_S = 1.0
RENDER_TIMEOUT_S = 10.0


def _env(name: str) -> str | None:
    value = posix.environ.get(name.encode())
    return None if value is None else value.decode(errors="surrogateescape")


def _say(prog: str, message: str) -> None:
    try:  # noqa: SIM105 - contextlib costs an import on every render
        posix.write(2, f"{prog}: {message}\n".encode(errors="replace"))
    except OSError:
        pass


def _drain_stdin() -> tuple[bytes, bool]:
    """Everything on stdin (reading to EOF, so Claude never meets EPIPE) and whether it fit."""
    chunks: list[bytes] = []
    size = 0
    fits = True
    while True:
        try:
            chunk = posix.read(0, 65536)
        except InterruptedError:
            continue
        except OSError:
            break
        if not chunk:
            break
        size += len(chunk)
        if size > MAX_STDIN_BYTES:
            fits = False
            chunks.clear()
        elif fits:
            chunks.append(chunk)
    return b"".join(chunks), fits


# --- the channel --------------------------------------------------------------------------------


def _send(prefix: bytes, data: bytes) -> str | None:
    """Send one frame to $HCTX_CHANNEL, or, in a Claude started without `hctx wrap`, to its adoption's
    channel (`_adopt`); None when sent (or handed to the adopter), else why it was not."""
    path = _env(CHANNEL_ENV)
    try:
        line = channel_line(prefix, data)
    except ValueError as exc:
        return str(exc)
    if not path:
        if _env(NO_ADOPT_ENV):
            return f"${CHANNEL_ENV} is not set and ${NO_ADOPT_ENV} is: not recorded"
        return _adopt(line)
    problem = _deliver(path, line)
    return None if problem is None else f"no sidecar at {path} ({problem}): not recorded"


def _deliver(path: str, line: bytes) -> str | None:
    return deliver(path, line, CHANNEL_TIMEOUT_S)


# --- adoption (issue 36): a Claude started without `hctx wrap` -----------------------------------
# Claude runs every statusLine and hook command through `/bin/sh -c`, so the tee's parent is that
# shell and Claude is the shell's parent (measured 2026-12-05 on 2.1.250 and 2.1.332, interactive
# and 2.1.332's `claude --bg` sessions alike: python <- sh <- claude.exe). A shell that execs its
# last command leaves Claude the parent itself; both are taken.
SHELLS = ("sh", "dash", "bash", "zsh", "ash", "busybox")
ADOPTER_TIMEOUT_S = 0.5  # the most the tee waits to hand its line to the adopter's stdin


def claude_process() -> tuple[int, int] | None:
    """(pid, start ticks) of the Claude that ran this command, or None when the parents are gone."""
    pid = posix.getppid()
    for _ in range(3):
        stat = process_stat(pid)
        if stat is None:
            return None
        command, parent, start = stat
        if command not in SHELLS:
            return pid, start
        pid = parent
    return None


def _adopt(line: bytes) -> str | None:
    """The line to the adopted Claude's sidecar (`sidecar.adoption.adoption_channel`); when none
    listens there yet, `hctx adopt` is started for Claude with the line on its stdin (it delivers
    it once the sidecar listens), unless an adopter refused this Claude before."""
    found = claude_process()
    if found is None:
        return f"${CHANNEL_ENV} is not set and Claude's process is gone: not recorded"
    pid, start = found
    directory = adoption_dir(pid, start)
    if _deliver(f"{directory}/{CHANNEL_NAME}", line) is None:
        return None
    try:
        refused = posix.stat(f"{directory}/{REFUSED_NAME}")
    except OSError:
        refused = None
    if refused is not None:
        return f"hctx adopt refused this session (see {directory}/{REFUSED_NAME}): not recorded"
    return _start_adopter(pid, line)


def _start_adopter(pid: int, line: bytes) -> str | None:
    """`hctx adopt --harness claude --pid PID --frame-stdin`, detached (a session of its own, stdout
    and stderr on /dev/null: Claude reads this process's output to its end), `line` on its stdin.
    Never waited for: it detaches at once, and this process exits before it would be reaped."""
    root = __file__.rsplit("/", 4)[0]  # the directory holding `sidecar` (and `wrapper`)
    code = f"import sys;sys.path.insert(0,{root!r});from wrapper.launch.adopt import main;sys.exit(main())"
    argv = [sys.executable, "-I", "-c", code, "--harness", "claude", "--pid", str(pid), "--frame-stdin"]
    read_end, write_end = posix.pipe()
    try:
        devnull = posix.open("/dev/null", posix.O_WRONLY)
        try:
            posix.posix_spawn(sys.executable, argv, posix.environ, setsid=True,
                              file_actions=[(posix.POSIX_SPAWN_DUP2, read_end, 0), (posix.POSIX_SPAWN_DUP2, devnull, 1),
                                            (posix.POSIX_SPAWN_DUP2, devnull, 2)])  # fmt: skip
        finally:
            posix.close(devnull)
            posix.close(read_end)
        _hand_over(write_end, line)
    except OSError as exc:
        return f"could not start hctx adopt ({exc.strerror or exc}): not recorded"
    finally:
        posix.close(write_end)
    return None


def _hand_over(fd: int, line: bytes) -> None:
    """`line` into the adopter's stdin; a line the pipe cannot take within ADOPTER_TIMEOUT_S is cut
    off (the adopter drops a partial line): Claude waits on this process."""
    posix.set_blocking(fd, False)
    view = memoryview(line)
    deadline = time.monotonic() + ADOPTER_TIMEOUT_S
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    while view and time.monotonic() < deadline:
        try:
            view = view[posix.write(fd, view) :]
        except BlockingIOError:
            poller.poll(50)


# --- the renderer -------------------------------------------------------------------------------


def resolve_renderer(key: str = "statusLine") -> tuple[str | None, str]:
    """(command, where it came from), or (None, why no source gave one): the status line's
    renderer, or with `key` "subagentStatusLine" the subagent rows' (which has no renderer file)."""
    variable = RENDERER_ENV if key == "statusLine" else SUBAGENT_RENDERER_ENV
    command = (_env(variable) or "").strip()
    if command:
        return command, f"${variable}"
    reasons = [f"${variable} is unset"]
    home = (_env("HOME") or "").rstrip("/")
    if not home and key == "statusLine":
        reasons.append(f"$HOME is unset, so {RENDERER_FILE} cannot be read")
    config = (_env("CLAUDE_CONFIG_DIR") or "").rstrip("/") or (home and home + "/.claude")
    project = (_env(PROJECT_DIR_ENV) or "").rstrip("/") or "."  # else the cwd, even a removed one
    sources: tuple[tuple[str, str | None], ...] = (
        (home + "/.claude/statusline-renderer.json" if home and key == "statusLine" else "", None),
        (project + "/.claude/settings.json", key),
        (config and config + "/settings.json", key),
    )
    why = ""
    for path, section in sources:
        if path:
            found, why = _file_command(path, section)
            if found is not None:
                return found, path
            reasons.append(why)
    if why.endswith(_OWN_TEE) and config:  # the user's settings hold hctx's: theirs is where setup kept it
        found, why = _file_command(config + "/" + RENDERERS_FILE, key)
        if found is not None:
            return found, config + "/" + RENDERERS_FILE
        reasons.append(why)
    return None, "; ".join(reasons)


def _file_command(path: str, key: str | None) -> tuple[str | None, str]:
    """The "command" string in the JSON object at `path` (in its `key` object when given), or (None, why not)."""
    try:
        with open(path, "rb") as file:
            raw = file.read(MAX_STDIN_BYTES)
    except OSError as exc:
        return None, f"{path} is unreadable ({exc.strerror or exc})"
    try:
        value = load_json(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None, f"{path} is not JSON"
    if key is not None:
        value = value.get(key) if isinstance(value, dict) else None
    command = value.get("command") if isinstance(value, dict) else None
    where = f'"{key}" -> "command"' if key else '"command"'
    if not isinstance(command, str) or not command.strip():
        return None, f"{path} has no {where} string"
    if TEE_MODULE in command or _EARLIER_TEE_MODULE in command:
        return None, f"{path} has {where} {_OWN_TEE}"
    return command.strip(), ""


def render(command: str, stdin: bytes, timeout_s: float = RENDER_TIMEOUT_S) -> tuple[bytes | None, str]:
    """Run `command` through /bin/sh with `stdin`; (its stdout, "") on exit 0, else (None, why)."""
    in_read, in_write = posix.pipe()
    out_read, out_write = posix.pipe()
    try:
        pid = posix.posix_spawn(
            "/bin/sh",
            ["sh", "-c", command],
            {**posix.environ, INSIDE_RENDERER_ENV.encode(): b"1"},
            file_actions=[(posix.POSIX_SPAWN_DUP2, in_read, 0), (posix.POSIX_SPAWN_DUP2, out_write, 1)],
            setpgroup=0,  # its own group, so a renderer past its deadline goes with everything it started
        )
    except OSError as exc:
        for fd in (in_read, in_write, out_read, out_write):
            posix.close(fd)
        return None, f"could not start /bin/sh ({exc.strerror or exc})"
    posix.close(in_read)
    posix.close(out_write)
    deadline = time.monotonic() + timeout_s
    output, timed_out = _exchange(in_write, out_read, stdin, timeout_s)
    status = None if timed_out else _wait_until(pid, deadline)
    if status is None:  # past the deadline, with or without its stdout closed: Claude is waiting
        timed_out = True
        try:  # noqa: SIM105 - see _say
            posix.killpg(pid, 9)
        except OSError:
            pass
        _, status = posix.waitpid(pid, 0)
    code = posix.waitstatus_to_exitcode(status)
    if timed_out:
        return None, f"did not finish within {timeout_s:g}s with under {MAX_RENDERED_BYTES} bytes of output"
    if code != 0:
        return None, f"exited {code}" if code > 0 else f"was killed by signal {-code}"
    return output, ""


def _wait_until(pid: int, deadline: float) -> int | None:
    """The child's wait status if it exits before `deadline`, else None (it is still running)."""
    delay = 0.001
    while True:
        reaped, status = posix.waitpid(pid, posix.WNOHANG)
        if reaped:
            return status
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, 0.05)


def _exchange(to_child: int, from_child: int, data: bytes, timeout_s: float) -> tuple[bytes, bool]:
    """Feed `data` and collect stdout together, so neither side can fill a pipe and stall."""
    posix.set_blocking(to_child, False)
    poller = select.poll()
    poller.register(from_child, select.POLLIN)
    writing = to_child if data else -1
    if writing >= 0:
        poller.register(to_child, select.POLLOUT)
    else:
        posix.close(to_child)
    chunks: list[bytes] = []
    sent = received = 0
    clock = time.monotonic()
    deadline = clock + timeout_s
    reading = True
    while reading and clock < deadline:
        for fd, _ in poller.poll(max(1, int((deadline - clock) * 1000))):
            if fd == from_child:
                chunk = posix.read(from_child, 65536)
                if chunk:
                    chunks.append(chunk)
                    received += len(chunk)
                    if received > MAX_RENDERED_BYTES:
                        break  # no status line is this long: treated like a renderer that hangs
                else:
                    reading = False
            elif fd == writing:
                try:
                    sent += posix.write(to_child, data[sent : sent + 65536])
                except BlockingIOError:
                    continue
                except OSError:  # the renderer closed its stdin early: its business
                    sent = len(data)
                if sent >= len(data):
                    poller.unregister(to_child)
                    posix.close(to_child)
                    writing = -1
        clock = deadline if received > MAX_RENDERED_BYTES else time.monotonic()
    if writing >= 0:
        posix.close(to_child)
    posix.close(from_child)
    return b"".join(chunks), reading


def _write_stdout(data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[posix.write(1, view) :]
        except InterruptedError:
            continue
        except OSError:
            return


# --- entry points -------------------------------------------------------------------------------


class _Line:
    """One of Claude's status-line settings the tee stands in for: what it forwards to the sidecar and
    whose renderer it chains. The two differ only in these words and in what an absent renderer
    means (the main line stays empty; without a subagent renderer Claude draws its own rows). A plain
    class: dataclasses would import inspect and re on the status line's path."""

    __slots__ = ("drawn", "frame", "prog", "setting", "silent_without_renderer", "sources")

    def __init__(
        self, prog: str, frame: bytes, setting: str, sources: str, drawn: str, *, silent_without_renderer: bool
    ) -> None:
        self.prog, self.frame, self.setting, self.sources = prog, frame, setting, sources
        self.drawn = drawn  # what the person sees when the user's renderer draws nothing
        self.silent_without_renderer = silent_without_renderer


_MAIN_LINE = _Line("hctx-statusline", STATUSLINE_FRAME, "statusLine", SOURCES,
                   "the status line stays empty", silent_without_renderer=False)  # fmt: skip
_SUBAGENT_LINE = _Line("hctx-subagent-statusline", SUBAGENT_STATUSLINE_FRAME, "subagentStatusLine",
                       SUBAGENT_SOURCES, "Claude draws its own rows", silent_without_renderer=True)  # fmt: skip


def _tee(line: _Line) -> int:
    data, fits = _drain_stdin()
    if not fits:
        _say(line.prog, f"stdin over {MAX_STDIN_BYTES} bytes: not recorded, {line.drawn}")
        return 0
    if _env(INSIDE_RENDERER_ENV):
        _say(line.prog, f"the renderer is the tee itself; point {line.sources} at the operator's own renderer")
        return 0
    problem = _send(line.frame, data)
    if problem:
        _say(line.prog, problem)
    command, origin = resolve_renderer(line.setting)
    if command is None:
        if not line.silent_without_renderer:  # the user has no subagent renderer: as without hctx
            _say(line.prog, f"no {line.setting} renderer: {origin}; {line.drawn} (sources: {line.sources})")
        return 0
    output, why = render(command, data)
    if output is None:
        _say(line.prog, f"{line.setting} {command!r} from {origin} {why}; {line.drawn} (sources: {line.sources})")
        return 0
    _write_stdout(output)  # verbatim: Claude parses a subagent renderer's `{"id","content"}` lines, not hctx
    return 0


def statusline_main() -> int:
    return _tee(_MAIN_LINE)


def subagent_statusline_main() -> int:
    return _tee(_SUBAGENT_LINE)


def hook_main() -> int:
    data, fits = _drain_stdin()
    problem = _send(HOOK_FRAME, data) if fits else "stdin too large: not recorded"
    if problem:
        _say("hctx-hook", problem)
    return 0


_ENTRY_POINTS = {"statusline": statusline_main, "subagentstatusline": subagent_statusline_main, "hook": hook_main}


def main(argv: list[str]) -> int:
    entry = _ENTRY_POINTS.get(argv[0]) if argv else None
    if entry is None:
        _say("hctx tee", f"usage: tee.py {{{'|'.join(_ENTRY_POINTS)}}} < payload.json")
        return 2
    return entry()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
