"""Reading an operator's text files (cluster and SLO files, scenarios, configurations, CSVs): every way one
can be unreadable said with the line it is on. A file saved in a legacy encoding names the line of its
first byte that is not UTF-8 (a decoder reading ahead by blocks reports the line it had got to, or none),
and a YAML file that does not parse names its line and column in one sentence (the parser's own message
spans four lines and quotes "<unicode string>")."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any


class TextFileError(ValueError):
    """A file that cannot be read as text of its kind; the message names the file, the line and the fix."""


# A document nested deeper than the parsers (which recurse per level) can go.
TOO_DEEP = "nested too deeply to read (a finetwin file nests a few levels)"
# What a CSV reader adds to `not_utf8`'s message: where a spreadsheet's export offers UTF-8.
SPREADSHEET_UTF8 = " (in a spreadsheet: CSV UTF-8)"


# What a spreadsheet's "CSV UTF-8" export (Excel's) starts the file with: not text of the file, so a reader
# that kept it would read the first column's name as "\ufeffmodel_name" and say the column is missing.
UTF8_BYTE_ORDER_MARK = b"\xef\xbb\xbf"


def without_byte_order_mark(data: bytes) -> bytes:
    """The bytes without the UTF-8 byte-order mark they start with, if they do (one; a second is text)."""
    return data[len(UTF8_BYTE_ORDER_MARK) :] if data.startswith(UTF8_BYTE_ORDER_MARK) else data


def not_utf8(data: bytes) -> tuple[int, str] | None:
    """(line, message) of the first byte that is not UTF-8, None when the text is UTF-8."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        start = data.rfind(b"\n", 0, exc.start) + 1
        near = data[max(start, exc.start - 20) : exc.start + 20].decode("utf-8", errors="replace")
        near = near.split("\n")[0].strip()
        return line, f"is not UTF-8 text (byte 0x{data[exc.start]:02x} in {near!r}): save the file as UTF-8"
    return None


def utf8_text(data: bytes, name: object) -> str:
    """The bytes as text, without a byte-order mark; raises TextFileError naming `name` and the line of the
    first byte that is not UTF-8."""
    data = without_byte_order_mark(data)
    problem = not_utf8(data)
    if problem is not None:
        raise TextFileError(f"{name}, line {problem[0]}: {problem[1]}")
    return data.decode("utf-8")


def yaml_message(exc: Exception) -> str:
    """A YAML parser's error in one sentence: `not valid YAML: line L, column C: what`, with the fix for a
    tab (YAML indents with spaces only)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    tab = " (YAML indents with spaces, not tabs)" if "'\\t'" in problem else ""
    return f"not valid YAML: {where}{problem}{tab}"


# YAML 1.2's floats: PyYAML follows YAML 1.1, where a number with an exponent needs a point and a signed
# exponent (`1.0e+8`); `1e8` and `1.5e9`, as people write a dataset's tokens, were text, refused as "not a
# valid number". The pattern is YAML 1.1's float with both made optional, and `1e8` without a point.
_YAML_12_FLOAT = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
    |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)


def python_reason(exc: ValueError) -> str:
    """Python's reason for refusing a value, as the middle of a sentence, without its advice for programmers
    (an integer of over 4,300 digits: "use sys.set_int_max_str_digits() to increase the limit")."""
    reason = str(exc).split(";")[0]
    return reason[:1].lower() + reason[1:]


def _unreadable_scalar(tag: str, value: str, exc: Exception) -> str:
    """What is wrong with a YAML value its type's constructor refused: the value (its start, for a long one),
    the type it was read as and why, with the fix for a text read as a date."""
    kind = tag.rsplit(":", 1)[-1]
    shown = repr(value) if len(value) <= 40 else f"{value[:40]!r}... ({len(value):,} characters)"
    reason = python_reason(exc) if type(exc) is ValueError else "not written as one"
    hint = "; quote it to keep it as text" if kind == "timestamp" else ""
    return f"{shown} is not a valid {kind} ({reason}){hint}"


@functools.cache
def _yaml_loader() -> type:
    import yaml

    class Loader(yaml.SafeLoader):
        """`yaml.safe_load`'s loader, with YAML 1.2's floats and its unique keys: a key written twice in one
        mapping (`number_gpus: 4`, later `number_gpus: 8`) kept the last silently."""

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            first_line: dict[Any, int] = {}
            for key_node, _ in node.value if isinstance(node, yaml.MappingNode) else ():
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: its keys may be overridden
                    continue
                key = self.construct_object(key_node, deep=True)
                if not isinstance(key, str | int | float | bool):
                    continue  # not a key any finetwin file has; the base loader says what is wrong with it
                if key in first_line:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark,
                        f"the key {key!r} is given twice (first on line {first_line[key] + 1})",
                        key_node.start_mark,
                    )  # fmt: skip
                first_line[key] = key_node.start_mark.line
            return super().construct_mapping(node, deep)

        def construct_object(self, node: Any, deep: bool = False) -> Any:
            # PyYAML's scalar constructors raise Python's own errors for a value that looks like their type
            # and is not one (`2026-13-45`, `!!int abc`, `!!bool maybe`, an integer of 5,000 digits): said
            # as YAML errors, at the value's line and column, not as a traceback.
            try:
                return super().construct_object(node, deep)
            except (ValueError, KeyError, AttributeError, IndexError, OverflowError) as exc:
                if not isinstance(node, yaml.ScalarNode):
                    raise
                raise yaml.constructor.ConstructorError(
                    None, None, _unreadable_scalar(node.tag, node.value, exc), node.start_mark
                ) from None

    Loader.add_implicit_resolver("tag:yaml.org,2002:float", _YAML_12_FLOAT, list("-+0123456789."))
    return Loader


def parse_yaml(text: str) -> Any:
    """`yaml.safe_load` of the text, reading `1e8` as the number it is (`_YAML_12_FLOAT`)."""
    import yaml

    return yaml.load(text, Loader=_yaml_loader())  # a SafeLoader: it builds plain data only


def read_yaml(path: Path) -> Any:
    """The YAML document of a file; raises TextFileError naming the file for one that cannot be read, is
    not UTF-8 or does not parse."""
    import yaml

    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TextFileError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    text = utf8_text(data, path)
    try:
        return parse_yaml(text)
    except yaml.YAMLError as exc:
        raise TextFileError(f"{path}: {yaml_message(exc)}") from exc
    except RecursionError:  # the parser recurses per level; no finetwin file nests more than a few
        raise TextFileError(f"{path}: {TOO_DEEP}") from None
