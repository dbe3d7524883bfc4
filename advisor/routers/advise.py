"""`POST /v1/advise`: advice for one job configuration (see `advisor.advice`).

An answer costs one call of the compiled models (~100 configurations); the same configuration asked again
under the same model version is answered from `advisor.answer_cache`, the one cache left in front of the
models (issue 14 measured and removed the fast path, the batching, the prediction memo and its warm-up:
with compiled trees they no longer paid for themselves, see bench/api.py).
"""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request, Response
from starlette.concurrency import run_in_threadpool

from advisor.advice import advise_job
from advisor.advice_plan import AdviceError
from advisor.advice_predict import ModelsUnusable
from advisor.advice_schemas import AdviceOut, AdviceRequest
from advisor.answer_cache import AnswerCache, version_in_use
from advisor.auth import Role, access
from advisor.routers.models import NO_MODEL, models_in_use
from calibrate.registry import InUseModels, RegistryError

router = APIRouter(prefix="/v1/advise", tags=["advice"])


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
    # Async: a cached answer never leaves the event loop; loading models and computing an answer run in
    # the thread pool.
    models = models_in_use(request)
    cache = answer_cache(request)
    request_key = body.model_dump_json()
    version = version_in_use(models)
    if version is not None:
        cached = cache.get((version, request_key))
        if cached is not None:
            return Response(content=cached, media_type="application/json")
    version, content = await run_in_threadpool(_answer, models, body)
    cache.put((version, request_key), content)
    return Response(content=content, media_type="application/json")


def _answer(models: InUseModels, body: AdviceRequest) -> tuple[str, bytes]:
    """(model version, answer JSON), or the HTTP error."""
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
        answer = advise_job(config, dataset_tokens, job_models, version)
    except ModelsUnusable as exc:  # recalibrate: not the caller's fault, and not a crash either
        raise HTTPException(status_code=NO_MODEL, detail=f"{exc}; run `finetwin calibrate`") from None
    except AdviceError as exc:
        raise HTTPException(status_code=422, detail=str(exc)) from None
    return version, answer.model_dump_json().encode("utf-8")
