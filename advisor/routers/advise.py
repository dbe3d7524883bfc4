"""`POST /v1/advise`: advice for one job configuration (see `advisor.advice`).

Answers are cached per model version: the same configuration asked again under the same models gets
the same bytes back without evaluating the models (the cache forgets everything when the version in use
changes, and holds at most `advice_cache_size` answers).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from fastapi import APIRouter, Depends, HTTPException, Request, Response

from advisor.advice import AdviceError, advise_job
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
def advise(
    body: AdviceRequest,
    models: InUseModels = Depends(models_in_use),
    cache: AnswerCache = Depends(answer_cache),
) -> Response:
    try:
        loaded = models.get()
    except RegistryError as exc:
        raise HTTPException(status_code=NO_MODEL, detail=f"the model in use cannot load: {exc}") from None
    if loaded is None:
        raise HTTPException(
            status_code=NO_MODEL, detail="no calibrated model is in use; run `finetwin calibrate` first"
        )
    version, job_models = loaded
    key = (version, body.model_dump_json())
    cached = cache.get(key)
    if cached is None:
        config, dataset_tokens = body.to_job()
        try:
            answer = advise_job(config, dataset_tokens, job_models, model_version=version)
        except AdviceError as exc:
            raise HTTPException(status_code=422, detail=str(exc)) from None
        cached = answer.model_dump_json().encode("utf-8")
        cache.put(key, cached)
    return Response(content=cached, media_type="application/json")
