"""How a command ends when something goes wrong (`finetwin.commands.add_command`): a user's mistake, an
interrupt and running out of memory each end with a message and a status, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
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


def damaged_registry() -> int:
    from calibrate.registry import RegistryError

    raise RegistryError("/srv/models/IN_USE.json cannot be read as JSON; restore it")


@pytest.mark.parametrize(
    ("function", "status", "message"),
    [
        (huge_allocation, 1, OUT_OF_MEMORY),
        (mistake, 2, "--input is not a file"),
        (interrupted, 130, ""),
        (unwritable, 1, "finetwin demo: error: /srv/finetwin: Permission denied"),
        (
            damaged_registry,
            2,
            "finetwin demo: error: /srv/models/IN_USE.json cannot be read as JSON; restore it",
        ),
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


@pytest.mark.parametrize(("json_output", "buffered"), [(True, False), (True, True), (False, False)])
def test_output_whose_reader_went_away_ends_the_command_quietly(
    tmp_path: Path, json_output: bool, buffered: bool
) -> None:
    """`finetwin simulate --json | head -c 5`: the reader closes the pipe before the command writes. JSON
    (printed as is) said "error: Broken pipe" and exited 1; now it ends as a table (printed by rich) does,
    with status 1 and nothing said. Buffered (PYTHONUNBUFFERED unset), the write fails only when the
    command has returned and its output is flushed."""
    (tmp_path / "cluster.yaml").write_text("nodes:\n  - {gpu_model: A100-SXM, count: 1}\n")
    (tmp_path / "jobs.csv").write_text("job_id,arrival_s,gpus,duration_s\nj1,0,4,7200\n")
    line = [str(Path(sys.executable).with_name("finetwin")), "simulate", "--cluster", "cluster.yaml",
            "--workload", "jobs.csv", *(["--json"] if json_output else [])]  # fmt: skip
    env = {**os.environ, "FINETWIN_DATA_DIR": str(tmp_path / "data"), "PYTHONUNBUFFERED": "1"}
    if buffered:
        del env["PYTHONUNBUFFERED"]
    reader, writer = os.pipe()
    os.close(reader)  # before the command starts: every write it makes meets a closed pipe
    with subprocess.Popen(line, stdout=writer, stderr=subprocess.PIPE, env=env, cwd=tmp_path) as process:
        os.close(writer)
        _, error = process.communicate(timeout=120)
    assert process.returncode == 1
    assert error.decode() == ""


def test_a_command_started_without_standard_output_runs(tmp_path: Path) -> None:
    """`finetwin info >&-` (a job started with its output closed): Python's sys.stdout is None, and the
    first table or message ended in an AttributeError traceback."""
    finetwin = str(Path(sys.executable).with_name("finetwin"))
    env = {**os.environ, "FINETWIN_DATA_DIR": str(tmp_path / "data")}
    done = subprocess.run(
        ["sh", "-c", f"exec {finetwin} info >&-"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr


def test_a_broken_pipe_that_is_not_the_output_is_said() -> None:
    """A broken pipe of a socket, with standard output still open, is the machine's error, said as such."""

    def peer_gone() -> int:
        raise BrokenPipeError(32, "Broken pipe")

    app = typer.Typer()
    add_command(app, peer_gone, "demo")
    add_command(app, lambda: 0, "other")
    result = CliRunner().invoke(app, ["demo"])
    assert result.exit_code == 1
    assert "finetwin demo: error: Broken pipe" in result.output
