"""One job configuration: every model that reads or writes one derives from `twin.domain.JobConfig`'s
declaration (twin.job_config), so they accept the same values with the same bounds and defaults."""

from __future__ import annotations

import math
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from advisor.advice_schemas import AdviceRequest, ConfigOut
from advisor.routers.jobs import JobOut
from advisor.routers.models import ConfigIn
from calibrate.config_frame import OPTIONAL_COLUMNS, REQUIRED_COLUMNS
from calibrate.loader import CONFIG_COLUMNS
from ingest.events import JobSubmitted
from twin.domain import JobConfig, broken_rule, nodes_dividing
from twin.job_config import (
    CONFIG_FIELDS,
    DESCRIPTOR_FIELDS,
    DescribedJobConfig,
    JobConfigIn,
    JobConfigOut,
    PartialJobConfig,
)
from twin.limits import STORE_INT_MAX

# The models that accept a configuration, with what each needs besides it.
INPUTS: list[tuple[type[BaseModel], dict[str, Any]]] = [
    (JobSubmitted, {}),
    (ConfigIn, {}),
    (AdviceRequest, {}),
]
JOB = {
    "model_name": "llama3-8b", "method": "lora", "gpu_model": "NVIDIA-A100-SXM4-80GB", "number_gpus": 4,
    "batch_size": 16, "tokens_per_sample": 2048,
}  # fmt: skip


def test_every_boundary_model_derives_from_the_one_declaration() -> None:
    for model in (JobSubmitted, ConfigIn, AdviceRequest):
        assert issubclass(model, JobConfigIn)
    assert issubclass(JobSubmitted, DescribedJobConfig) and issubclass(ConfigIn, DescribedJobConfig)
    assert issubclass(ConfigOut, JobConfigOut) and issubclass(JobOut, PartialJobConfig)
    for model in (JobSubmitted, ConfigIn, AdviceRequest):
        for name in CONFIG_FIELDS:  # the same field, bounds and default: inherited, not declared again
            assert repr(model.model_fields[name]) == repr(JobConfigIn.model_fields[name]), (model, name)
    for model in (ConfigOut, JobOut, JobSubmitted, ConfigIn, AdviceRequest):
        assert set(CONFIG_FIELDS) <= set(model.model_fields)
    assert tuple(f for f in JobConfig.__dataclass_fields__ if f != "extra") == CONFIG_FIELDS


def test_predict_csv_and_feature_columns_are_the_configuration_s() -> None:
    # A configs CSV: every field but the time cap (the benchmark's experiment_id carries it), plus the
    # benchmark's descriptors.
    assert set(CONFIG_COLUMNS) == (set(CONFIG_FIELDS) - {"time_limit_s"}) | set(DESCRIPTOR_FIELDS)
    assert set(REQUIRED_COLUMNS) | set(OPTIONAL_COLUMNS) == set(CONFIG_FIELDS) | set(DESCRIPTOR_FIELDS)


@pytest.mark.parametrize(("model", "more"), INPUTS, ids=lambda m: getattr(m, "__name__", ""))
def test_every_input_model_has_the_same_bounds(model: type[BaseModel], more: dict[str, Any]) -> None:
    largest = {"number_gpus": STORE_INT_MAX, "number_nodes": STORE_INT_MAX, "batch_size": STORE_INT_MAX,
               "tokens_per_sample": STORE_INT_MAX, "fast_moe": STORE_INT_MAX}  # fmt: skip
    model.model_validate({**JOB, **largest, **more})
    for field, wrong in [
        ("number_gpus", STORE_INT_MAX + 1), ("number_gpus", 0), ("number_gpus", "4"), ("number_gpus", 4.0),
        ("number_nodes", 0), ("batch_size", STORE_INT_MAX + 1), ("tokens_per_sample", STORE_INT_MAX + 1),
        ("fast_moe", -1), ("method", "qlora"), ("model_name", ""), ("model_name", "x" * 201),
        ("model_name", "llama\x00"), ("gpu_model", "x" * 101), ("time_limit_s", 0.0),
        ("time_limit_s", math.inf), ("time_limit_s", 2e9), ("time_limit_s", "600"), ("enable_roce", 1),
        ("fast_kernels", "true"),
    ]:  # fmt: skip
        with pytest.raises(ValidationError, match=field):
            model.model_validate({**JOB, **more, field: wrong})


@pytest.mark.parametrize(("model", "more"), INPUTS, ids=lambda m: getattr(m, "__name__", ""))
def test_the_nodes_default_to_the_fewest_that_the_gpus_divide(model: type[BaseModel], more: dict) -> None:
    """Of at most 8 GPUs each, so that the default keeps the admission rule on nodes: 9 GPUs on 2 nodes (the
    fewest of 8 that hold them) was rejected for a node count the job never gave."""

    def config(gpus: int) -> BaseModel:
        return model.model_validate({**JOB, **more, "number_gpus": gpus, "batch_size": 48 * gpus})

    counts = (1, 8, 9, 12, 16, 17, 20, 24)
    assert [config(g).number_nodes for g in counts] == [1, 1, 3, 2, 2, 17, 4, 3]
    for gpus in counts:
        job: Any = config(gpus)
        assert broken_rule(job.number_gpus, job.batch_size, 0, job.number_nodes) is None, gpus
    assert model.model_validate({**JOB, **more, "number_nodes": 3}).number_nodes == 3


def test_an_answer_carries_a_configuration_beyond_a_request_s_bounds() -> None:
    """What finetwin made (a batch rounded up past the bound) is answered, not refused."""
    config = JobConfig("llama3-8b", "lora", "L40S", 3, 1, STORE_INT_MAX + 1, 2048)
    assert ConfigOut.of(config).model_dump()["batch_size"] == STORE_INT_MAX + 1


def test_a_request_becomes_the_same_job_config_whichever_model_read_it() -> None:
    body = {**JOB, "experiment_id": "SFTTrainer.x-stop_after_seconds.600", "torch_dtype": "bfloat16"}
    from_telemetry = JobSubmitted.model_validate(body).to_config()
    from_api = ConfigIn.model_validate(body).to_config()
    from_advice = AdviceRequest.model_validate(JOB).to_config()
    assert (
        from_telemetry
        == from_api
        == from_advice
        == JobConfig("llama3-8b", "lora", "NVIDIA-A100-SXM4-80GB", 4, 1, 16, 2048)
    )
    assert (
        from_telemetry.extra
        == from_api.extra
        == {"experiment_id": "SFTTrainer.x-stop_after_seconds.600", "torch_dtype": "bfloat16"}
    )


def test_repairing_the_nodes_of_a_huge_prime_gpu_count_is_quick_and_right() -> None:
    """Counts reach the store's bound, so the search for nodes that divide them is O(sqrt(n)); checked
    against the obvious search where it is cheap, and on 2^31 - 1 (a prime) where it is not."""
    for gpus in range(1, 200):
        for wanted in (1, 2, 5, gpus):
            brute = [n for n in range(1, gpus + 1) if gpus % n == 0 and gpus // n <= 8]
            assert nodes_dividing(gpus, wanted) == min(brute, key=lambda n: (abs(n - wanted), n))
    assert nodes_dividing(STORE_INT_MAX, 1) == STORE_INT_MAX  # one GPU per node: the only way
