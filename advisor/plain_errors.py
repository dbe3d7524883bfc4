"""pydantic's validation errors in the words of what to change, for the API's 422s (`advisor.errors`).

pydantic words its errors for the programmer of the model: "Input should be a valid dictionary or object to
extract fields from" (of a body that is `null`), "JSON decode error" at `body.17` (a character offset as a
field), `body.interval.constrained-str` and `body.interval.float` (the internal names of a union's branches,
each with its own complaint), "List should have at least 1 item after validation, not 0" (of a string, too).
Each error here keeps its shape (`loc`, `msg`, `type`); its `loc` names only fields and list positions, and
its `msg` says what is wrong with what was sent, so that the caller knows what to send instead.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from twin.input_errors import did_you_mean, keys_at, plain_message

Loc = tuple[str | int, ...]

# Keys that are fields elsewhere in the API, where a section that lacks them is given one: what each is, so
# that the caller learns where it belongs rather than a field it resembles in spelling (for `dataset_tokens`
# on /v1/predict that was "did you mean 'fast_kernels'?").
ELSEWHERE = {
    "dataset_tokens": "not a field of a configuration: dataset_tokens is a job's work (the tokens it "
    "processes), which POST /v1/advise takes beside a configuration; leave it out here",
}

# pydantic's types of "the input is of another JSON kind than this branch takes"; a union's branch that
# refused the input for its kind says less than one that took its kind and refused its value.
_KIND_ERRORS = frozenset(
    {"string_type", "float_type", "int_type", "bool_type", "dict_type", "list_type", "model_type",
     "model_attributes_type", "none_required", "is_instance_of", "bytes_type"}
)  # fmt: skip
_OBJECT_ERRORS = frozenset({"model_attributes_type", "model_type", "dict_type"})
_JSON_BODY = "Content-Type: application/json"


def plain_errors(
    errors: Sequence[Any], body_model: type[BaseModel] | None, body: Any = None
) -> list[dict[str, Any]]:
    """pydantic's errors (`exc.errors()`, consequences already dropped) as `{"loc", "msg", "type"}` each, in
    plain words. `body_model`: the model the route reads its whole body into (for union branches and unknown
    keys); `body`: the body as FastAPI read it (the text of a body that is not valid JSON)."""
    merged = [(_where(loc, error), error) for loc, error in _merge_union_branches(list(errors), body_model)]
    return [
        {"loc": list(loc), "msg": _message(error, loc, body_model, body), "type": error.get("type", "")}
        for loc, error in merged
    ]


# --- union branches ----------------------------------------------------------------------------------------


def _merge_union_branches(errors: list[Any], model: type[BaseModel] | None) -> list[tuple[Loc, Any]]:
    """Each error with its `loc` free of union branch names. Of a union's errors, those of the branches that
    took the input's kind (`""` for a string or a number: the string's) stand for it; when no branch took
    it, one error says which kinds it takes."""
    out: list[tuple[Loc, Any]] = []
    unions: dict[Loc, list[tuple[str, Loc, Any]]] = {}
    for error in errors:
        loc = _loc(error)
        at = _union_tag_index(model, loc)
        if at is None:
            out.append((loc, error))
            continue
        branches = unions.setdefault(loc[:at], [])
        if not branches:
            out.append((loc[:at], None))  # its place in the order, filled below
        branches.append((str(loc[at]), loc[:at] + loc[at + 1 :], error))
    merged: list[tuple[Loc, Any]] = []
    for loc, error in out:
        if error is not None:
            merged.append((loc, error))
            continue
        branches = unions[loc]
        fitting = [(inner, e) for _tag, inner, e in branches if e.get("type") not in _KIND_ERRORS]
        merged.extend(fitting or [(loc, _no_branch_takes(branches))])
    return merged


def _no_branch_takes(branches: list[tuple[str, Loc, Any]]) -> dict[str, Any]:
    kinds = list(dict.fromkeys(_expected(tag, error) for tag, _loc, error in branches))
    given = branches[0][2].get("input")
    return {"type": "union_type", "msg": f"should be {' or '.join(kinds)}, not {_kind_of(given)}"}


def _expected(tag: str, error: Any) -> str:
    """What a branch takes, from its own message ("Input should be a valid number") or its name."""
    said = str(error.get("msg", ""))
    if said.startswith("Input should be "):
        return said.removeprefix("Input should be ")
    return {"str": "a string", "float": "a number", "int": "a whole number", "bool": "true or false"}.get(
        tag.removeprefix("constrained-"), f"a {tag}"
    )


def _union_tag_index(model: type[BaseModel] | None, loc: Loc) -> int | None:
    """The position in `loc` (which starts with "body") of a union branch's name, if the path crosses a union
    of more than one type besides None; found by following the path through the body's model."""
    if model is None or loc[:1] != ("body",):
        return None
    annotation: Any = model
    for index in range(1, len(loc)):
        annotation = _unwrapped(annotation)
        if len(_union_members(annotation)) > 1:
            return index
        annotation = _inner(annotation, loc[index])
        if annotation is None:
            return None
    return None


def _unwrapped(annotation: Any) -> Any:
    """`Annotated[X, ...]` and `X | None` as X (pydantic names no branch for None)."""
    while True:
        if typing.get_origin(annotation) is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
            continue
        members = _union_members(annotation)
        if len(members) == 1:
            annotation = members[0]
            continue
        return annotation


def _union_members(annotation: Any) -> list[Any]:
    if typing.get_origin(annotation) not in (typing.Union, types.UnionType):
        return []
    return [a for a in typing.get_args(annotation) if a is not type(None)]


def _inner(annotation: Any, part: str | int) -> Any:
    """The annotation one step of the path further: a model's field, a list's items, a mapping's values."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        field = annotation.model_fields.get(str(part))
        return field.annotation if field is not None else None
    origin, arguments = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (list, tuple, set, frozenset, Sequence) and arguments:
        return arguments[0]
    if origin is dict and len(arguments) == 2:
        return arguments[1]
    return None


# --- messages ----------------------------------------------------------------------------------------------


def _message(error: Any, loc: Loc, body_model: type[BaseModel] | None, body: Any) -> str:
    kind = error.get("type", "")
    given = error.get("input")
    if kind == "json_invalid":
        return _invalid_json(error, body)
    if kind == "missing" and loc == ("body",):
        return f"empty: send a JSON object of the fields, with {_JSON_BODY}"
    if kind in _OBJECT_ERRORS:
        what = "a JSON object of the fields" if loc == ("body",) else "an object"
        return f'should be {what} ({{"name": value, ...}}), not {_kind_of(given)}'
    if kind == "too_short":
        return _too_short(error)
    if kind == "too_long" and isinstance(given, list):
        return f"has {len(given)} items, more than {error.get('ctx', {}).get('max_length')}"
    if kind == "string_too_short" and given == "":
        return "is empty"
    if kind == "int_parsing":
        return f"should be a whole number, not {given!r}"
    if kind == "float_parsing":
        return f"should be a number, not {given!r}"
    if kind == "extra_forbidden":
        return _unknown_key(error, loc, body_model)
    return plain_message(error.get("msg", ""))


def _invalid_json(error: Any, body: Any) -> str:
    """Where and why the body is not JSON, by line and column (FastAPI gave a character offset as a field)."""
    said = error.get("ctx", {}).get("error") or "not JSON"
    position = next((p for p in error.get("loc", ())[1:] if isinstance(p, int)), None)
    if position is None or not isinstance(body, str):
        return f"not valid JSON: {said}"
    line = body.count("\n", 0, position) + 1
    column = position - (body.rfind("\n", 0, position) + 1) + 1
    ended = "; the body ends there: was it cut short?" if position >= len(body.rstrip()) else ""
    return f"not valid JSON: {said} at line {line}, column {column} (character {position}){ended}"


def _too_short(error: Any) -> str:
    given, least = error.get("input"), error.get("ctx", {}).get("min_length", 1)
    if isinstance(given, str):
        return "is empty" if not given else f"has {len(given)} characters, fewer than {least}"
    items = "item" if least == 1 else "items"
    if isinstance(given, list | tuple | dict) and not given:
        return f"is empty: give at least {least} {items}"
    return f"should have at least {least} {items}, not {error.get('ctx', {}).get('actual_length')}"


def _unknown_key(error: Any, loc: Loc, body_model: type[BaseModel] | None) -> str:
    """pydantic's "Extra inputs are not permitted", with the key of its section it stands for, where it
    belongs when it is another part of the API's field, or else the keys its section takes (as an unknown
    query parameter's message lists the route's): `{"gpu_model": ..., "count": 1}` for a node change said
    nothing of `add`."""
    said = plain_message(error.get("msg", ""))
    if body_model is None or loc[:1] != ("body",) or len(loc) < 2:
        return said
    name, section = str(loc[-1]), keys_at(body_model, loc[1:-1])
    if name in ELSEWHERE and name not in section:
        return ELSEWHERE[name]
    meant = did_you_mean(name, section)
    return said + (meant or (f"; it takes {', '.join(section)}" if section else ""))


def _kind_of(value: Any) -> str:
    """How a JSON value reads to its sender: `null`, a list, a string, ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bytes):
        return f"a body the API did not read as JSON (send it with {_JSON_BODY})"
    if isinstance(value, int | float):
        return f"the number {value!r}"
    if isinstance(value, str):
        return f"the string {value[:40]!r}"
    if isinstance(value, list | tuple):
        return "a list"
    return "an object" if isinstance(value, dict) else type(value).__name__


def _where(loc: Loc, error: Any) -> Loc:
    """An invalid JSON body is wrong as a whole: its offset is said in the message, not as a field."""
    return ("body",) if error.get("type") == "json_invalid" else loc


def _loc(error: Any) -> Loc:
    return tuple(p if isinstance(p, int) else str(p) for p in error.get("loc", ()))
