"""Every command's --help shows what its help text says: rich reads `[words]` as a style and drops it, so
`optimizations: [fast_kernels, roce, fast_moe]` printed as `optimizations: ,`."""

from __future__ import annotations

import re
from typing import Any

import click
import pytest
from typer.testing import CliRunner

from finetwin.cli import app, command


def _commands(group: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = []
    for name, sub in getattr(group, "commands", {}).items():
        found.append((*path, name))
        found += _commands(sub, (*path, name))
    return found


def _texts(found: click.Command) -> list[str]:
    texts = [found.help or "", found.epilog or ""]
    texts += [getattr(param, "help", None) or "" for param in found.params]
    return [t for t in texts if t]


def _words(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("path", _commands(command()), ids=" ".join)
def test_help_shows_every_bracketed_part_of_its_text(path: tuple[str, ...]) -> None:
    found: Any = command()
    for name in path:
        found = found.commands[name]
    shown = _words(CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "400"}).output)
    for text in _texts(found):
        for bracketed in re.findall(r"\\?\[[^\]\n]*\]", text):
            written = bracketed.removeprefix("\\")
            assert _words(written) in shown, f"{' '.join(path)} --help lost {written!r}"


def _row_after_names(shown: str, option: Any) -> str:
    """What the option's row of the help table shows after its names: its type, if any, then its help."""
    long = next(name for name in option.opts if name.startswith("--"))  # the one the table shows first
    first = re.compile(rf"│\s*(\*\s+)?{re.escape(long)}\s")  # `*`: a required option
    row = next(line for line in shown.splitlines() if first.match(line))
    rest = row.strip("│ ").removeprefix("*")
    for name in sorted([*option.opts, *option.secondary_opts], key=len, reverse=True):
        rest = re.sub(rf"(^|\s){re.escape(name)}(?=\s|$)", " ", rest, count=1)
    return " ".join(rest.split())


@pytest.mark.parametrize("path", [(), *_commands(command())], ids=lambda p: " ".join(p) or "finetwin")
def test_help_shows_a_flag_as_taking_no_value_and_every_other_option_with_its_type(
    path: tuple[str, ...],
) -> None:
    """`--quiet <bool>` read as an option taking a value (`--quiet true`), which typer refuses."""
    found: Any = command()
    for name in path:
        found = found.commands[name]
    shown = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "400"}).output
    # typer's options are of its own vendored click, not of the click package: told by their kind.
    options = [p for p in found.params if p.param_type_name == "option" and not p.hidden and p.help]
    for option in options:
        after = _row_after_names(shown, option)
        starts_with_help = after.startswith(_words(option.help)[:20])
        # A flag's row goes from its names to its help; another option's shows its type between.
        assert starts_with_help is bool(option.is_flag or option.count), (option.opts, after)


def test_replay_help_shows_its_flag_bare_and_its_speed_typed() -> None:
    shown = CliRunner().invoke(app, ["replay", "--help"], env={"COLUMNS": "400"}).output
    options = {p.opts[0]: p for p in command().commands["replay"].params}
    assert _row_after_names(shown, options["--quiet"]).startswith("no progress bar")
    assert _row_after_names(shown, options["--speed"]).startswith("<float> simulated seconds")
