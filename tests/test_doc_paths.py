"""The documents name files that exist: every repository path a README or a page of `docs/` writes in
backticks (`twin/lifeline.py`, `tests/process_ends.py`) is there, so that a file moved or renamed takes its
mentions with it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCUMENTS = [REPO / "README.md", REPO / "deploy" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
TOP_LEVEL = "twin|ingest|calibrate|advisor|finetwin|tests|bench|scripts|deploy|docs"
PATH = re.compile(rf"(?:{TOP_LEVEL})/[A-Za-z0-9_./-]*")
CODE = re.compile(r"```[^\n]*\n(.*?)```|`([^`\n]+)`", re.DOTALL)  # a fenced block, or code in a line


def named_paths(text: str) -> list[str]:
    """The repository paths in the document's code: each word of it that is one, whole."""
    words = [word for match in CODE.finditer(text) for word in (match.group(1) or match.group(2)).split()]
    return [word.rstrip(".,;:") for word in words if PATH.fullmatch(word.rstrip(".,;:"))]


def test_a_path_is_read_from_code_and_nothing_else() -> None:
    text = (
        "see `twin/lifeline.py`, `docs/` and `.venv/bin/python bench/fidelity.py --seeds 0`; twin/prose.py\n"
        "```sh\nscripts/test tests/twin   # comment naming twin/x.py.\n```\n`FINETWIN_SLO_FILE=twin/y.yaml`"
    )
    expected = ["twin/lifeline.py", "docs/", "bench/fidelity.py", "scripts/test", "tests/twin", "twin/x.py"]
    assert named_paths(text) == expected


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: str(path.relative_to(REPO)))
def test_every_path_a_document_names_exists(document: Path) -> None:
    missing = [path for path in named_paths(document.read_text()) if not (REPO / path).exists()]
    assert not missing, f"{document.relative_to(REPO)} names paths that do not exist: {missing}"
