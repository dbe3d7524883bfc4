"""`scripts/bootstrap.sh`, which both README commands run first: it installs only when the install it needs is
missing or older than pyproject.toml or the lock (constraints.txt), and installs the lock's versions. Run in
a copy with a stand-in venv whose pip records its calls. And the lock itself: it pins every dependency
within pyproject.toml's ranges, and the suite runs on its versions."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

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


def bootstrap(checkout: Path, *args: str, unlocked: bool = False) -> list[str]:
    env = {key: value for key, value in os.environ.items() if key != "FINETWIN_UNLOCKED"}
    if unlocked:
        env["FINETWIN_UNLOCKED"] = "1"
    command = ["bash", str(checkout / "scripts" / "bootstrap.sh"), *args]
    subprocess.run(command, check=True, cwd=checkout, env=env)
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


def test_the_install_takes_the_locked_versions(checkout: Path) -> None:
    (checkout / "constraints.txt").write_text("numpy==2.0.0\n")
    assert bootstrap(checkout, "test") == ["install -q -c constraints.txt -e .[test]"]
    assert bootstrap(checkout) == ["install -q -c constraints.txt -e .[test]"], "the main job installed again"


def test_a_lock_changed_since_the_install_installs_again(checkout: Path) -> None:
    stamp(checkout, TEST_STAMP, newer_than_project=True)
    lock = checkout / "constraints.txt"
    lock.write_text("numpy==2.0.0\n")
    later = (checkout / TEST_STAMP).stat().st_mtime + 10
    os.utime(lock, (later, later))
    assert bootstrap(checkout, "test") == ["install -q -c constraints.txt -e .[test]"]


def test_unlocked_installs_without_the_lock(checkout: Path) -> None:
    (checkout / "constraints.txt").write_text("numpy==2.0.0\n")
    assert bootstrap(checkout, unlocked=True) == ["install -q -e ."]


def locked_versions() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        found = re.fullmatch(r"([A-Za-z0-9_.\-]+)==(\S+)", line.strip())
        if found:
            pins[canonicalize_name(found[1])] = found[2]
    return pins


def project_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    listed = [*project["dependencies"]]
    for extra in project.get("optional-dependencies", {}).values():
        listed.extend(extra)
    return [Requirement(text) for text in listed]


def test_the_lock_pins_every_dependency_within_its_range() -> None:
    pins = locked_versions()
    for requirement in project_requirements():
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue  # not for this platform
        name = canonicalize_name(requirement.name)
        assert name in pins, f"constraints.txt does not pin {requirement.name}: run scripts/lock"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"constraints.txt pins {requirement.name}=={pins[name]}, outside pyproject.toml's "
            f"{requirement.specifier}: run scripts/lock"
        )


@pytest.mark.skipif(bool(os.environ.get("FINETWIN_UNLOCKED")), reason="installed without the lock")
def test_the_suite_runs_on_the_locked_versions() -> None:
    """What CI passed with is what the lock says: scripts/bootstrap.sh installed the lock's versions."""
    different = {}
    for name, pinned in locked_versions().items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            different[name] = "not installed"
            continue
        if Version(installed) != Version(pinned):
            different[name] = installed
    assert not different, f"installed versions that differ from constraints.txt: {different}"
