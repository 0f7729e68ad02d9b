"""`hctx COMMAND --help` as a newcomer reads it: described, the same metavar for the same option,
no argparse escapes left showing, the demo's defaults stated."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from wrapper.cli import DEMO_NO_TOP_S, DEMO_TOP_S, build_parser, main


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
