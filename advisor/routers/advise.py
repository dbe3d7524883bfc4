"""`POST /v1/advise`: advice for one job configuration (see `advisor.advice`).

Answers are cached per model version: the same configuration asked again under the same models gets
the same bytes back without evaluating the models (the cache forgets everything when the version in use
changes, and holds at most `advice_cache_size` answers).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from fastapi import APIRouter, HTTPException, Request, Response
from fastapi.concurrency import run_in_threadpool

from advisor.advice import AdviceError, ModelsUnusable, advise_job
from advisor.advice_io import AdviceOut, AdviceRequest
from advisor.auth import Role, access
from advisor.routers.models import NO_MODEL, models_in_use
from calibrate.registry import InUseModels, RegistryError

router = APIRouter(prefix="/v1/advise", tags=["advice"])


class AnswerCache:
    """A small LRU of serialized answers keyed by (model version, canonical request)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: OrderedDict[tuple[str, str], bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str]) -> bytes | None:
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
            return found

    def put(self, key: tuple[str, str], value: bytes) -> None:
        if self.size <= 0:
            return
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)


def answer_cache(request: Request) -> AnswerCache:
    cache = getattr(request.app.state, "advice_cache", None)
    if cache is None:
        cache = AnswerCache(request.app.state.settings.advice_cache_size)
        request.app.state.advice_cache = cache
    return cache


@router.post(
    "",
    response_model=AdviceOut,
    summary="Will it run, repair, fewest GPUs, best throughput and cost, placement, optimizations",
    responses={
        409: {"description": "no calibrated model is in use yet"},
        422: {"description": "the configuration is not valid input (the message says which field)"},
    },
    openapi_extra=access(Role.VIEWER),  # computes only, changes nothing
)
async def advise(body: AdviceRequest, request: Request) -> Response:
    # Async: a cached answer (the same configuration under the same models) never leaves the event loop;
    # loading models and computing an answer run in the thread pool.
    models = models_in_use(request)
    cache = answer_cache(request)
    pointer = _pointer(models)
    request_key = body.model_dump_json()
    if pointer is not None:
        cached = cache.get((pointer, request_key))
        if cached is not None:
            return Response(content=cached, media_type="application/json")
    version, content = await run_in_threadpool(_answer, models, body)
    cache.put((version, request_key), content)
    return Response(content=content, media_type="application/json")


def _pointer(models: InUseModels) -> str | None:
    """The version in use as the registry's pointer says (a small file read), without loading it."""
    registry = getattr(models, "registry", None)
    try:
        pointer = registry.pointer() if registry is not None else None
    except (RegistryError, OSError, ValueError):
        return None
    return None if pointer is None else str(pointer.get("version"))


def _answer(models: InUseModels, body: AdviceRequest) -> tuple[str, bytes]:
    try:
        loaded = models.get()
    except RegistryError as exc:
        raise HTTPException(status_code=NO_MODEL, detail=f"the model in use cannot load: {exc}") from None
    if loaded is None:
        raise HTTPException(
            status_code=NO_MODEL, detail="no calibrated model is in use; run `finetwin calibrate` first"
        )
    version, job_models = loaded
    config, dataset_tokens = body.to_job()
    try:
        answer = advise_job(config, dataset_tokens, job_models, model_version=version)
    except AdviceError as exc:
        raise HTTPException(status_code=422, detail=str(exc)) from None
    except ModelsUnusable as exc:  # recalibrate: not the caller's fault, and not a crash either
        raise HTTPException(status_code=NO_MODEL, detail=f"{exc}; run `finetwin calibrate`") from None
    return version, answer.model_dump_json().encode("utf-8")
