"""A query parameter the route does not take is an error, not ignored; so is one given twice that takes one
value.

FastAPI ignores query parameters a route does not declare, so `GET /v1/jobs?status=running` (the parameter
is `state`) answered every job, and a caller read all of them as running. Every `/v1` route depends on
`reject_unknown_query`: an undeclared parameter is a 422 that names it, the parameter it most resembles and
the ones the route takes, in the shape of every other validation error (`advisor.errors`).

FastAPI also keeps only the last value of a parameter given twice: `?state=running&state=completed`, which
many clients write to mean "either", answered the completed jobs alone, and `?limit=1&limit=3` three. A
single-valued parameter given more than once is a 422 that names it and its values.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.dependencies.models import Dependant

# The test FastAPI itself applies to read a parameter as a list of all its values (`getlist`).
from fastapi.dependencies.utils import field_annotation_is_sequence
from fastapi.exceptions import RequestValidationError

from advisor.auth import V1_PREFIX
from twin.input_errors import did_you_mean

# A route's dependant never changes once the app is built: its parameters are collected once, and kept on
# the route itself (keyed by id() elsewhere, a route of a discarded app could lend its id to a new one).
_TAKEN_ATTRIBUTE = "_finetwin_query_names"


@dataclass(frozen=True)
class QueryNames:
    """The query parameters a route takes, by the names a caller sends, and those of them that take a list."""

    taken: tuple[str, ...]
    lists: frozenset[str]


async def reject_unknown_query(request: Request) -> None:
    """async: a plain function would be run in the thread pool, which costs more than the check."""
    if not request.query_params:
        return
    route = request.scope.get("route")
    dependant: Dependant | None = getattr(route, "dependant", None)
    # Pages and files outside /v1 (the dashboard, its scripts) take what a browser adds to their address.
    if dependant is None or not getattr(route, "path", "").startswith(V1_PREFIX):
        return
    names: QueryNames | None = getattr(route, _TAKEN_ATTRIBUTE, None)
    if names is None:
        names = query_names(dependant)
        setattr(route, _TAKEN_ATTRIBUTE, names)
    problems = _unknown(request, names.taken) + _repeated(request, names)
    if problems:
        raise RequestValidationError(problems)


def _unknown(request: Request, taken: tuple[str, ...]) -> list[dict[str, object]]:
    unknown = [name for name in dict.fromkeys(request.query_params.keys()) if name not in taken]
    takes = f"it takes {', '.join(taken)}" if taken else "it takes no query parameters"
    return [
        {
            "type": "extra_forbidden",
            "loc": ("query", name),
            "input": request.query_params[name],
            "msg": f"unknown parameter{did_you_mean(name, taken)}; {takes}",
        }
        for name in unknown
    ]


def _repeated(request: Request, names: QueryNames) -> list[dict[str, object]]:
    """A parameter that takes one value, given more than once (an unknown one is said to be unknown)."""
    problems: list[dict[str, object]] = []
    for name in dict.fromkeys(request.query_params.keys()):
        values = request.query_params.getlist(name)
        if len(values) < 2 or name not in names.taken or name in names.lists:
            continue
        given = ", ".join(repr(v) for v in values)
        problems.append(
            {
                "type": "repeated_parameter",
                "loc": ("query", name),
                "input": values,
                "msg": f"given {len(values)} times ({given}); it takes one value, so give it once",
            }
        )
    return problems


def query_names(dependant: Dependant) -> QueryNames:
    """The query parameters of a route and of everything it depends on."""
    taken: dict[str, None] = {}
    lists: set[str] = set()
    for field in _query_fields(dependant):
        taken[field.alias] = None
        if field_annotation_is_sequence(field.field_info.annotation):
            lists.add(field.alias)
    return QueryNames(taken=tuple(taken), lists=frozenset(lists))


def _query_fields(dependant: Dependant) -> Iterator[Any]:
    """FastAPI's fields (`ModelField`) of the route's query parameters and its dependencies'."""
    yield from dependant.query_params
    for inner in dependant.dependencies:
        yield from _query_fields(inner)
