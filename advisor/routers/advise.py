"""`POST /v1/advise`: advice for one job configuration (see `advisor.advice`).

Answers are cached per model version (`advisor.answer_cache`, the one cache in front of the models; a
repeated request is answered from it by `advisor.fastpath` before it reaches this router). Answers not in
the cache are computed in batches (`advisor.batching`): concurrent requests share one call of the compiled
models, at most `advice_max_batch` configurations per call, and the same configuration asked twice at once
is computed once. Issue 14 removed the memo of predicted rows and its warm-up (a second cache, which the
compiled trees no longer need); bench/api.py measured what the fast path and the batching still save.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, HTTPException, Request, Response

from advisor.advice import advise_many
from advisor.advice_plan import AdviceError
from advisor.advice_predict import ModelsUnusable
from advisor.advice_schemas import AdviceOut, AdviceRequest
from advisor.answer_cache import MAX_RAW_KEY_BYTES, version_in_use
from advisor.auth import Role, access
from advisor.deps import get_runtime
from advisor.parts import ApiRuntime
from advisor.routers.models import NO_MODEL
from calibrate.registry import RegistryError

router = APIRouter(prefix="/v1/advise", tags=["advice"])


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
async def advise(
    body: AdviceRequest, request: Request, runtime: ApiRuntime = Depends(get_runtime)
) -> Response:
    # Async: a cached answer (the same configuration under the same models) never leaves the event loop;
    # loading models and computing answers run in the thread pool, in batches.
    models = runtime.models_in_use
    cache = runtime.answer_cache
    request_key = body.model_dump_json()
    raw = await request.body()  # already read by FastAPI: the exact bytes, for advisor.fastpath
    raw_key = raw if len(raw) <= MAX_RAW_KEY_BYTES else None
    version = version_in_use(models)
    if version is not None:
        cached = cache.get((version, request_key))
        if cached is not None:
            if raw_key is not None:
                cache.put((version, raw_key), cached)
            return Response(content=cached, media_type="application/json")
    assert runtime.batcher is not None  # set by create_app
    version, content = await runtime.batcher.submit(request_key, body)
    cache.put((version, request_key), content)
    if raw_key is not None:
        cache.put((version, raw_key), content)
    return Response(content=content, media_type="application/json")


def answers(runtime: ApiRuntime, bodies: list[AdviceRequest]) -> list[tuple[str, bytes] | HTTPException]:
    """(model version, answer JSON) per request, or the HTTP error for that request alone."""
    try:
        loaded = runtime.models_in_use.get()
    except RegistryError as exc:
        raise HTTPException(status_code=NO_MODEL, detail=f"the model in use cannot load: {exc}") from None
    if loaded is None:
        raise HTTPException(
            status_code=NO_MODEL, detail="no calibrated model is in use; run `finetwin calibrate` first"
        )
    version, job_models = loaded
    try:
        answers = advise_many([body.to_job() for body in bodies], job_models, version)
    except ModelsUnusable as exc:  # recalibrate: not the caller's fault, and not a crash either
        raise HTTPException(status_code=NO_MODEL, detail=f"{exc}; run `finetwin calibrate`") from None
    return [
        HTTPException(status_code=422, detail=str(answer))
        if isinstance(answer, AdviceError)
        else (version, answer.model_dump_json().encode("utf-8"))
        for answer in answers
    ]
