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
