"""A test session leaves nothing behind in the temporary directory: its data and cache directories (made by
tests/conftest.py) are removed when it ends, and pytest keeps the tmp_path only of a test that failed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

PASSING = "def test_writes(tmp_path):\n    (tmp_path / 'f').write_text('x')\n"
FAILING = "def test_fails(tmp_path):\n    (tmp_path / 'g').write_text('y')\n    assert False\n"


def run_session(tmp_path: Path, body: str, *options: str) -> tuple[int, Path]:
    """A pytest session (with `options`) of one test file, with the project's settings and tests/conftest.py
    as a plugin and a temporary directory of its own; its exit code and that directory."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    test = tmp_path / "test_one.py"
    test.write_text(body)
    env = {k: v for k, v in os.environ.items() if k not in ("FINETWIN_DATA_DIR", "FINETWIN_CACHE_DIR")}
    env["TMPDIR"] = str(scratch)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(REPO / "pyproject.toml"),
         "--rootdir", str(tmp_path), "-p", "tests.conftest", *options, str(test)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return done.returncode, scratch


def leftovers(scratch: Path) -> list[str]:
    found = [p.name for p in scratch.iterdir() if p.name.startswith("finetwin-test-")]
    # pytest's "...current" names are symbolic links to the kept directories.
    kept = [
        p for p in scratch.glob("pytest-of-*/pytest-*/*") if not p.is_symlink() and not p.parent.is_symlink()
    ]
    found += [str(p.relative_to(scratch)) for p in kept]
    return sorted(found)


def test_a_passing_session_leaves_nothing_behind(tmp_path: Path) -> None:
    code, scratch = run_session(tmp_path, PASSING)
    assert code == 0, "the one test did not pass"
    assert leftovers(scratch) == []


def test_a_failing_session_keeps_only_the_failed_tests_tmp_path(tmp_path: Path) -> None:
    code, scratch = run_session(tmp_path, FAILING)
    assert code == 1
    kept = leftovers(scratch)
    assert len(kept) == 1 and kept[0].endswith("test_fails0"), kept
    assert (scratch / kept[0] / "g").read_text() == "y"


# Where the worker that runs it keeps its data and its cache, in a file named after the worker.
WHERE = """import os
from pathlib import Path

def test_where():
    where = Path(os.environ["TMPDIR"], os.environ["PYTEST_XDIST_WORKER"] + ".where")
    where.write_text(os.environ["FINETWIN_DATA_DIR"] + "\\n" + os.environ["FINETWIN_CACHE_DIR"])
"""


def test_workers_have_a_data_directory_each_and_share_the_cache(tmp_path: Path) -> None:
    """scripts/test runs the suite in pytest-xdist workers: one data directory between them would give two
    tests that write the default store at once each other's jobs."""
    code, scratch = run_session(tmp_path, WHERE, "-n", "2", "--dist", "each")
    assert code == 0, "the test did not pass on both workers"
    first, second = ((scratch / f"{worker}.where").read_text().splitlines() for worker in ("gw0", "gw1"))
    assert first[0] != second[0], "both workers wrote to one data directory"
    assert first[1] == second[1], "the workers compiled the native trees into caches of their own"
    assert leftovers(scratch) == []
