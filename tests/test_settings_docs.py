"""docs/settings.md stays true: every field of every product settings class is a row there, with the
default the code has; every `FINETWIN_*` name there (and anywhere in the repository's code, tests, deploy
files and docs) is a setting or one of the plain environment variables below, which something really reads."""

from __future__ import annotations

import importlib
import json
import re
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import AliasChoices
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "settings.md"
PRODUCT = ("finetwin", "twin", "ingest", "calibrate", "advisor")  # pyproject's packages
# Where a `FINETWIN_*` name may be written: each one must be documented (bench/ is left out: its scripts set
# variables of older checkouts they measure against).
SCANNED = (*PRODUCT, "tests", "scripts", "deploy", "docs", ".ci", "README.md")

# Variables read straight from the environment, not through a settings class, and the file that reads each.
PLAIN = {
    "FINETWIN_CACHE_DIR": "calibrate/native_trees.py",
    "CC": "calibrate/native_trees.py",
    "FINETWIN_OWNER_PASSWORD": "deploy/postgres/roles.sql",
    "FINETWIN_SERVICE_PASSWORD": "deploy/postgres/roles.sql",
    "FINETWIN_UNLOCKED": "scripts/bootstrap.sh",
    "FINETWIN_TEST_WORKERS": "scripts/test",
    "FINETWIN_REQUIRE_SERVICES": "tests/conftest.py",
    "FINETWIN_TEST_BROKER": "tests/services.py",
    "FINETWIN_TEST_POSTGRES": "tests/services.py",
    "FINETWIN_TEST_PG_URL": "tests/conftest.py",
    "FINETWIN_TEST_PG_HOST": "tests/conftest.py",
    "FINETWIN_TEST_PG_PORT": "tests/conftest.py",
    "FINETWIN_TEST_KAFKA_IMAGE": "tests/services.py",
    "FINETWIN_TEST_POSTGRES_IMAGE": "tests/services.py",
    "FINETWIN_CHROMIUM": "tests/conftest.py",
    "FINETWIN_UPDATE_DOCS": "tests/advisor/test_dashboard.py",
}

NAME = re.compile(r"\bFINETWIN_[A-Z0-9_]*[A-Z0-9]")


def settings_classes() -> list[type[BaseSettings]]:
    """Every BaseSettings subclass the product packages define (found by their source, then imported)."""
    classes: dict[str, type[BaseSettings]] = {}
    for package in PRODUCT:
        for path in sorted((REPO / package).rglob("*.py")):
            if not re.search(r"^class \w+\(.*Settings.*\):", path.read_text(), flags=re.M):
                continue
            module = importlib.import_module(".".join(path.relative_to(REPO).with_suffix("").parts))
            for value in vars(module).values():
                if (
                    isinstance(value, type)
                    and issubclass(value, BaseSettings)
                    and value.__module__ == module.__name__
                ):
                    classes[f"{value.__module__}.{value.__qualname__}"] = value
    return list(classes.values())


def env_names(cls: type[BaseSettings], name: str, field: FieldInfo) -> list[str]:
    """The variables pydantic-settings reads for a field: its alias(es), else the class's prefix + name."""
    alias = field.validation_alias or field.alias
    if alias is None:
        return [f"{cls.model_config.get('env_prefix', '')}{name}".upper()]
    if isinstance(alias, str):
        return [alias.upper()]
    assert isinstance(alias, AliasChoices), f"{cls.__name__}.{name}: an alias this test cannot read"
    return [choice.upper() for choice in alias.choices if isinstance(choice, str)]


def written(value: Any) -> str | None:
    """A default as the table writes it (first in its cell); None: not checkable on this platform."""
    if value is None:
        return "unset"
    if isinstance(value, list):
        return "unset" if not value else f"`{json.dumps([str(item) for item in value])}`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, Path):
        if sys.platform != "linux":
            return None  # the table gives Linux's platform directory
        home = str(Path.home())
        text = str(value)
        value = "~" + text.removeprefix(home) if text.startswith(home + "/") else text
    return f"`{value}`"


def product_settings(monkeypatch: pytest.MonkeyPatch) -> dict[str, str | None]:
    """Each settings variable and its default as the table writes it."""
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)  # the default data directory as a user has it
    found: dict[str, str | None] = {}
    for cls in settings_classes():
        for name, field in cls.model_fields.items():
            if field.default_factory is not None:
                default = field.default_factory()  # type: ignore[call-arg]
            else:
                assert field.default is not PydanticUndefined, f"{cls.__name__}.{name}: required setting"
                default = field.default
            for variable in env_names(cls, name, field):
                assert found.get(variable, written(default)) == written(default), f"{variable}: two defaults"
                found[variable] = written(default)
    return found


def rows() -> dict[str, str]:
    """The tables' rows: variable -> default cell (a variable in two rows fails)."""
    table: dict[str, str] = {}
    for line in DOC.read_text().splitlines():
        if not line.startswith("| `"):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        assert len(cells) == 3, f"not a row of three cells (a `|` in the text?): {line}"
        variable = cells[0].strip("`")
        assert variable not in table, f"{variable} is in two rows"
        table[variable] = cells[1]
    return table


def test_the_product_has_settings_to_check(monkeypatch: pytest.MonkeyPatch) -> None:
    variables = product_settings(monkeypatch)
    assert len(variables) > 50 and "FINETWIN_CLUSTER_ID" in variables  # the discovery found the classes


def test_every_setting_is_documented_with_its_default(monkeypatch: pytest.MonkeyPatch) -> None:
    table = rows()
    missing, wrong = [], []
    for variable, default in sorted(product_settings(monkeypatch).items()):
        cell = table.get(variable)
        if cell is None:
            missing.append(variable)
        elif default is not None and cell != default and not cell.startswith(f"{default} "):
            wrong.append(f"{variable}: the code's default is {default}, the table says {cell!r}")
    problems = [f"settings missing from docs/settings.md: {', '.join(missing)}"] if missing else []
    problems += [f"a default in docs/settings.md that is not the code's: {line}" for line in wrong]
    assert not problems, "\n".join(problems)


def test_the_doc_names_no_variable_that_nothing_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    known = set(product_settings(monkeypatch)) | set(PLAIN)
    table = rows()
    named = set(NAME.findall(DOC.read_text())) | set(table)
    assert not named - known, f"docs/settings.md names variables nothing reads: {sorted(named - known)}"
    assert not set(PLAIN) - set(table), f"not in docs/settings.md's tables: {sorted(set(PLAIN) - set(table))}"


def test_the_plain_variables_are_read_where_this_test_says() -> None:
    unread = [
        f"{variable} ({source})"
        for variable, source in PLAIN.items()
        if not re.search(rf"\b{variable}\b", (REPO / source).read_text())
    ]
    assert not unread, f"no longer read there: {', '.join(unread)} (drop the row, or say where it is read)"
    from tests.services import KAFKA_IMAGE, POSTGRES_IMAGE

    table = rows()
    assert table["FINETWIN_TEST_KAFKA_IMAGE"] == f"`{KAFKA_IMAGE}`"
    assert table["FINETWIN_TEST_POSTGRES_IMAGE"] == f"`{POSTGRES_IMAGE}`"


def test_every_variable_the_repository_names_is_documented(monkeypatch: pytest.MonkeyPatch) -> None:
    known = set(product_settings(monkeypatch)) | set(PLAIN)
    undocumented: dict[str, set[str]] = {}
    for top in SCANNED:
        root = REPO / top
        for path in [root] if root.is_file() else sorted(root.rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            data = path.read_bytes()
            if b"\0" in data[:8192]:
                continue  # images, compiled files
            for variable in set(NAME.findall(data.decode(errors="replace"))) - known:
                undocumented.setdefault(variable, set()).add(str(path.relative_to(REPO)))
    where = [f"{variable}: {', '.join(sorted(paths))}" for variable, paths in sorted(undocumented.items())]
    assert not where, "named but in no row of docs/settings.md (nor in PLAIN here):\n" + "\n".join(where)
