"""The layering of ../shared/DESIGN.md (Layout): `twin` imports none of the other packages, `ingest` and
`calibrate` only `twin`, `advisor` only `twin` and `calibrate`, and nothing imports the application
`finetwin`. The contracts are in pyproject.toml ([tool.importlinter]); import-linter reads every import
statement, including those inside functions and under TYPE_CHECKING."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = str(Path(sys.executable).with_name("lint-imports"))


def test_the_packages_keep_their_layers() -> None:
    # A child process: import-linter's logging dictConfig would silence this process's loggers.
    done = subprocess.run(
        [LINT_IMPORTS, "--config", "pyproject.toml", "--no-cache"], cwd=REPO, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_contracts_catch_an_import_inside_a_function(tmp_path: Path) -> None:
    """The same contracts on a copy of the layout where `twin` reaches up from inside a function and
    `advisor` imports `ingest` under TYPE_CHECKING: both are reported."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    for package in config["root_packages"]:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "twin" / "store.py").write_text("def load():\n    from calibrate import registry  # noqa\n")
    (tmp_path / "calibrate" / "registry.py").write_text("")
    (tmp_path / "advisor" / "app.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import ingest  # noqa\n"
    )
    (tmp_path / ".importlinter").write_text(_ini(config))
    done = subprocess.run(
        [LINT_IMPORTS, "--config", ".importlinter", "--no-cache"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)}, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "twin.store -> calibrate.registry" in done.stdout
    assert "advisor.app -> ingest" in done.stdout


def _ini(config: dict) -> str:
    """pyproject's [tool.importlinter] as an .importlinter file."""
    lines = ["[importlinter]", "root_packages =", *(f"    {p}" for p in config["root_packages"])]
    for n, contract in enumerate(config["contracts"]):
        lines += ["", f"[importlinter:contract:{n}]"]
        for key, value in contract.items():
            if isinstance(value, list):
                lines += [f"{key} =", *(f"    {v}" for v in value)]
            else:
                lines.append(f"{key} = {value}")
    return "\n".join(lines) + "\n"
