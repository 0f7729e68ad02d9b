"""`hctx web`'s access token (issue 38): refused without it, admitted with it, the cookie's flags, the
Host check's configured names. The board runs as a user starts it, on 127.0.0.1 with
`--require-token` (a board on another address requires it by itself: `needs_token`)."""

from __future__ import annotations

import hmac
import http.client
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from tests.conftest import REPO
from tests.web_board import first_line, fleet, stop, web_argv, web_env
from wrapper.cli import build_parser
from wrapper.readers.web.command import needs_token
from wrapper.readers.web.token import COOKIE, TokenGate


@pytest.fixture(scope="module")
def board(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int, str]]:
    """(host, port, token) of a board that requires its token and also answers `board.lan`."""
    catalog = tmp_path_factory.mktemp("catalog")
    fleet(catalog)
    argv = web_argv(catalog, "--listen", "127.0.0.1:0", "--require-token", "--allow-host", "board.lan")
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=web_env(), cwd=REPO)
    try:
        url = urlsplit(first_line(process).strip())
        assert url.path == "/" and url.query.startswith("token=") and url.hostname == "127.0.0.1", url
        yield "127.0.0.1", int(url.port or 0), url.query.removeprefix("token=")
    finally:
        stop(process)


def _get(board: tuple[str, int, str], path: str, headers: dict[str, str] | None = None) -> http.client.HTTPResponse:
    host, port, _ = board
    connection = http.client.HTTPConnection(host, port, timeout=30)
    connection.request("GET", path, headers=headers or {})
    answer = connection.getresponse()
    answer.read()
    connection.close()
    return answer


PATHS = ["/", "/api/agents", "/api/board", "/assets/board.css", "/api/events", "/agents/box/alpha", "/favicon.ico"]


@pytest.mark.parametrize("path", PATHS)
def test_every_request_without_the_token_is_refused(board: tuple[str, int, str], path: str) -> None:
    _, _, token = board
    assert _get(board, path).status == 401
    assert _get(board, path, {"Cookie": f"{COOKIE}={token[:-1]}x"}).status == 401
    assert _get(board, path, {"Cookie": f"other={token}"}).status == 401
    assert _get(board, path, {"Authorization": f"Bearer {token}x"}).status == 401
    assert _get(board, f"{path}?token={token}x").status == 401
    refused = _get(board, path)
    assert refused.getheader("content-security-policy")  # the board's headers on its refusals too


def test_the_url_sets_an_httponly_samesite_strict_cookie_and_leaves(board: tuple[str, int, str]) -> None:
    _, _, token = board
    entered = _get(board, f"/?token={token}")
    assert entered.status == 303 and entered.getheader("location") == "/"  # the token leaves the address bar
    cookie = entered.getheader("set-cookie") or ""
    parts = [part.strip() for part in cookie.split(";")]
    assert parts[0] == f"{COOKIE}={token}"
    assert {"HttpOnly", "SameSite=Strict", "Path=/"} <= set(parts) and "Secure" not in parts  # no TLS here
    assert entered.getheader("cache-control") == "no-store"
    kept = _get(board, f"/agents/box/alpha?token={token}&x=1")
    assert kept.status == 303 and kept.getheader("location") == "/agents/box/alpha?x=1"


@pytest.mark.parametrize("path", ["/", "/api/agents", "/assets/board.css", "/agents/box/alpha"])
def test_the_cookie_or_a_bearer_header_is_admitted(board: tuple[str, int, str], path: str) -> None:
    _, _, token = board
    assert _get(board, path, {"Cookie": f"theme=dark; {COOKIE}={token}"}).status == 200
    assert _get(board, path, {"Authorization": f"Bearer {token}"}).status == 200


def test_the_host_check_admits_the_configured_names(board: tuple[str, int, str]) -> None:
    _, port, token = board
    cookie = {"Cookie": f"{COOKIE}={token}"}
    assert _get(board, "/api/agents", {**cookie, "Host": f"board.lan:{port}"}).status == 200
    assert _get(board, "/api/agents", {**cookie, "Host": f"localhost:{port}"}).status == 200
    assert _get(board, "/api/agents", {**cookie, "Host": f"evil.example:{port}"}).status == 400


def test_an_address_that_is_not_loopback_requires_the_token() -> None:
    parse = build_parser().parse_args
    assert needs_token("192.168.1.20", parse(["web"]))
    assert needs_token("0.0.0.0", parse(["web"]))
    assert needs_token("::", parse(["web"]))
    assert not needs_token("127.0.0.1", parse(["web"]))
    assert not needs_token("::1", parse(["web"]))
    assert needs_token("127.0.0.1", parse(["web", "--require-token"]))


async def _gated(secure: bool, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str]]:
    """One request through a TokenGate in front of a one-route app: its status and headers."""

    async def hello(_: object) -> PlainTextResponse:
        return PlainTextResponse("hello")

    gate = TokenGate(Starlette(routes=[Route("/", hello)]), "s3cret", secure=secure)
    target, _, query = path.partition("?")
    scope = {
        "type": "http", "method": "GET", "path": target, "root_path": "", "query_string": query.encode(),
        "headers": [(name.lower().encode(), value.encode()) for name, value in (headers or {}).items()],
        "http_version": "1.1", "scheme": "http", "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1),
    }  # fmt: skip
    sent: list[dict[str, object]] = []

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    await gate(scope, receive, send)  # type: ignore[arg-type]
    start = sent[0]
    answer_headers = {bytes(name).decode(): bytes(value).decode() for name, value in start["headers"]}  # type: ignore[attr-defined]
    return int(start["status"]), answer_headers  # type: ignore[call-overload]


async def test_the_cookie_is_secure_under_tls() -> None:
    status, headers = await _gated(True, "/?token=s3cret")
    assert status == 303 and "; Secure" in headers["set-cookie"]


async def test_the_token_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(offered: bytes, token: bytes) -> bool:
        compared.append((offered, token))
        return real(offered, token)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    assert (await _gated(False, "/", {"Cookie": f"{COOKIE}=wrong"}))[0] == 401
    assert (await _gated(False, "/", {"Cookie": f"{COOKIE}=s3cret"}))[0] == 200
    assert compared == [(b"wrong", b"s3cret"), (b"s3cret", b"s3cret")]


def test_the_token_is_not_on_the_command_line(board: tuple[str, int, str]) -> None:
    """Printed once on stdout; never in argv, where `ps` shows it."""
    _, _, token = board
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            assert token.encode() not in cmdline.read_bytes()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue


NAMESPACED = """
import http.client, subprocess, sys
from urllib.parse import urlsplit
server = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, text=True)
try:
    url = urlsplit(server.stdout.readline().strip())
    def status(path, headers={}):
        connection = http.client.HTTPConnection("127.0.0.1", url.port, timeout=30)
        connection.request("GET", path, headers={"Host": f"box.lan:{url.port}", **headers})
        answer = connection.getresponse()
        return answer.status, answer.getheader("set-cookie") or ""
    token = url.query.removeprefix("token=")
    print(status("/api/agents")[0], status("/api/agents?token=" + token)[0],
          status("/api/agents", {"Cookie": "hctx_board=" + token})[0], "HttpOnly" in status("/?token=" + token)[1])
finally:
    server.terminate()
    server.wait()
"""


def test_on_every_interface_the_board_requires_its_token(tmp_path: Path) -> None:
    """0.0.0.0 in a private network namespace (loopback only, as tests/test_web.py's), so nothing is
    exposed: without `--require-token`, the token is required all the same; `--allow-host` admits box.lan."""
    import os
    import sys

    if os.geteuid() != 0 and os.environ.get("CI") != "true":
        pytest.skip("unshare -n needs root here")
    fleet(tmp_path)
    argv = web_argv(tmp_path, "--listen", "0.0.0.0:0", "--allow-host", "box.lan")
    script = "ip link set lo up && exec " + " ".join(f"'{part}'" for part in [sys.executable, "-c", NAMESPACED, *argv])
    done = subprocess.run(["unshare", "-n", "sh", "-c", script], capture_output=True, text=True, env=web_env(),
                          cwd=REPO, timeout=120)  # fmt: skip
    assert done.stdout.split() == ["401", "303", "200", "True"], done.stderr
    assert "hctx web: warning: listening on 0.0.0.0, not loopback" in done.stderr
