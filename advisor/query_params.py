"""A query parameter the route does not take is an error, not ignored.

FastAPI ignores query parameters a route does not declare, so `GET /v1/jobs?status=running` (the parameter
is `state`) answered every job, and a caller read all of them as running. Every `/v1` route depends on
`reject_unknown_query`: an undeclared parameter is a 422 that names it, the parameter it most resembles and
the ones the route takes, in the shape of every other validation error (`advisor.errors`).
"""

from __future__ import annotations

from fastapi import Request
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError

from advisor.auth import V1_PREFIX
from twin.input_errors import did_you_mean

# A route's dependant never changes once the app is built: its parameters are collected once, and kept on
# the route itself (keyed by id() elsewhere, a route of a discarded app could lend its id to a new one).
_TAKEN_ATTRIBUTE = "_finetwin_query_names"


async def reject_unknown_query(request: Request) -> None:
    """async: a plain function would be run in the thread pool, which costs more than the check."""
    if not request.query_params:
        return
    route = request.scope.get("route")
    dependant: Dependant | None = getattr(route, "dependant", None)
    # Pages and files outside /v1 (the dashboard, its scripts) take what a browser adds to their address.
    if dependant is None or not getattr(route, "path", "").startswith(V1_PREFIX):
        return
    taken: tuple[str, ...] | None = getattr(route, _TAKEN_ATTRIBUTE, None)
    if taken is None:
        taken = tuple(dict.fromkeys(query_names(dependant)))
        setattr(route, _TAKEN_ATTRIBUTE, taken)
    unknown = [name for name in dict.fromkeys(request.query_params.keys()) if name not in taken]
    if unknown:
        takes = f"it takes {', '.join(taken)}" if taken else "it takes no query parameters"
        raise RequestValidationError(
            [
                {
                    "type": "extra_forbidden",
                    "loc": ("query", name),
                    "input": request.query_params[name],
                    "msg": f"unknown parameter{did_you_mean(name, taken)}; {takes}",
                }
                for name in unknown
            ]
        )


def query_names(dependant: Dependant) -> list[str]:
    """The query parameters of a route and of everything it depends on, by the names a caller sends."""
    names = [field.alias for field in dependant.query_params]
    for inner in dependant.dependencies:
        names.extend(query_names(inner))
    return names
