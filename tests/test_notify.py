"""`hctx watch --notify` (issue 38.1) against real receivers on 127.0.0.1: an HTTP server asserting
each service's request (ntfy, a Slack-style webhook, a JSON webhook), a real SMTP server (aiosmtpd),
and a real D-Bus session bus (Debian's dbus-daemon) with a notification server of the test's own;
a dead, a hanging and a failing target each cost only themselves."""

from __future__ import annotations

import email
import email.policy
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import trio
from readers_catalog import HOST, put_record

from tests.conftest import REPO
from tests.test_watch import NOW, context, process_logged
from wrapper.readers.account_watch import RateLimitEvent
from wrapper.readers.accounts import AccountGroup, Snapshot
from wrapper.readers.notify import Notice, Notifier, Target, board_link, notice_of, read_targets, target_of
from wrapper.readers.roster import AgentRow
from wrapper.readers.watch import Event


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float = field(default_factory=time.monotonic)


class Receiver:
    """A loopback HTTP server: `/hang` answers after a minute (or at close), `/fail` 500, the rest 200."""

    def __init__(self) -> None:
        self.got: list[Received] = []
        self.closing = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.got.append(Received(self.command, self.path, dict(self.headers), body))
                if self.path.startswith("/hang"):
                    receiver.closing.wait(60)
                status = 500 if self.path.startswith("/fail") else 200
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"id": "1"}')

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_port
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def on(self, path: str) -> list[Received]:
        return [got for got in self.got if got.path == path]

    def close(self) -> None:
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.close()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _event(kind: str = "fill", identity: str = "builder") -> Event:
    row = AgentRow(HOST, identity, "pi", "running", context(96.5, used=193_000))
    return Event(kind, row, "inc-1", 95, NOW)  # type: ignore[arg-type]


async def _until(done: Callable[[], object], within: float = 30) -> None:
    with trio.fail_after(within):
        while not done():  # noqa: ASYNC110 (the receivers are threads and processes: nothing to wait on in trio)
            await trio.sleep(0.02)


async def _send(targets: list[Target], notices: list[Notice], until: Callable[[], object]) -> None:
    """The notices to the targets, until `until` (what the receivers got) holds."""
    notifier = Notifier(targets, timeout_s=3, retry_for_s=1.0, queue=8)
    async with trio.open_nursery() as nursery:
        notifier.start(nursery)
        for notice in notices:
            notifier.put(notice)
        await _until(until)
        nursery.cancel_scope.cancel()


# --- what a notification says ------------------------------------------------------------------------


def test_a_notice_names_host_agent_harness_fill_window_and_links_the_agents_board_page() -> None:
    notice = notice_of(_event(), "http://127.0.0.1:8377/")
    assert notice.title == "builder: context 97% full"
    assert notice.body.splitlines() == [
        "box/builder: context 97% full (193k/200k), at or above 95%",
        "host box · agent builder · harness pi",
        "fill 97% · 193k/200k",
        "http://127.0.0.1:8377/agents/box/builder",
    ]
    assert notice_of(_event("compaction")).title == "builder: compacted"
    # the board's own links escape each part (wrapper/web/assets/common.js)
    assert board_link("http://h:1", "a b", "x/y") == "http://h:1/agents/a%20b/x%2Fy"


def test_a_rate_limit_notice_names_the_accounts_window() -> None:
    row = AgentRow(HOST, "builder", "claude", "running", context(40.0))
    snapshot = Snapshot("fiveHour", 91.0, None, NOW - 1000, 1000, False, row)
    group = AccountGroup("acct-1", "work seat", (row,), {"fiveHour": snapshot})
    event = RateLimitEvent("rate-limit", row, "inc-1", 80, NOW, group=group, snapshot=snapshot)
    notice = notice_of(event, None)
    assert notice.title == "builder: rate limit 91% used"
    assert notice.body.splitlines()[1:] == [
        "host box · agent builder · harness claude",
        "fill 91% · five-hour window of work seat",
    ]


# --- real receivers ----------------------------------------------------------------------------------


async def test_ntfy_slack_style_and_json_webhooks_get_each_services_request(receiver: Receiver) -> None:
    port = receiver.port
    urls = [
        f"ntfy://127.0.0.1:{port}/alerts",
        f"mmost://127.0.0.1:{port}/hooktoken1234",
        f"json://127.0.0.1:{port}/hook",
    ]
    notice = notice_of(_event(), "http://127.0.0.1:8377")
    await _send([target_of(url) for url in urls], [notice], lambda: len(receiver.got) >= 3)
    (ntfy,) = receiver.on("/")  # ntfy's JSON publish: POST to the server's root, the topic in the body
    assert ntfy.headers["Content-Type"] == "application/json"
    assert json.loads(ntfy.body) == {"topic": "alerts", "title": notice.title, "message": notice.body}
    (slack,) = receiver.on("/hooks/hooktoken1234")  # Mattermost's Slack-compatible incoming webhook
    assert json.loads(slack.body)["text"] == f"{notice.title}\r\n{notice.body}"
    (hook,) = receiver.on("/hook")
    wire = json.loads(hook.body)
    assert (wire["title"], wire["message"], wire["type"]) == (notice.title, notice.body, "info")


async def test_slack_gets_its_incoming_webhook_request(receiver: Receiver, monkeypatch: pytest.MonkeyPatch) -> None:
    """apprise's slack:// itself, its fixed host (hooks.slack.com, a class attribute) pointed at loopback."""
    from apprise.plugins.slack import NotifySlack

    monkeypatch.setattr(NotifySlack, "webhook_url", f"http://127.0.0.1:{receiver.port}/services")
    target = target_of("slack://T1JJ3T3L2/A1BRTD4JD/TIiajkdnlazkcOXrIdevi7/#agents")
    assert "TIiajkdnlazkcOXrIdevi7" not in target.shown and target.scrub("x TIiajkdnlazkcOXrIdevi7") == "x ****"
    notice = notice_of(_event(), None)
    await _send([target], [notice], lambda: receiver.got)
    (got,) = receiver.on("/services/T1JJ3T3L2/A1BRTD4JD/TIiajkdnlazkcOXrIdevi7")
    assert got.headers["Content-Type"].startswith("application/json")
    wire = json.loads(got.body)
    assert wire["channel"] == "#agents"
    assert (wire["attachments"][0]["title"], wire["attachments"][0]["text"]) == (notice.title, notice.body)


async def test_email_through_a_real_smtp_server() -> None:
    from aiosmtpd.controller import Controller

    mails: list[EmailMessage] = []

    class Handler:
        async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
            mails.append(email.message_from_bytes(envelope.content, policy=email.policy.default))  # type: ignore[arg-type]
            return "250 OK"

    port = _closed_port()
    controller = Controller(Handler(), hostname="127.0.0.1", port=port)
    controller.start()
    try:
        notice = notice_of(_event(), None)
        url = f"mailto://127.0.0.1:{port}?from=hctx@box.test&to=me@box.test"
        await _send([target_of(url)], [notice], lambda: mails)
    finally:
        controller.stop()
    (mail,) = mails
    assert mail["Subject"] == notice.title and mail["To"] == "me@box.test"
    part = mail.get_body(("plain", "html"))
    assert part is not None
    assert "box/builder: context 97% full" in part.get_content()


DBUS_SERVER = r"""
import asyncio, json, sys
from dbus_fast.aio import MessageBus
from dbus_fast.service import ServiceInterface, method

class Notifications(ServiceInterface):
    def __init__(self):
        super().__init__("org.freedesktop.Notifications")
    @method()
    def Notify(self, app: "s", replaces: "u", icon: "s", summary: "s", body: "s", actions: "as",
               hints: "a{sv}", timeout: "i") -> "u":
        print(json.dumps({"app": app, "summary": summary, "body": body}), flush=True)
        return 1
    @method()
    def GetCapabilities(self) -> "as":
        return ["body"]
    @method()
    def GetServerInformation(self) -> "ssss":
        return ["hctx-test", "hctx", "1", "1.2"]

async def main():
    bus = await MessageBus(bus_address=sys.argv[1]).connect()
    bus.export("/org/freedesktop/Notifications", Notifications())
    await bus.request_name("org.freedesktop.Notifications")
    print("ready", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


@pytest.fixture
def session_bus(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """Debian's dbus-daemon on a socket of the test's own, and a notification server on it."""
    if shutil.which("dbus-daemon") is None:
        pytest.fail("no dbus-daemon: scripts/install_system_deps.sh installs it")
    address = f"unix:path={tmp_path / 'bus'}"
    daemon = subprocess.Popen(["dbus-daemon", "--session", "--nofork", "--nopidfile", f"--address={address}"])
    server = None
    try:
        deadline = time.monotonic() + 20
        while not (tmp_path / "bus").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        server = subprocess.Popen([sys.executable, "-c", DBUS_SERVER, address], stdout=subprocess.PIPE, text=True)
        assert server.stdout is not None and server.stdout.readline() == "ready\n"
        yield address, server
    finally:
        for process in (server, daemon):
            if process is not None:
                process.terminate()
                process.wait(10)


async def test_the_desktop_over_a_real_dbus_session_bus(
    session_bus: tuple[str, subprocess.Popen[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """apprise's dbus:// (dbus-python, in the venv) on Debian's dbus-daemon, to a notification server
    of the test's own (dbus-fast): the summary and body read back as the server got them."""
    address, server = session_bus
    assert server.stdout is not None
    monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", address)
    notice = notice_of(_event(), None)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.append(server.stdout.readline()), daemon=True).start()  # type: ignore[union-attr]
    await _send([target_of("dbus://")], [notice], lambda: lines)
    (line,) = lines
    got = json.loads(line)
    assert got["app"] == "Apprise" and got["summary"] == notice.title
    assert got["body"] == notice.body.replace("\n", "\r\n")  # apprise's dbus:// ends lines so


# --- one bad target costs only itself -------------------------------------------------------------

# An attempt's bound here: one at the hanging target (`/hang` answers after a minute) lasts this long,
# so it still hangs while the other targets are seen to get theirs (each wait a liveness bound).
HANG_S = 30


def _hanging(port: int) -> Target:
    """`/hang`, with apprise's socket read timeout (4 s by default) past HANG_S: the attempt's bound ends it."""
    return target_of(f"json://127.0.0.1:{port}/hang?rto={2 * HANG_S}")


async def test_a_dead_a_hanging_and_a_failing_target_cost_only_themselves(
    receiver: Receiver, capsys: pytest.CaptureFixture[str]
) -> None:
    port = receiver.port
    dead = target_of(f"json://127.0.0.1:{_closed_port()}/dead")
    failing = target_of(f"json://user:failsecret99@127.0.0.1:{port}/fail")
    good = target_of(f"json://127.0.0.1:{port}/good")
    notices = [notice_of(_event(identity=name), None) for name in ("one", "two")]
    err = ""

    def said(text: str) -> bool:
        nonlocal err
        err += capsys.readouterr().err
        return text in err

    async with trio.open_nursery() as nursery:
        # Retried for 10 s: attempts at 0, 1, 3 and 7 s, so a first failure within 9 s is retried.
        notifier = Notifier([dead, _hanging(port), failing, good], timeout_s=HANG_S, retry_for_s=10, queue=8)
        notifier.start(nursery)
        for notice in notices:
            notifier.put(notice)
        await _until(lambda: len(receiver.on("/good")) >= 2)
        assert not said("/hang:")  # both arrived while the hanging target's first attempt still hung
        await _until(lambda: said("/fail: gave up on fill of box/one after"))  # its retries, then its give-up
        nursery.cancel_scope.cancel()
    assert len(receiver.on("/fail")) >= 2  # retried with back-off
    hung = receiver.on("/hang")  # one at a time: the second only once the first was given up, HANG_S on
    assert len(hung) == 1 or (len(hung) == 2 and hung[1].at - hung[0].at > HANG_S / 2), [got.at for got in hung]
    assert "--notify json://user:****@127.0.0.1:" in err
    assert "failsecret99" not in err


async def test_a_full_queue_drops_for_its_target_alone(receiver: Receiver, capsys: pytest.CaptureFixture[str]) -> None:
    good = target_of(f"json://127.0.0.1:{receiver.port}/ok")
    async with trio.open_nursery() as nursery:
        notifier = Notifier([_hanging(receiver.port), good], timeout_s=HANG_S, retry_for_s=1, queue=1)
        notifier.start(nursery)
        for n in range(4):
            notifier.put(notice_of(_event(identity=f"a{n}"), None))
            # `/ok` has each before the next is put: the good target's queue is empty again, only
            # the hanging target's overflows.
            await _until(lambda n=n: len(receiver.on("/ok")) > n)  # type: ignore[misc]
        nursery.cancel_scope.cancel()
    err = capsys.readouterr().err
    assert err.count(f"--notify json://127.0.0.1:{receiver.port}/hang: queue full;") == 2  # one sent, one queued


# --- secrets ------------------------------------------------------------------------------------------


def test_urls_come_from_the_file_and_the_environment_and_no_message_names_them(tmp_path: Path) -> None:
    listed = tmp_path / "urls"
    listed.write_text("# mine\nntfy://127.0.0.1:9/alerts?token=tk_filesecret1\n")
    environ = {"HCTX_NOTIFY_URLS": "json://u:envsecret22@127.0.0.1:9/x", "OTHER": "1"}
    targets = read_targets(["ntfy://127.0.0.1:9/given"], [listed], environ)
    assert [target.shown for target in targets] == [
        "ntfy://127.0.0.1:9/given", "ntfy://t...1@127.0.0.1:9/alerts", "json://u:****@127.0.0.1:9/x"]  # fmt: skip
    assert environ == {"OTHER": "1"}  # no --exec command inherits the variable
    assert "envsecret22" not in repr(targets) and targets[2].scrub("refused envsecret22") == "refused ****"
    with pytest.raises(ValueError, match=r"--notify #1: a nope:// URL apprise cannot use") as bad:
        read_targets(["nope://secretsecret@x"], [], {})
    assert "secretsecret" not in str(bad.value)


# --- the command -----------------------------------------------------------------------------------


def _hctx(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "wrapper.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})}, cwd=REPO,
    )  # fmt: skip


def test_notify_test_says_what_each_target_answered(receiver: Receiver) -> None:
    dead = f"json://user:deadsecret77@127.0.0.1:{_closed_port()}/dead"
    process = _hctx("watch", "--notify-test", "--notify", f"ntfy://127.0.0.1:{receiver.port}/alerts",
                    "--notify-timeout", "5", env={"HCTX_NOTIFY_URLS": dead})  # fmt: skip
    out, err = process.communicate(timeout=60)
    assert process.returncode == 1, err
    lines = out.splitlines()
    assert lines[0] == f"sent  ntfy://127.0.0.1:{receiver.port}/alerts  success"
    assert lines[1].startswith("FAILED  json://user:****@127.0.0.1:") and "deadsecret77" not in out + err
    (got,) = receiver.got
    assert json.loads(got.body)["title"] == "hctx: test notification"


def test_the_watch_notifies_each_event_once_across_restarts(tmp_path: Path, receiver: Receiver) -> None:
    catalog = tmp_path / "catalog"
    stamp = time.time_ns() // 1_000_000
    put_record(catalog, "builder", incarnation="i", usedPercent=85.0, compactions=0, observedAtMs=stamp,
               writtenAtMs=stamp)  # fmt: skip
    urls = tmp_path / "urls"
    urls.write_text(f"json://127.0.0.1:{receiver.port}/hook\n")
    argv = ("watch", "--catalog", str(catalog), "--host", HOST, "--reread", "600", "--notify-file", str(urls),
            "--board-url", "http://127.0.0.1:8377")  # fmt: skip
    for _ in range(2):
        watch = _hctx(*argv)
        assert process_logged(watch, "following", 60)
        deadline = time.monotonic() + 30
        while not receiver.got and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(2)  # the second watch's first read is done, and would have sent by now
        watch.send_signal(signal.SIGTERM)
        out, err = watch.communicate(timeout=30)
        assert watch.returncode == 0, err
        assert out == ""  # with --notify and no --exec the events go to the targets alone
    (got,) = receiver.got  # the second watch told nothing again
    wire = json.loads(got.body)
    assert wire["title"] == "builder: context 85% full"
    assert wire["message"].splitlines()[-1] == "http://127.0.0.1:8377/agents/box/builder"


def test_apprise_loads_only_with_notify() -> None:
    code = "import sys, wrapper.cli; wrapper.cli.build_parser(); print('apprise' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=False)
    assert result.stdout.strip() == "False", result.stderr


def test_the_readme_section_starts_with_notify_for_ntfy_and_the_desktop() -> None:
    from wrapper.cli import build_parser

    section = (REPO / "README.md").read_text().split("## Being told before a window fills", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    lines = block.splitlines()
    assert "--notify ntfy://" in lines[0] and "--notify dbus://" in lines[1]
    for line in lines:
        words = shlex.split(line, comments=True)
        words = [word for word in words if "=" not in word or word.startswith("-")]  # an environment assignment
        args = build_parser().parse_args(words[1:])
        assert args.command == "watch" and (args.notify or args.notify_test)
        for url in args.notify:
            target_of(url)  # a URL apprise takes
