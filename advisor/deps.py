"""What the routers depend on: the runtime `create_app` built once from the API's parts, and its pieces.

The app holds exactly one thing in its state, the `ApiRuntime`, set when the app is created; every router
reaches it through these dependencies."""

from __future__ import annotations

from collections.abc import Iterator

from fastapi import Request
from sqlalchemy import Engine
from sqlmodel import Session

from advisor.parts import ApiRuntime, ModelsInUse
from advisor.settings import AdvisorSettings


def get_runtime(request: Request) -> ApiRuntime:
    return request.app.state.runtime


def get_settings(request: Request) -> AdvisorSettings:
    return get_runtime(request).settings


def get_engine(request: Request) -> Engine:
    return get_runtime(request).engine


def get_models_in_use(request: Request) -> ModelsInUse:
    return get_runtime(request).models_in_use


def get_session(request: Request) -> Iterator[Session]:
    with Session(get_runtime(request).engine, expire_on_commit=False) as session:
        yield session
