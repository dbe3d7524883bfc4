"""The examples of the input files (docs/examples/) and the page that documents them (docs/input-files.md):
every example is read by the loader its command uses, every command the page shows runs and exits 0, and
every example is on the page word for word, so the page, the files and the loaders cannot drift apart."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from pathlib import Path

import pytest

from finetwin.cli import main
from tests.advisor.fakes import FakeModels

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "input-files.md"
EXAMPLES = REPO / "docs" / "examples"
FINETWIN = ".venv/bin/finetwin"
# A fenced block of the page: its language and its text (the lines between the fences, each with its "\n").
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
ASSIGNMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=")


def example_files() -> list[Path]:
    return sorted(p for p in EXAMPLES.iterdir() if p.is_file())


def fenced_blocks() -> list[tuple[str, str]]:
    return FENCE.findall(DOC.read_text(encoding="utf-8"))


def page_commands() -> list[str]:
    """The command lines of the page's ```sh blocks (each `[VAR=value ...] .venv/bin/finetwin ...`)."""
    lines = [line.strip() for lang, text in fenced_blocks() if lang == "sh" for line in text.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


# --- (a) every example is read by the loader its command uses -----------------------------------------------


def load_cluster_file(path: Path) -> None:
    from twin.cluster import load_cluster  # `simulate --cluster`, `plan --cluster`, a scenario's `cluster:`

    cluster = load_cluster(path)
    assert cluster.total_gpus > 0


def load_jobs_file(path: Path) -> None:
    # What `simulate`, `plan` and `whatif` call: read_jobs_csv with the cluster, and the rule that a job
    # naming no GPU type needs a cluster of one type (the example cluster has two).
    from finetwin.commands.twin_inputs import explicit_inputs

    _cluster, workload = explicit_inputs(EXAMPLES / "cluster.yaml", path)
    assert len(workload) > 0 and all(workload.gpu_models)


def load_slo_file(path: Path) -> None:
    from twin.slo_attainment import DEFAULT_SLOS, load_slos  # `plan --slo`, FINETWIN_SLO_FILE

    slos = load_slos(path)
    assert slos.slos and slos != DEFAULT_SLOS


def load_scenario_file(path: Path) -> None:
    # `finetwin whatif` reads its scenario in the command itself (finetwin/commands/twin.py): the same steps.
    from finetwin.commands.twin_inputs import explicit_inputs
    from twin.forecast import TwinInputs
    from twin.text_files import read_yaml
    from twin.whatif import WhatIf, apply_changes

    spec = read_yaml(path)
    assert isinstance(spec, dict)
    cluster_file, workload_file = spec.pop("cluster"), spec.pop("workload")
    what = WhatIf.model_validate(spec)
    inputs = TwinInputs(*explicit_inputs(path.parent / cluster_file, path.parent / workload_file))
    changed, _options = apply_changes(inputs, what.baseline_options(), what.changes)
    assert not what.changes.is_empty() and changed.cluster != inputs.cluster


def load_advise_file(path: Path) -> None:
    from advisor.advice_plan import plan_advice
    from advisor.advice_schemas import AdviceRequest
    from advisor.config_file import read_config_file

    request = AdviceRequest.model_validate(read_config_file(path))
    plan_advice(*request.to_job())  # raises AdviceError for a configuration the advisor cannot reason about


LOADERS: dict[str, Callable[[Path], None]] = {
    "cluster.yaml": load_cluster_file,
    "jobs.csv": load_jobs_file,
    "slo.yaml": load_slo_file,
    "scenario.yaml": load_scenario_file,
    "advise.yaml": load_advise_file,
    "advise.json": load_advise_file,
}


@pytest.mark.parametrize("path", example_files(), ids=lambda p: p.name)
def test_every_example_is_read_by_its_commands_loader(path: Path) -> None:
    assert path.name in LOADERS, f"{path.name}: say here which loader reads it"
    LOADERS[path.name](path)


def test_the_examples_are_the_ones_the_loaders_expect() -> None:
    assert [p.name for p in example_files()] == sorted(LOADERS)


# --- (b) every command the page shows runs through the CLI and exits 0 --------------------------------------


@pytest.fixture
def clean_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty data directory and no models (configured jobs use the labelled fallback), no SLO file, store
    or Ray cluster from the environment; commands run from the repository's root, as the page says."""
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("FINETWIN_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("FINETWIN_MODELS_DIR", str(tmp_path / "no-models"))
    for name in ("FINETWIN_SLO_FILE", "FINETWIN_DATABASE_URL", "FINETWIN_RAY_ADDRESS"):
        monkeypatch.delenv(name, raising=False)


def test_the_page_shows_a_command_for_every_example() -> None:
    commands = page_commands()
    assert commands and all(FINETWIN in shlex.split(c) for c in commands), commands
    for path in example_files():
        assert any(f"docs/examples/{path.name}" in c for c in commands), f"no command uses {path.name}"


def command_id(line: str) -> str:
    """A short id for a command line: the command and the example files it names."""
    words = shlex.split(line)
    command = words[words.index(FINETWIN) + 1]
    files = [Path(w).name for w in words if w.startswith("docs/examples/") or "=docs/examples/" in w]
    return "-".join([command, *files])


@pytest.mark.parametrize("line", page_commands(), ids=command_id)
def test_every_command_on_the_page_exits_0(
    line: str, clean_settings: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    words = shlex.split(line)
    while ASSIGNMENT.match(words[0]):
        name, value = words.pop(0).split("=", 1)
        monkeypatch.setenv(name, value)
    assert words[0] == FINETWIN, line
    argv = words[1:]
    if argv[0] == "advise":
        # advise needs calibrated models (`finetwin calibrate`, ~1 min): the trend-following stand-in of the
        # advice tests answers for them; reading the file, the request and the answer are the command's own.
        import calibrate.registry

        monkeypatch.setattr(calibrate.registry, "load_in_use_quickly", lambda _: ("v-example", FakeModels()))
    status = main(argv)
    out, err = capsys.readouterr()
    assert status == 0, f"{line}\n{err}"
    if "--json" in argv:
        json.loads(out)


# --- (c) every example is on the page word for word ---------------------------------------------------------


@pytest.mark.parametrize("path", example_files(), ids=lambda p: p.name)
def test_every_example_is_shown_verbatim_on_the_page(path: Path) -> None:
    blocks = [text for _lang, text in fenced_blocks()]
    assert path.read_text(encoding="utf-8") in blocks, (
        f"docs/input-files.md has no code block identical to docs/examples/{path.name}"
    )
    assert f"`docs/examples/{path.name}`" in DOC.read_text(encoding="utf-8")
