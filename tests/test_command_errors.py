"""How a command ends when something goes wrong (`finetwin.commands.add_command`): a user's mistake, an
interrupt and running out of memory each end with a message and a status, never a traceback."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from finetwin.commands import OUT_OF_MEMORY, add_command
from finetwin.errors import CommandError


def huge_allocation() -> int:
    # numpy's "Unable to allocate 4.00 EiB": the MemoryError a huge input gives, raised for real.
    np.empty(1 << 62, dtype=np.uint8)
    return 0


def mistake() -> int:
    raise CommandError("--input is not a file")


def interrupted() -> int:
    raise KeyboardInterrupt


def unwritable() -> int:
    raise OSError(13, "Permission denied", "/srv/finetwin")


@pytest.mark.parametrize(
    ("function", "status", "message"),
    [
        (huge_allocation, 1, OUT_OF_MEMORY),
        (mistake, 2, "--input is not a file"),
        (interrupted, 130, ""),
        (unwritable, 1, "finetwin demo: error: /srv/finetwin: Permission denied"),
    ],
)
def test_a_command_that_fails_says_why_without_a_traceback(function, status: int, message: str) -> None:  # type: ignore[no-untyped-def]
    app = typer.Typer()
    add_command(app, function, "demo")
    add_command(app, lambda: 0, "other")  # two commands: typer keeps the name on the command line
    result = CliRunner().invoke(app, ["demo"])
    assert result.exit_code == status
    assert "Traceback" not in result.output
    assert " ".join(message.split()) in " ".join(result.output.split())


def test_a_data_directory_that_cannot_be_made_is_said_with_its_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """FINETWIN_DATA_DIR naming a file: `keys list` and `migrate` ended in a FileExistsError traceback."""
    from finetwin.cli import main

    taken = tmp_path / "a-file"
    taken.write_text("")
    monkeypatch.setenv("FINETWIN_DATA_DIR", str(taken))
    for command in (["keys", "list"], ["migrate"]):
        assert main(command) == 1
        error = capsys.readouterr().err
        assert f"{taken}: the data directory (FINETWIN_DATA_DIR) cannot be made: File exists" in error, error
        assert "Traceback" not in error
