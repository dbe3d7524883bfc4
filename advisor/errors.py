"""One shape for every error the API answers, and an OpenAPI document that says so.

Every 4xx is `{"detail": "<what is wrong, for a person>", "errors": [{"loc", "msg", "type"}, ...]}`, with
`errors` (field by field) on validation errors only. FastAPI's own document describes its default 422
(`detail` a list) and leaves out the answers that come from outside a route (a body that is not JSON, too
large, a key missing or unknown, too many failed attempts): `document_errors` rewrites the document so that
what it says is what the API does (`tests/advisor/test_fuzz.py` checks responses against it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.routing import compile_path

from advisor.asgi_body import read_as_json
from advisor.auth import V1_PREFIX
from advisor.plain_errors import plain_errors
from advisor.store_errors import STORE_ERRORS, STORE_RETRY_AFTER_S, STORE_UNAVAILABLE, driver_says
from twin.executors import ExecutorUnavailable
from twin.input_errors import causes

log = logging.getLogger(__name__)

_BODY_METHODS = frozenset({"post", "put", "patch"})


class FieldError(BaseModel):
    loc: list[str | int] = Field(description="where: body / query / path, then the field")
    msg: str
    type: str


class ErrorOut(BaseModel):
    detail: str = Field(description="what is wrong, in words")
    errors: list[FieldError] | None = Field(default=None, description="validation errors, field by field")


# Errors the detail names; the rest are counted ("and 2 more"), and all are in `errors`.
DETAIL_ERRORS = 5


def validation_error_response(
    exc: RequestValidationError, body_model: type[BaseModel] | None = None, content_type: str | None = None
) -> JSONResponse:
    """A bad request says what is wrong, field by field, with a 422. The detail names the first five, an
    unknown key first: it usually explains the fields missing beside it (`{"rows": [...]}` for `configs`
    read as one configuration with seven fields missing, and its `rows` was the eighth error, cut off). Each
    error is in plain words (`advisor.plain_errors`): an unknown key of the body (`body_model`'s) says which
    key of its section it stands for, when one is close (`seq_len` -> `tokens_per_sample`). A body sent as
    something other than JSON, or with no Content-Type (`content_type`), says which type to send."""
    errors = plain_errors(causes(exc.errors()), body_model, exc.body)
    first = sorted(errors, key=lambda e: e["type"] != "extra_forbidden")  # stable: otherwise in order
    detail = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in first[:DETAIL_ERRORS])
    if len(first) > DETAIL_ERRORS:
        detail += f"; and {len(first) - DETAIL_ERRORS} more (in errors)"
    whole_body = any(e["loc"] == ["body"] for e in errors)
    if body_model is not None and whole_body and not read_as_json(content_type):
        # FastAPI reads such a body as bytes, and said only that they are not an object.
        detail = _send_json(content_type)
    return JSONResponse(status_code=422, content={"detail": detail or "invalid request", "errors": errors})


def _send_json(content_type: str | None) -> str:
    """The detail for a body FastAPI did not read as JSON because of its Content-Type (or its lack of one)."""
    sent = f"this request's is {content_type!r}" if content_type else "this request has none"
    add = "add -H 'Content-Type: application/json'"
    # curl -d sends a form's type without being asked: the usual way to get here (and not a multipart's).
    if content_type is not None and "x-www-form-urlencoded" in content_type.lower():
        add = f"curl -d sends application/x-www-form-urlencoded: {add}"
    return f"the body must be JSON, sent with Content-Type: application/json; {sent} ({add})"


def route_body_model(request: Request) -> type[BaseModel] | None:
    """The pydantic model a route reads its whole JSON body into, if it reads one so (not embedded)."""
    dependant = getattr(request.scope.get("route"), "dependant", None)
    params = getattr(dependant, "body_params", [])
    if len(params) != 1 or getattr(params[0].field_info, "embed", False):
        return None
    model = params[0].field_info.annotation
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_error_response(exc, route_body_model(request), request.headers.get("content-type"))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 405:
            exc.headers = {**(exc.headers or {}), "Allow": _allowed_methods(request, exc.headers)}
        return await http_exception_handler(request, exc)

    async def _store_unavailable(request: Request, exc: Exception) -> JSONResponse:
        # The server's to fix, and worth a retry, not a 500 with a traceback (`advisor.store_errors`).
        log.warning("the store did not answer %s %s: %s", request.method, request.url.path, driver_says(exc))
        return JSONResponse(
            status_code=503,
            content={"detail": STORE_UNAVAILABLE},
            headers={"Retry-After": STORE_RETRY_AFTER_S},
        )

    for error in STORE_ERRORS:
        app.add_exception_handler(error, _store_unavailable)

    @app.exception_handler(ExecutorUnavailable)
    async def _executor_unavailable(_request: Request, exc: ExecutorUnavailable) -> JSONResponse:
        # FINETWIN_RAY_ADDRESS names a Ray cluster that does not answer: the server's to fix, not the caller.
        return JSONResponse(status_code=503, content={"detail": str(exc)})


_HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def _allowed_methods(request: Request, headers: Mapping[str, str] | None) -> str:
    """A 405's Allow: the methods of every route of the document whose path holds the request's, and those
    of the route that refused it (`headers`' Allow). Starlette names the refusing route's only, the first
    that holds the path, so paths with a route per method (GET and PUT /v1/slos) or under a path parameter
    (/v1/recommendations/{id} before POST /v1/recommendations/run) said too few, or others."""
    methods = {m.strip() for m in (headers or {}).get("Allow", "").split(",") if m.strip()}
    for template, operations in request.app.openapi().get("paths", {}).items():
        if compile_path(template)[0].match(request.scope["path"]):
            methods |= {m.upper() for m in operations} & _HTTP_METHODS
    if "GET" in methods:  # answered as GET without the body (advisor.head_requests)
        methods.add("HEAD")
    return ", ".join(sorted(methods))


# Answers that can come from outside the route itself, by when they apply.
_FOR_BODIES = {
    "400": "the body cannot be read (not UTF-8, nested too deep)",
    "413": "the body is larger than FINETWIN_MAX_BODY_BYTES",
}
_FOR_V1 = {
    "401": "no API key, an unknown, revoked or expired one, or one made for another cluster's API",
    "403": "the key's role is not enough for this",
    "429": "too many failed key checks from this address; retry after Retry-After seconds",
}
_ALWAYS = {
    "422": "invalid request: the message says which field and why (a NUL character anywhere too)",
    "503": "the store does not answer (down, refusing connections, or busy): retry after Retry-After seconds",
}


def document_errors(app: FastAPI) -> Callable[[], dict[str, Any]]:
    """An `app.openapi` that documents every error answer with `ErrorOut`."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        document = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        schemas = document.setdefault("components", {}).setdefault("schemas", {})
        for model in (FieldError, ErrorOut):
            schemas[model.__name__] = model.model_json_schema(ref_template="#/components/schemas/{model}")
        for name in ("HTTPValidationError", "ValidationError"):
            schemas.pop(name, None)
        error = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorOut"}}}
        for path, operations in document.get("paths", {}).items():
            for method, operation in operations.items():
                responses = operation.setdefault("responses", {})
                wanted = dict(_ALWAYS)
                if method in _BODY_METHODS:
                    wanted |= _FOR_BODIES
                if path.startswith(V1_PREFIX):
                    wanted |= _FOR_V1
                for status, description in wanted.items():
                    responses.setdefault(status, {"description": description})
                for status, response in responses.items():
                    if status.startswith("4") or status == "503":
                        response["content"] = error
                        response.setdefault("description", "error")
        app.openapi_schema = document
        return document

    return openapi
