"""Error families: the configurations whose model errors move together.

A throughput model that is 20 % slow on one 70B LoRA job on A100s is slow on all of them: its error comes
from what it does not know about that model, method and GPU, not from the job. So the twin draws one shared
error per family and run (`twin.plan`), and calibration measures how much of the error is shared within a
family from held-out residuals (`calibrate`), both with this one definition of a family.
"""

from __future__ import annotations

from twin.domain import JobConfig, canonical_gpu_name


def error_family(model_name: str, method: str, gpu_model: str) -> str:
    return f"{model_name}|{str(method).lower()}|{canonical_gpu_name(gpu_model)}"


def family_of(config: JobConfig) -> str:
    return error_family(config.model_name, config.method, config.gpu_model)
