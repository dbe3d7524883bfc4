"""The one job configuration at the boundaries: pydantic models derived from `twin.domain.JobConfig`.

`JobConfig` declares the fields once, with their types, bounds and defaults; every model that reads or
writes a configuration derives from a base here instead of declaring the fields again:

- `JobConfigIn` (bounds and defaults): what finetwin accepts, in the telemetry payload
  (`ingest.events.JobSubmitted`, through `DescribedJobConfig`), the advice request and `/v1/predict`;
- `JobConfigOut` (the types, every field present): a configuration finetwin answers with. No input bounds:
  an answer may carry a configuration finetwin made (a repaired batch may round past a request's bound);
- `PartialJobConfig` (every field may be None): a job as the store knows it, before its `job.submitted`.

The msgspec fast path of ingest mirrors `DescribedJobConfig` (tests/ingest/test_fastparse.py checks that both
accept the same messages, and tests/twin/test_job_config.py that every model derives from here).
"""

from __future__ import annotations

import functools
import math
import types
from collections.abc import Mapping
from dataclasses import MISSING, fields
from operator import attrgetter
from typing import Annotated, Any, Literal, Self, Union, get_args, get_origin, get_type_hints

import annotated_types
from pydantic import BaseModel, ConfigDict, Field, create_model

from twin.domain import JobConfig
from twin.limits import StorableText

CONFIG_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(JobConfig) if f.name != "extra")
_HINTS = get_type_hints(JobConfig, include_extras=True)
_DEFAULTS = {f.name: f.default for f in fields(JobConfig) if f.default is not MISSING}
# What a configuration must state (number_nodes among them: only the boundary models default it), and the
# defaults of the others.
REQUIRED_FIELDS: tuple[str, ...] = tuple(name for name in CONFIG_FIELDS if name not in _DEFAULTS)
CONFIG_DEFAULTS: dict[str, Any] = {name: _DEFAULTS[name] for name in CONFIG_FIELDS if name in _DEFAULTS}


class _JobConfigModel(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    def to_config(self) -> JobConfig:
        return JobConfig(**{name: getattr(self, name) for name in CONFIG_FIELDS})

    @classmethod
    def of(cls, config: JobConfig) -> Self:
        """The model of a configuration finetwin holds (not validated again: it is one already)."""
        return cls.model_construct(**{name: getattr(config, name) for name in CONFIG_FIELDS})


def not_blank(value: str) -> str:
    """A field validator for the API's models: a model name is trimmed and must say something (telemetry
    records what a cluster reports, as it reports it)."""
    value = value.strip()
    if not value:
        raise ValueError("the model name is empty")
    return value


def method_in_any_case(value: Any) -> Any:
    """A field validator (before) for the API's models: a method in any case and spacing (`LoRA`, the way
    people write it), as a configurations CSV takes it; the method is then one of the three. Telemetry
    keeps the contract's spelling."""
    return value.strip().lower() if isinstance(value, str) else value


def _bare(hint: Any) -> Any:
    """The type without its bounds: `Annotated[int, Field(ge=1)]` -> `int`, and inside `X | None`."""
    if get_origin(hint) is Annotated:
        return get_args(hint)[0]
    if get_origin(hint) in (Union, types.UnionType):
        bare = tuple(_bare(arg) for arg in get_args(hint))
        return Union[bare]  # noqa: UP007 (a tuple of types, built at runtime)
    return hint


def _python_type(hint: Any) -> type:
    """The Python type a field's values have: `str` for a Literal of strings, `float` for `float | None`."""
    bare = _bare(hint)
    if get_origin(bare) is Literal:
        return type(get_args(bare)[0])
    if get_origin(bare) in (Union, types.UnionType):
        return next(_python_type(arg) for arg in get_args(bare) if arg is not type(None))
    return bare


def _fields(*, bounded: bool, optional: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in CONFIG_FIELDS:
        hint = _HINTS[name] if bounded else _bare(_HINTS[name])
        if optional:
            out[name] = (hint | None, None)
        elif name in _DEFAULTS:
            out[name] = (hint, _DEFAULTS[name])
        else:
            out[name] = hint  # required, or defaulted by its own Field (number_nodes)
    return out


# Built at import from JobConfig's declaration; subclassed like any pydantic model.
JobConfigIn: type[_JobConfigModel] = create_model(
    "JobConfigIn", __base__=_JobConfigModel, **_fields(bounded=True, optional=False)
)
JobConfigOut: type[_JobConfigModel] = create_model(
    "JobConfigOut", __base__=_JobConfigModel, **_fields(bounded=False, optional=False)
)
PartialJobConfig: type[BaseModel] = create_model(
    "PartialJobConfig", __base__=BaseModel, **_fields(bounded=False, optional=True)
)


class DescribedJobConfig(JobConfigIn):  # type: ignore[misc,valid-type]
    """A configuration with the benchmark's own descriptors of the run, so that an observed run is a full
    benchmark row (they feed the protocol features)."""

    experiment_id: StorableText | None = Field(default=None, max_length=2000)
    identifier: StorableText | None = Field(default=None, max_length=2000)
    fms_hf_tuning_version: StorableText | None = Field(default=None, max_length=50)
    torch_dtype: StorableText | None = Field(default=None, max_length=50)

    def to_config(self) -> JobConfig:
        extra = {name: value for name in DESCRIPTOR_FIELDS if (value := getattr(self, name))}
        return JobConfig(**{name: getattr(self, name) for name in CONFIG_FIELDS}, extra=extra)


# The largest value of each count (its `le` bound), for readers that check a whole column at once (CSV).
FIELD_MAXIMUMS: dict[str, float] = {
    name: bound.le
    for name, info in JobConfigIn.model_fields.items()
    for bound in info.metadata
    if isinstance(bound, annotated_types.Le)
}

# Each field's Python type, to read a configuration from loosely typed rows (pandas, CSV).
FIELD_TYPES: dict[str, type] = {name: _python_type(_HINTS[name]) for name in CONFIG_FIELDS}
DESCRIPTOR_FIELDS: tuple[str, ...] = tuple(
    name for name in DescribedJobConfig.model_fields if name not in CONFIG_FIELDS
)


_ALL_DESCRIPTORS = attrgetter(*DESCRIPTOR_FIELDS)


def descriptors_of(row: Any) -> dict[str, str]:
    """The benchmark's descriptors of a run (`DESCRIPTOR_FIELDS`: the protocol the models' features read) of
    a record that has them as attributes (a store's job record, a pandas row of `itertuples`), the missing
    and empty ones left out. Each distinct set is made once and shared, never changed: a forecast reads
    thousands of jobs of a few protocols."""
    try:
        values = _ALL_DESCRIPTORS(row)
    except AttributeError:  # a row without some of the columns
        values = tuple(getattr(row, name, None) for name in DESCRIPTOR_FIELDS)
    return _descriptors(values) if any(values) else {}


@functools.lru_cache(maxsize=4096)
def _descriptors(values: tuple[Any, ...]) -> dict[str, str]:
    return {name: str(value) for name, value in zip(DESCRIPTOR_FIELDS, values, strict=True) if _given(value)}


def _given(value: Any) -> bool:
    """Not None, NaN or the empty string (a cell of only spaces is kept, as the records hold it)."""
    return value is not None and not (isinstance(value, float) and math.isnan(value)) and str(value) != ""


def config_from_row(row: Mapping[str, Any]) -> JobConfig:
    """A JobConfig from one loader row, telemetry payload, API body or store record (a mapping or a pandas
    row, its cells of any numeric type); a field it leaves empty takes JobConfig's default, and the
    benchmark's descriptor columns go to `extra`."""
    values: dict[str, Any] = {}
    for name in CONFIG_FIELDS:
        value = row[name] if name in REQUIRED_FIELDS else row.get(name)
        if name in REQUIRED_FIELDS or _present(value):
            values[name] = FIELD_TYPES[name](value)
    extra = {key: str(row[key]) for key in DESCRIPTOR_FIELDS if key in row and _present(row[key])}
    return JobConfig(**values, extra=extra)


def _present(value: Any) -> bool:
    if value is None:
        return False
    if isinstance(value, float) and math.isnan(value):
        return False
    return not (isinstance(value, str) and not value.strip())
