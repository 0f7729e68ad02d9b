"""`hctx COMMAND --help` as a newcomer reads it: described, the same metavar for the same option,
no argparse escapes left showing, the demo's defaults stated."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from wrapper.cli import build_parser, main, order_commands
from wrapper.demo import DEMO_NO_TOP_S, DEMO_TOP_S


def _commands(parser: argparse.ArgumentParser, prefix: str = "hctx") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every (sub)command's parser, nested ones included, by its full name."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield f"{prefix} {name}", child
                yield from _commands(child, f"{prefix} {name}")


COMMANDS = dict(_commands(build_parser()))


def test_the_commands_are_all_found() -> None:
    assert {"hctx schema", "hctx replay", "hctx wrap", "hctx demo", "hctx agents", "hctx top"} <= COMMANDS.keys()


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_a_description_and_no_doubled_percent(name: str) -> None:
    parser = COMMANDS[name]
    assert parser.description, name
    assert "%%" not in parser.format_help(), name  # a description is printed as written, never %-formatted


def test_demo_help_says_80_percent_and_its_default_durations(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "one agent past 80%)" in text
    assert f"seconds each session takes (default: {DEMO_TOP_S:g}, or {DEMO_NO_TOP_S:g} with --no-top)" in text
    assert f"each session plays for {DEMO_TOP_S:g} s" in text


def test_catalog_is_dir_in_every_command() -> None:
    having = {name: parser for name, parser in COMMANDS.items() if "--catalog" in parser._option_string_actions}
    assert {"hctx wrap", "hctx demo", "hctx agents", "hctx doctor", "hctx inspect", "hctx top"} <= having.keys()
    for name, parser in having.items():
        assert parser._option_string_actions["--catalog"].metavar == "DIR", name
        assert "--catalog DIR " in parser.format_help(), name


def test_schema_help_describes_the_record(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["schema", "--help"])
    assert "JSON Schema (draft 2020-12) of st2.harness-context.v1" in " ".join(capsys.readouterr().out.split())


# The order a user meets the commands in (issue 27): `web` lands here once it is registered.
MET_IN_ORDER = ["demo", "wrap", "agents", "setup", "accounts", "cache", "status", "top", "doctor", "inspect", "watch",
                "metrics", "web", "scan", "replication", "adopt", "replay", "schema"]  # fmt: skip


def _listed(help_text: str) -> list[str]:
    """The command names `hctx --help` lists, in order: the indented first word of each entry."""
    listing = help_text.split("COMMAND\n", 1)[1].split("\noptions:", 1)[0]
    return [line.split()[0] for line in listing.splitlines() if line.startswith("    ") and line[4] != " "]


def test_help_lists_the_commands_in_the_order_a_user_meets_them(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    listed = _listed(capsys.readouterr().out)
    registered = {name.split()[1] for name in COMMANDS if name.count(" ") == 1}
    assert set(listed) == registered and set(listed) <= set(MET_IN_ORDER)
    assert listed == [name for name in MET_IN_ORDER if name in registered]
    assert listed[:3] == ["demo", "wrap", "agents"] and listed[-2:] == ["replay", "schema"]


def test_a_command_registered_later_lands_in_its_place_and_an_unknown_one_last() -> None:
    parser = argparse.ArgumentParser(prog="hctx")
    commands = parser.add_subparsers(metavar="COMMAND")
    for name in ("schema", "zzz-plugin", "web", "demo", "scan"):
        commands.add_parser(name, help=name)
    order_commands(commands)
    assert _listed(parser.format_help()) == ["demo", "web", "scan", "schema", "zzz-plugin"]
    assert list(commands.choices) == ["demo", "web", "scan", "schema", "zzz-plugin"]


@pytest.mark.parametrize(
    ("argv", "usage"),
    [
        (["top", "--bogus"], "usage: hctx top "),
        (["agents", "--bogus"], "usage: hctx agents "),
        (["doctor", "--bogus"], "usage: hctx doctor "),
        (["watch", "--bogus"], "usage: hctx watch "),
        (["metrics", "--bogus"], "usage: hctx metrics "),
        (["scan", "--bogus"], "usage: hctx scan "),
        (["demo", "--bogus"], "usage: hctx demo "),
        (["schema", "--bogus"], "usage: hctx schema "),
        (["inspect", "x", "--bogus"], "usage: hctx inspect "),
        (["replication", "syncthing", "--bogus"], "usage: hctx replication syncthing "),
        (["--bogus", "top"], "usage: hctx [-h]"),  # before the command: the top level's own
    ],
)
def test_a_bad_option_prints_its_own_commands_usage(
    argv: list[str], usage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(usage), err
    assert "error: unrecognized arguments: --bogus" in err


def test_every_command_is_registered_by_its_own_module() -> None:
    """One style: each command module's `register(commands)` adds its commands whole (parser, options,
    what runs); cli.py only lists the modules, and no module adds options to another's parser."""
    import ast
    from pathlib import Path

    from wrapper.cli import COMMAND_HOMES, Parser, command_modules

    owners: dict[str, str] = {}
    for module in command_modules():
        commands = Parser(prog="hctx").add_subparsers()
        module.register(commands)
        for name, parser in commands.choices.items():
            assert name not in owners, f"{name} registered by {owners[name]} and {module.__name__}"
            owners[name] = module.__name__
            # Registered alone, the command is already the one `hctx` runs: nothing grafted on later.
            assert parser.format_help() == COMMANDS[f"hctx {name}"].format_help(), name
    assert {f"hctx {name}" for name in owners} == {name for name in COMMANDS if name.count(" ") == 1}
    assert owners["watch"] == "wrapper.readers.watch_command"  # --rate-limit-at included
    assert owners == COMMAND_HOMES  # what `hctx COMMAND` imports alone is the module that registers it
    root = Path(__file__).resolve().parent.parent / "wrapper"
    cli = ast.parse((root / "cli.py").read_text())
    called = {
        node.func.attr for node in ast.walk(cli) if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
    }
    assert "add_parser" not in called and "add_argument" in called  # the top's --version only
    reaching = sorted(str(path.relative_to(root)) for path in root.rglob("*.py") if ".choices[" in path.read_text())
    assert reaching == []  # a parser is finished by its own module, never looked up and extended


@pytest.mark.parametrize("name", sorted(name.split()[1] for name in COMMANDS if name.count(" ") == 1))
def test_a_command_run_alone_has_the_help_and_usage_of_the_whole_parser(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`hctx COMMAND` builds only COMMAND's parser (its module alone is imported): the same help, and
    the same usage in its errors, as the parser with every command."""
    with pytest.raises(SystemExit):
        main([name, "--help"])
    assert capsys.readouterr().out == COMMANDS[f"hctx {name}"].format_help()
    with pytest.raises(SystemExit):
        main([name, "--no-such-option"])
    assert capsys.readouterr().err.startswith(COMMANDS[f"hctx {name}"].format_usage())


def test_a_command_imports_only_its_own_module() -> None:
    """`hctx agents` loads the readers' commands, never the board's, the launcher's or the watch's."""
    import json
    import subprocess
    import sys

    from tests.conftest import REPO

    probe = (
        "import sys; from wrapper.cli import main\n"
        "try:\n    main(['agents', '--help'])\nexcept SystemExit:\n    pass\n"
        "import json; loaded = [m for m in sys.modules if m.startswith(('wrapper.', 'starlette', 'hypercorn'))]\n"
        "print(json.dumps(sorted(loaded)))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, check=True)
    loaded = json.loads(done.stdout.splitlines()[-1])
    assert "wrapper.readers.reader_commands" in loaded
    assert not [name for name in loaded if name.startswith(("wrapper.readers.web", "wrapper.launch", "starlette",
                                                            "hypercorn", "wrapper.readers.watch"))]  # fmt: skip
