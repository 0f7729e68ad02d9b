#!/usr/bin/env python3
"""Round-trip latency through the Codex websocket relay vs straight to the server, in one run.

Each target is measured direct and relayed in alternating batches (so drift hits both alike), and
the table reports the relayed/direct ratio of each percentile:

- `echo`: a trio-websocket echo server (in its own process): the relay's own cost, nothing else;
  payloads of a typical notification (~300 B) and a large response (64 KiB).
- `codex <V>`: the real `codex app-server --listen ws://` (if installed under .harnesses/): a
  `config/read` request and its response, the path a client's requests really take.

The relay runs in its own process, as in the sidecar, and its tap does what the sidecar's does:
every server→client frame goes through a queue into the Codex producer.

Usage: scripts/bench_codex_relay.py [--rounds N] [--batch N] [--versions 0.151.0,0.171.0] [--no-codex]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import trio  # noqa: E402
import trio_websocket  # noqa: E402

LOOPBACK = "127.0.0.1"
MAX_MESSAGE = 64 * 1024 * 1024
READY_LIMIT_S = 60.0


# ---- the processes under test -------------------------------------------------------------------------


async def serve_echo(port: int) -> None:
    async def echo(request: trio_websocket.WebSocketRequest) -> None:
        connection = await request.accept()
        try:
            while True:
                await connection.send_message(await connection.get_message())
        except trio_websocket.ConnectionClosed:
            return

    await trio_websocket.serve_websocket(echo, LOOPBACK, port, None, max_message_size=MAX_MESSAGE)


async def serve_relay_with_producer(port: int, upstream_port: int) -> None:
    from sidecar.decoding import Dropped
    from sidecar.harnesses.codex.producer import SPEC, CodexProducer
    from sidecar.harnesses.codex.relay import Address, serve_relay
    from sidecar.streams import Streams

    send, receive = trio.open_memory_channel[object](1024)
    producer = CodexProducer()

    def submit(event: object) -> None:
        with suppress(trio.WouldBlock):
            send.send_nowait(event)

    async def consume() -> None:
        async for event in receive:
            if not isinstance(event, Dropped):  # the echo target's payloads are not Codex messages
                producer.feed(event, time.time_ns() // 1_000_000)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(consume)
        await serve_relay(Address(LOOPBACK, port), Address(LOOPBACK, upstream_port), Streams(SPEC, submit))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        port: int = probe.getsockname()[1]
        return port


@asynccontextmanager
async def background(argv: list[str], env: dict[str, str] | None = None) -> AsyncIterator[trio.Process]:
    process = await trio.lowlevel.open_process(
        argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        with trio.move_on_after(10):
            await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()


def self_argv(*args: str) -> list[str]:
    return [sys.executable, os.fspath(Path(__file__).resolve()), *args]


# ---- measuring ----------------------------------------------------------------------------------------


@dataclass
class Series:
    direct: list[float]
    relayed: list[float]


RoundTrip = Callable[[trio_websocket.WebSocketConnection], Awaitable[None]]


async def open_connection(nursery: trio.Nursery, port: int) -> trio_websocket.WebSocketConnection:
    with trio.fail_after(READY_LIMIT_S):
        while True:
            try:
                return await trio_websocket.connect_websocket(
                    nursery, LOOPBACK, port, "/", use_ssl=False, max_message_size=MAX_MESSAGE
                )
            except (OSError, trio_websocket.HandshakeError):
                await trio.sleep(0.05)


async def measure(direct_port: int, relay_port: int, round_trip: RoundTrip, rounds: int, batch: int) -> Series:
    series = Series([], [])
    async with trio.open_nursery() as nursery:
        direct = await open_connection(nursery, direct_port)
        relayed = await open_connection(nursery, relay_port)
        for connection in (direct, relayed):  # warm both paths
            for _ in range(20):
                await round_trip(connection)
        for round_index in range(rounds):
            order = [(direct, series.direct), (relayed, series.relayed)]
            if round_index % 2:
                order.reverse()
            for connection, samples in order:
                for _ in range(batch):
                    start = time.perf_counter_ns()
                    await round_trip(connection)
                    samples.append((time.perf_counter_ns() - start) / 1000)
        await direct.aclose()
        await relayed.aclose()
        nursery.cancel_scope.cancel()
    return series


def echo_round_trip(payload: str) -> RoundTrip:
    async def once(connection: trio_websocket.WebSocketConnection) -> None:
        await connection.send_message(payload)
        await connection.get_message()

    return once


def codex_round_trip() -> tuple[RoundTrip, Callable[[trio_websocket.WebSocketConnection], Awaitable[None]]]:
    ids = iter(range(10, 10**9))

    async def request(connection: trio_websocket.WebSocketConnection, method: str, params: dict[str, object]) -> None:
        ident = next(ids)
        await connection.send_message(json.dumps({"method": method, "id": ident, "params": params}))
        while True:  # notifications may come first; the round trip ends at our response
            message = json.loads(await connection.get_message())
            if message.get("id") == ident and "method" not in message:
                return

    async def initialize(connection: trio_websocket.WebSocketConnection) -> None:
        client = {"name": "hctx_bench", "title": "hctx bench", "version": "0"}
        await request(connection, "initialize", {"clientInfo": client, "capabilities": {"experimentalApi": True}})
        await connection.send_message(json.dumps({"method": "initialized"}))

    async def config_read(connection: trio_websocket.WebSocketConnection) -> None:
        await request(connection, "config/read", {})

    return config_read, initialize


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def row(name: str, series: Series) -> str:
    cells = [name, str(len(series.direct))]
    ratios = []
    for q in (0.5, 0.9, 0.99):
        direct, relayed = percentile(series.direct, q), percentile(series.relayed, q)
        cells += [f"{direct:,.0f}", f"{relayed:,.0f}"]
        ratios.append(f"{relayed / direct:.2f}")
    mean_ratio = statistics.fmean(series.relayed) / statistics.fmean(series.direct)
    return " | ".join([*cells, *ratios, f"{mean_ratio:.2f}"])


HEADER = (
    "target | n | direct p50 µs | relayed p50 µs | direct p90 µs | relayed p90 µs | direct p99 µs | relayed p99 µs"
    " | ratio p50 | ratio p90 | ratio p99 | ratio mean"
)


async def bench(args: argparse.Namespace) -> None:
    rows: list[str] = []
    echo_port, relay_port = free_port(), free_port()
    async with (
        background(self_argv("--serve-echo", str(echo_port))),
        background(self_argv("--serve-relay", str(relay_port), str(echo_port))),
    ):
        notification = json.dumps({"method": "item/agentMessage/delta", "params": {"delta": "x" * 200}})
        large = json.dumps({"id": 7, "result": {"blob": "y" * 65_000}})
        for name, payload in [("echo ~300 B", notification), ("echo 64 KiB", large)]:
            rows.append(
                row(name, await measure(echo_port, relay_port, echo_round_trip(payload), args.rounds, args.batch))
            )

    if not args.no_codex:
        from tests.harnesses import harness_command, harness_missing

        for version in args.versions.split(","):
            if (why := harness_missing("codex", version)) is not None:
                print(f"skipping codex {version}: {why}", file=sys.stderr)
                continue
            rows.append(await bench_codex(version, harness_command("codex", version), args))

    print(f"relay round-trip latency, {time.strftime('%Y-%m-%d %H:%M:%S')} ({os.cpu_count()} CPUs)")
    print(HEADER)
    print(" | ".join(["---"] * len(HEADER.split(" | "))))
    for line in rows:
        print(line)


async def bench_codex(version: str, codex: list[str], args: argparse.Namespace) -> str:
    app_port, relay_port = free_port(), free_port()
    with tempfile.TemporaryDirectory(prefix="hctx-bench-codex-") as home:
        env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": home, "CODEX_HOME": home}
        listen = f"ws://{LOOPBACK}:{app_port}"
        async with (
            background([*codex, "app-server", "--listen", listen], env=env),
            background(self_argv("--serve-relay", str(relay_port), str(app_port))),
        ):
            config_read, initialize = codex_round_trip()
            initialized: set[int] = set()

            async def round_trip(connection: trio_websocket.WebSocketConnection) -> None:
                if id(connection) not in initialized:
                    initialized.add(id(connection))
                    await initialize(connection)
                await config_read(connection)

            series = await measure(app_port, relay_port, round_trip, args.rounds, args.batch)
    return row(f"codex {version} config/read", series)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20, help="alternating direct/relayed batches (default 20)")
    parser.add_argument("--batch", type=int, default=50, help="round trips per batch (default 50)")
    parser.add_argument("--versions", default="0.151.0,0.171.0")
    parser.add_argument("--no-codex", action="store_true", help="only the echo server")
    parser.add_argument("--serve-echo", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--serve-relay", type=int, nargs=2, metavar=("PORT", "UPSTREAM"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_echo is not None:
        trio.run(serve_echo, args.serve_echo)
    elif args.serve_relay is not None:
        trio.run(serve_relay_with_producer, *args.serve_relay)
    else:
        trio.run(bench, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
