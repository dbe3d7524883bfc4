"""One job configuration read from a JSON or YAML file (or stdin), for `finetwin advise --file`: bounded
in size, and every way it can be unreadable said with the file's name."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from twin.text_files import TOO_DEEP, TextFileError, parse_yaml, python_reason, utf8_text, yaml_message

MAX_FILE_BYTES = 1_000_000


class ConfigFileError(ValueError):
    """A configuration file that cannot be read; the message names the file and the problem."""


def read_config_file(path: Path) -> Any:
    """A JSON or YAML document with one configuration (YAML is a superset of JSON; '-' reads stdin)."""
    import yaml

    try:
        if str(path) == "-":  # its bytes, read as a file's are (a byte-order mark, a line not UTF-8)
            data = sys.stdin.buffer.read(MAX_FILE_BYTES + 1)
        else:
            if path.stat().st_size > MAX_FILE_BYTES:
                raise ConfigFileError(
                    f"{path}: larger than {MAX_FILE_BYTES} bytes; one configuration expected"
                )
            data = path.read_bytes()
        text = utf8_text(data, path)
    except OSError as exc:
        raise ConfigFileError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except TextFileError as exc:
        raise ConfigFileError(str(exc)) from exc
    try:
        if path.suffix.lower() == ".json":
            document = json.loads(text, object_pairs_hook=lambda pairs: _unique_keys(path, pairs))
        else:
            document = parse_yaml(text)  # refuses a key given twice, naming its lines
    except json.JSONDecodeError as exc:
        raise ConfigFileError(
            f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}"
        ) from exc
    except ValueError as exc:  # valid JSON Python will not hold: an integer of over 4,300 digits
        raise ConfigFileError(f"{path}: a number too long to read ({python_reason(exc)})") from None
    except yaml.YAMLError as exc:
        raise ConfigFileError(f"{path}: {yaml_message(exc)}") from exc
    except RecursionError:
        raise ConfigFileError(f"{path}: {TOO_DEEP}") from None
    if not isinstance(document, dict):
        raise ConfigFileError(f"{path}: expected one configuration (a mapping of field: value)")
    return document


def _unique_keys(path: Path, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are each given once: a second `number_gpus` replaced the first silently."""
    document: dict[str, Any] = {}
    for key, value in pairs:
        if key in document:
            raise ConfigFileError(f"{path}: the key {key!r} is given twice in one object")
        document[key] = value
    return document
