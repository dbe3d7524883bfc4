"""What is wrong with a document (a YAML file, a request body) that a pydantic model refused, in one message:
each unknown key with the key of its own section it most resembles, then the missing keys, else the first
error. The keys offered are those of the section the unknown key sits in (`changes.nodez` -> the keys of
`changes`), not the document's top level."""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError


def validation_message(exc: ValidationError, model: type[BaseModel], also: Sequence[str] = ()) -> str:
    """`also`: top-level keys the caller reads itself, before the model (a scenario's `cluster` file)."""
    found = exc.errors()
    unknown = [e["loc"] for e in found if e.get("type") == "extra_forbidden"]
    missing = [_dotted(e["loc"]) for e in found if e.get("type") == "missing"]
    if not unknown and not missing:
        return first_error(exc)
    parts = []
    for loc in unknown:
        close = closest(str(loc[-1]), keys_at(model, loc[:-1], also))
        parts.append(f"unknown key {_dotted(loc)!r}" + (f" (did you mean {close!r}?)" if close else ""))
    if missing:
        parts.append(f"missing: {', '.join(missing)}")
    section = unknown[0][:-1] if unknown else ()
    named = [str(p) for p in section if not isinstance(p, int)]
    where = f" of {'.'.join(named)}" if named else ""
    return "; ".join(parts) + f" (known keys{where}: {', '.join(keys_at(model, section, also))})"


def unknown_keys(given: Iterable[Any], known: Sequence[str]) -> str | None:
    """For a document read without pydantic: its keys not in `known`, each with the known key it most
    resembles, and the known keys; None when every key is known."""
    unknown = sorted(str(k) for k in given if k not in known)
    if not unknown:
        return None
    parts = []
    for key in unknown:
        close = closest(key, known)
        parts.append(f"unknown key {key!r}" + (f" (did you mean {close!r}?)" if close else ""))
    return "; ".join(parts) + f" (known keys: {', '.join(known)})"


def closest(name: str, names: Iterable[str]) -> str | None:
    """The one of `names` that `name` most resembles, if any is close enough to be a misspelling of it."""
    close = difflib.get_close_matches(name, list(names), n=1, cutoff=0.6)
    return close[0] if close else None


def first_error(exc: ValidationError) -> str:
    """The first problem pydantic found, as `field.path: message`."""
    first = exc.errors()[0]
    where = _dotted(first.get("loc", ()))
    return f"{where}: {first.get('msg', 'invalid')}" if where else str(first.get("msg", ""))


def keys_at(model: type[BaseModel], path: Sequence[Any], also: Sequence[str] = ()) -> list[str]:
    """The field names of the model the document's `path` leads to (list indexes skipped), with `also` at
    the top level; the top level's where the path leaves the models (a free-form mapping)."""
    top = [*model.model_fields, *also]
    current = model
    for part in path:
        if isinstance(part, int):
            continue
        field = current.model_fields.get(str(part))
        inner = _model_in(field.annotation) if field is not None else None
        if inner is None:
            return top
        current = inner
    return top if current is model else list(current.model_fields)


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model an annotation holds: itself, or inside list[...], X | None, Annotated[...]."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (list, tuple, typing.Union, types.UnionType, typing.Annotated):
        for argument in typing.get_args(annotation):
            found = _model_in(argument)
            if found is not None:
                return found
    return None


def _dotted(loc: Sequence[Any]) -> str:
    return ".".join(str(p) for p in loc)
