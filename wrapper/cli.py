"""The `hctx` command line."""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

import guard

if TYPE_CHECKING:
    from wrapper.arguments import Command

__all__ = [
    "COMMAND_HOMES",
    "COMMAND_MODULES",
    "COMMAND_ORDER",
    "PLUGINLESS_HOMES",
    "Parser",
    "build_parser",
    "command_modules",
    "main",
    "order_commands",
]

# Each command's module registers its own (`register(commands)`): its parser, options and what runs.
# They are named, not imported: `hctx COMMAND` imports only COMMAND's module (COMMAND_HOMES), so a
# status bar's `hctx status` never pays for pydantic or another command's options; `hctx --help`
# (or a word that is no command) imports them all.
COMMAND_MODULES = (
    "wrapper.record",
    "wrapper.launch.command",
    "wrapper.launch.adopt",
    "wrapper.launch.setup",
    "wrapper.demo",
    "wrapper.readers.reader_commands",
    "wrapper.readers.status",
    "wrapper.readers.scan",
    "wrapper.readers.metrics",
    "wrapper.readers.replication",
    "wrapper.readers.watch_command",
    "wrapper.readers.web.command",
)
# Which module registers each command; tests/test_cli_help.py holds it equal to what they register.
COMMAND_HOMES: Mapping[str, str] = {
    "schema": "wrapper.record",
    "replay": "wrapper.record",
    "wrap": "wrapper.launch.command",
    "adopt": "wrapper.launch.adopt",
    "setup": "wrapper.launch.setup",
    "demo": "wrapper.demo",
    "agents": "wrapper.readers.reader_commands",
    "accounts": "wrapper.readers.reader_commands",
    "cache": "wrapper.readers.reader_commands",
    "doctor": "wrapper.readers.reader_commands",
    "inspect": "wrapper.readers.reader_commands",
    "top": "wrapper.readers.reader_commands",
    "status": "wrapper.readers.status",
    "scan": "wrapper.readers.scan",
    "metrics": "wrapper.readers.metrics",
    "replication": "wrapper.readers.replication",
    "watch": "wrapper.readers.watch_command",
    "web": "wrapper.readers.web.command",
}


# The catalog readers of this module start no process, and validate with pydantic's plugins off (its
# documented PYDANTIC_DISABLE_PLUGINS): no plugin is meant for hctx's models, and looking for one
# scans every installed package's metadata at the first model built, some 10 ms of each
# `hctx agents --json` a status bar runs (issue 38's bound of 5x a bare interpreter: 5.09-5.18x with
# the scan, 4.79-4.84x without, on a quiet machine). Set in their own process only, which starts no
# other; a value the user set is kept.
PLUGINLESS_HOMES = frozenset({"wrapper.readers.reader_commands"})


def command_modules(names: Sequence[str] = COMMAND_MODULES) -> list[ModuleType]:
    return [importlib.import_module(name) for name in names]


# `hctx --help` lists the commands in the order a user meets them; one registered later by a module
# of its own lands in its place here, one not named here after these, and a name here that is not
# registered is skipped.
COMMAND_ORDER = (
    "demo", "wrap", "agents", "setup", "accounts", "cache", "status", "top", "doctor", "inspect", "watch", "metrics",
    "web", "scan", "replication", "adopt", "replay", "schema",
)  # fmt: skip


class Parser(argparse.ArgumentParser):
    """Every hctx (sub)command's parser: an option's value may start with a minus and a digit
    (`--since -1h`), so it reaches that option's own check instead of reading as an unknown option."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # argparse's own default takes only `-5` or `-.5` as a value; no hctx option looks like `-1`.
        self._negative_number_matcher = re.compile(r"^-\d")


def order_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The help's command list (and the choices an error names) in COMMAND_ORDER."""
    rank = {name: index for index, name in enumerate(COMMAND_ORDER)}
    commands._choices_actions.sort(key=lambda action: rank.get(action.dest, len(rank)))
    parsers = commands._name_parser_map
    for name in sorted(parsers, key=lambda name: rank.get(name, len(rank))):
        parsers[name] = parsers.pop(name)


def _usage_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)command that was run: its usage is the one a bad option of it should show."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(getattr(args, action.dest, None) or "")
            if isinstance(chosen, argparse.ArgumentParser):
                return _usage_parser(chosen, args)
    return parser


def build_parser(modules: Sequence[str] = COMMAND_MODULES) -> argparse.ArgumentParser:
    """hctx's parser with the commands `modules` register (all of them unless told)."""
    # Typed as the base class, so every add_*_command takes the subparsers as argparse's own; each
    # subcommand's parser is a Parser all the same (argparse makes them of the parent's class).
    parser: argparse.ArgumentParser = Parser(
        prog="hctx",
        description="Live context-window fill for every coding agent, in the harness's own numbers.",
    )
    parser.add_argument("--version", action="version", version=f"hctx {guard.__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    for module in command_modules(modules):
        module.register(commands)
    order_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    # The command's own module alone when the first word names one: its parser, help and errors are
    # the ones the whole parser gives it (argparse names a subcommand `hctx NAME` either way).
    home = COMMAND_HOMES.get(words[0]) if words else None
    if home in PLUGINLESS_HOMES:
        os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    parser = build_parser(COMMAND_MODULES if home is None else (home,))
    args, unknown = parser.parse_known_args(words)
    if unknown:  # argparse hands a subcommand's unknown options up to the top; its own usage says more
        before_command = unknown[0] in words[: words.index(args.command)]
        usage = parser if before_command else _usage_parser(parser, args)
        usage.error(f"unrecognized arguments: {' '.join(unknown)}")
    run: Command = args.run
    try:
        return run(args)
    except BrokenPipeError:
        # A reader piped into `head` is a normal ending, not an error worth a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
