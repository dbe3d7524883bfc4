"""`scripts/bootstrap.sh`, which both README commands run first: it installs only when the install it needs is
missing or older than pyproject.toml. Run in a copy with a stand-in venv whose pip records its calls."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLAIN_STAMP = ".venv/.finetwin-installed"
TEST_STAMP = ".venv/.finetwin-installed-test"


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "bootstrap.sh", tmp_path / "scripts" / "bootstrap.sh")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'stand-in'\n")
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name, body in (("python", "exit 0"), ("pip", f'echo "$*" >> "{tmp_path}/pip-calls"')):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return tmp_path


def stamp(checkout: Path, name: str, *, newer_than_project: bool) -> None:
    path = checkout / name
    path.touch()
    project = (checkout / "pyproject.toml").stat().st_mtime
    moment = project + 10 if newer_than_project else project - 10
    os.utime(path, (moment, moment))


def bootstrap(checkout: Path, *args: str) -> list[str]:
    subprocess.run(["bash", str(checkout / "scripts" / "bootstrap.sh"), *args], check=True, cwd=checkout)
    calls = checkout / "pip-calls"
    return calls.read_text().splitlines() if calls.exists() else []


def test_the_main_job_after_the_tests_installs_nothing(checkout: Path) -> None:
    stamp(checkout, TEST_STAMP, newer_than_project=True)
    assert bootstrap(checkout) == []


def test_a_project_changed_since_the_test_install_is_installed_again(checkout: Path) -> None:
    stamp(checkout, TEST_STAMP, newer_than_project=False)
    assert bootstrap(checkout) == ["install -q -e ."]
    assert (checkout / PLAIN_STAMP).exists()
    assert bootstrap(checkout) == ["install -q -e ."], "the second run installed again"


def test_the_tests_after_the_main_job_install_the_test_extras(checkout: Path) -> None:
    stamp(checkout, PLAIN_STAMP, newer_than_project=True)
    assert bootstrap(checkout, "test") == ["install -q -e .[test]"]
    assert bootstrap(checkout, "test") == ["install -q -e .[test]"]
