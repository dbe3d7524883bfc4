"""The jobs a simulation runs, as columns (the simulator handles hundreds of thousands of them).

A job either has a fixed `duration_s` (used as given: queueing studies, traces) or a benchmark
configuration plus its work in dataset tokens, from which the models give run time, failure and power.
Configurations live once in a catalog that jobs point into, so the models are asked once per distinct
configuration, not once per job.

Sources: an explicit JOBS.csv (`read_jobs_csv`), the store's queued and running jobs (`twin.live_state`), and
future arrivals drawn from the observed arrival process (`twin.arrivals`).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from twin.csv_cells import MAX_CSV_COLUMNS, neutralise_row, too_many_columns
from twin.csv_hints import resembling, separator_hint
from twin.domain import METHODS, JobConfig, UnknownGpuModel, fewest_nodes, known_gpu_name
from twin.job_config import DESCRIPTOR_FIELDS
from twin.limits import MAX_SIMULATED_SECONDS
from twin.text_files import SPREADSHEET_UTF8, not_utf8

NO_CONFIG = -1


def catalog_key(config: JobConfig) -> tuple[JobConfig, tuple[tuple[str, str], ...]]:
    """What makes two configurations the same for the models: the fields and the protocol in `extra`
    (experiment id, identifier, ...), which JobConfig's own equality leaves out."""
    return config, tuple(sorted(config.extra.items()))


REQUIRED_COLUMNS = ("job_id", "arrival_s", "gpus")
# The job's GPU count under the benchmark's name for it: a header may have it for `gpus`, or both (equal).
GPUS_SYNONYM = "number_gpus"
# A row without duration_s needs these to be simulated through the models.
CONFIG_REQUIRED = ("model_name", "method", "gpu_model", "batch_size", "tokens_per_sample", "dataset_tokens")
OPTIONAL_COLUMNS = (
    "duration_s",
    "gpu_model",
    "model_name",
    "method",
    "batch_size",
    "tokens_per_sample",
    "number_nodes",
    "enable_roce",
    "fast_moe",
    "fast_kernels",
    "time_limit_s",
    "dataset_tokens",
    # The benchmark's descriptors of the run, which the models' protocol features read.
    *DESCRIPTOR_FIELDS,
)


class WorkloadFormatError(ValueError):
    """A workload file that cannot be read; names the file, the line and the column."""

    def __init__(self, path: str | Path, line: int | None, column: str | None, message: str) -> None:
        self.path, self.line, self.column, self.message = str(path), line, column, message
        where = self.path + (f", line {line}" if line is not None else "")
        super().__init__(f"{where}: {f'column {column!r}: ' if column else ''}{message}")


@dataclass(frozen=True, slots=True)
class RunningState:
    """A job already running when the simulation starts (from live telemetry)."""

    elapsed_s: float
    tokens_done: float | None = None
    tokens_per_second: float | None = None  # last observed; better than a prediction for the rest of the run
    power_w: float | None = None  # per GPU, last observed: likewise, for the rest of its run (if > 0)
    node_ids: tuple[str, ...] = ()  # where it runs, as telemetry said: it stays there


@dataclass
class Workload:
    job_ids: list[str]
    arrival_s: np.ndarray  # float64 seconds from the simulation's start; negative = submitted before it
    gpus: np.ndarray  # int64
    gpu_models: list[str]  # "" = unspecified (allowed when the cluster has one GPU type)
    duration_s: np.ndarray  # float64; NaN = from the models
    work_tokens: np.ndarray  # float64 dataset tokens; NaN = unknown
    config_idx: np.ndarray  # int64 index into `catalog`, NO_CONFIG for duration-only jobs
    catalog: list[JobConfig] = field(default_factory=list)
    running: dict[int, RunningState] = field(default_factory=dict)  # by row

    def __len__(self) -> int:
        return len(self.job_ids)

    @classmethod
    def empty(cls, catalog: list[JobConfig] | None = None) -> Workload:
        z = np.zeros(0)
        return cls([], z, np.zeros(0, np.int64), [], z, z, np.zeros(0, np.int64), list(catalog or []))

    @classmethod
    def from_durations(
        cls,
        arrival_s: Sequence[float] | np.ndarray,
        duration_s: Sequence[float] | np.ndarray,
        gpus: Sequence[int] | np.ndarray | int = 1,
        gpu_model: str = "",
        prefix: str = "job",
    ) -> Workload:
        """Duration-only jobs (queueing studies, traces): ids `prefix-0`, `prefix-1`, ..."""
        arrivals = np.asarray(arrival_s, dtype=np.float64)
        n = len(arrivals)
        gpu_counts = np.broadcast_to(np.asarray(gpus, dtype=np.int64), (n,)).copy()
        return cls(
            job_ids=[f"{prefix}-{i}" for i in range(n)],
            arrival_s=arrivals,
            gpus=gpu_counts,
            gpu_models=[gpu_model] * n,
            duration_s=np.asarray(duration_s, dtype=np.float64).copy(),
            work_tokens=np.full(n, np.nan),
            config_idx=np.full(n, NO_CONFIG, dtype=np.int64),
        )

    def config_of(self, row: int) -> JobConfig | None:
        k = int(self.config_idx[row])
        return None if k == NO_CONFIG else self.catalog[k]

    def without(self, job_ids: Collection[str]) -> Workload:
        """The same workload less the jobs `job_ids` names (a what-if that cancels them); the catalogue is
        kept whole, so configuration indices stay valid, and running rows are renumbered."""
        keep = np.asarray([job_id not in job_ids for job_id in self.job_ids], dtype=bool)
        rows = np.flatnonzero(keep)
        new_row = {int(old): new for new, old in enumerate(rows)}
        return Workload(
            job_ids=[self.job_ids[i] for i in rows],
            arrival_s=self.arrival_s[keep],
            gpus=self.gpus[keep],
            gpu_models=[self.gpu_models[i] for i in rows],
            duration_s=self.duration_s[keep],
            work_tokens=self.work_tokens[keep],
            config_idx=self.config_idx[keep],
            catalog=list(self.catalog),
            running={new_row[row]: state for row, state in self.running.items() if row in new_row},
        )


def concat(parts: Sequence[Workload]) -> Workload:
    """One workload from several; catalogs are appended (empty parts' too, so the combined catalog does not
    depend on which parts happen to have jobs) and indices shifted, running rows renumbered."""
    if not parts:
        return Workload.empty()
    catalog: list[JobConfig] = []
    config_idx: list[np.ndarray] = []
    running: dict[int, RunningState] = {}
    row_offset = 0
    for part in parts:
        shift = len(catalog)
        catalog.extend(part.catalog)
        config_idx.append(np.where(part.config_idx == NO_CONFIG, NO_CONFIG, part.config_idx + shift))
        running.update({row + row_offset: state for row, state in part.running.items()})
        row_offset += len(part)
    return Workload(
        job_ids=[j for p in parts for j in p.job_ids],
        arrival_s=np.concatenate([p.arrival_s for p in parts]),
        gpus=np.concatenate([p.gpus for p in parts]).astype(np.int64),
        gpu_models=[g for p in parts for g in p.gpu_models],
        duration_s=np.concatenate([p.duration_s for p in parts]),
        work_tokens=np.concatenate([p.work_tokens for p in parts]),
        config_idx=np.concatenate(config_idx).astype(np.int64),
        catalog=catalog,
        running=running,
    )


def read_jobs_csv(path: str | Path) -> Workload:
    """JOBS.csv: `job_id, arrival_s, gpus` and per row either `duration_s` or a benchmark configuration
    (`model_name, method, gpu_model, batch_size, tokens_per_sample, dataset_tokens`, optionally
    `number_nodes, enable_roce, fast_moe, fast_kernels, time_limit_s` and the benchmark's descriptors of the
    run, `experiment_id, identifier, fms_hf_tuning_version, torch_dtype`). `gpus` is the configuration's
    `number_gpus`, and a `number_gpus` column may stand for it or stand beside it (a row whose two differ
    is refused). Raises WorkloadFormatError naming the line and column of the first problem."""
    path = Path(path)
    try:
        handle = path.open(newline="", encoding="utf-8-sig")  # -sig: without a spreadsheet's byte-order mark
    except OSError as exc:
        raise WorkloadFormatError(path, None, None, f"cannot open: {exc.strerror or exc}") from exc
    with handle:
        reader = csv.reader(handle)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            raise WorkloadFormatError(path, 1, None, "empty file, expected a header row") from None
        except UnicodeDecodeError:
            raise _not_utf8(path) from None
        except csv.Error as exc:
            raise WorkloadFormatError(path, 1, None, f"not a CSV header: {exc}") from None
        _check_header(path, header)
        builder = _Builder(path, {name: i for i, name in enumerate(header)})
        try:
            for row in reader:
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue
                if len(row) != len(header):
                    raise WorkloadFormatError(
                        path, reader.line_num, None, f"has {len(row)} fields, the header has {len(header)}"
                    )
                builder.add(row, reader.line_num)
        except UnicodeDecodeError:
            raise _not_utf8(path) from None
        except csv.Error as exc:
            raise WorkloadFormatError(path, reader.line_num, None, f"unreadable row: {exc}") from None
    if not builder.job_ids:
        raise WorkloadFormatError(path, None, None, "no jobs in the file")
    return builder.build()


def _check_header(path: Path, header: list[str]) -> None:
    """Raises WorkloadFormatError for a header the rows cannot be read by: too many columns, another
    separator, a required column missing (with the name it resembles, for a misspelling)."""
    if len(header) > MAX_CSV_COLUMNS:
        raise WorkloadFormatError(path, 1, None, too_many_columns(len(header)))
    other_separator = separator_hint(header)
    if other_separator:
        raise WorkloadFormatError(path, 1, None, other_separator)
    for column in REQUIRED_COLUMNS:
        if column not in header and not (column == "gpus" and GPUS_SYNONYM in header):
            missing = "missing from the header"
            raise WorkloadFormatError(path, 1, column, missing + _header_hint(column, header))
    if "duration_s" not in header:
        for column in CONFIG_REQUIRED:
            if column not in header:
                needed = "missing (needed when there is no duration_s)"
                raise WorkloadFormatError(path, 1, column, needed + _header_hint(column, header))


MAX_INTEGER = 10_000_000  # the largest whole number a cell may hold (GPUs, nodes, batch, tokens per sample)
_TRUE = {"1", "1.0", "true", "yes", "y", "t"}
_FALSE = {"", "0", "0.0", "false", "no", "n", "f", "none", "nan"}


def _not_utf8(path: Path) -> WorkloadFormatError:
    """The error for a file that is not UTF-8, at the line of its first such byte (read again for it: the
    decoder reads ahead by blocks, and its line is where it had got to). A file, not a pipe, is read again."""
    problem = not_utf8(path.read_bytes()) if path.is_file() else None
    line, message = problem if problem is not None else (None, "is not UTF-8 text")
    return WorkloadFormatError(path, line, None, message + SPREADSHEET_UTF8)


def _header_hint(column: str, header: list[str]) -> str:
    """Where the header has a name resembling `column` (not one it reads as it is): a misspelling."""
    return resembling(column, header, (*REQUIRED_COLUMNS, GPUS_SYNONYM, *CONFIG_REQUIRED))


class _Builder:
    def __init__(self, path: Path, columns: dict[str, int]) -> None:
        self.path, self.columns = path, columns
        self.job_ids: list[str] = []
        self.arrival: list[float] = []
        self.gpus: list[int] = []
        self.gpu_models: list[str] = []
        self.duration: list[float] = []
        self.work: list[float] = []
        self.config_idx: list[int] = []
        self.catalog: dict[object, int] = {}
        self.configs: list[JobConfig] = []
        self.seen: set[str] = set()

    def cell(self, row: list[str], name: str) -> str:
        i = self.columns.get(name)
        return "" if i is None else row[i].strip()

    def number(self, row: list[str], name: str, line: int, *, positive: bool = False) -> float:
        text = self.cell(row, name)
        try:
            value = float(text)
        except ValueError:
            raise WorkloadFormatError(self.path, line, name, f"not a number: {text!r}") from None
        if not math.isfinite(value) or (positive and value <= 0):
            raise WorkloadFormatError(
                self.path, line, name, f"must be a {'positive' if positive else 'finite'} number: {text!r}"
            )
        return value

    def seconds(self, row: list[str], name: str, line: int) -> float:
        """A time in seconds, within the span the twin simulates (either way: an arrival may be past)."""
        value = self.number(row, name, line)
        if abs(value) > MAX_SIMULATED_SECONDS:
            raise WorkloadFormatError(
                self.path, line, name, f"must be within {MAX_SIMULATED_SECONDS:,.0f} s (ten years): {value!r}"
            )
        return value

    def integer(
        self, row: list[str], name: str, line: int, *, minimum: int = 1, default: int | None = None
    ) -> int:
        if default is not None and not self.cell(row, name):
            return default
        value = self.number(row, name, line)
        if value != int(value) or value < minimum:
            raise WorkloadFormatError(self.path, line, name, f"must be an integer ≥ {minimum}: {value!r}")
        if value > MAX_INTEGER:  # `1e308` is a whole number, but no count of GPUs, nodes or tokens
            raise WorkloadFormatError(self.path, line, name, f"must be at most {MAX_INTEGER:,}: {value!r}")
        return int(value)

    def flag(self, row: list[str], name: str, line: int) -> bool:
        text = self.cell(row, name).lower()
        if text in _TRUE or text.startswith("['true"):  # the benchmark writes fast_kernels as a list
            return True
        if text in _FALSE:
            return False
        raise WorkloadFormatError(self.path, line, name, f"not a yes/no value: {text!r}")

    def gpu_count(self, row: list[str], line: int) -> int:
        """The row's GPUs, from `gpus` or `number_gpus`: one count, so where both are given they must agree
        (else the job held one number of GPUs and was simulated at the throughput of the other)."""
        named = [name for name in ("gpus", GPUS_SYNONYM) if name in self.columns]
        given = [name for name in named if self.cell(row, name)] or named[:1]
        counts = {name: self.integer(row, name, line) for name in given}
        if len(set(counts.values())) > 1:
            raise WorkloadFormatError(
                self.path,
                line,
                GPUS_SYNONYM,
                f"{counts[GPUS_SYNONYM]} disagrees with column 'gpus' ({counts['gpus']}): both are the job's "
                "GPU count; give the same number in both, or leave one column out",
            )
        return next(iter(counts.values()))

    def gpu_model(self, row: list[str], line: int) -> str:
        """The benchmark's spelling of the row's GPU ("" when unnamed); a misspelled one is an error with
        the closest known names, as in a cluster file (else its jobs would all be rejected, silently)."""
        name = self.cell(row, "gpu_model")
        if not name:
            return ""
        try:
            return known_gpu_name(name)
        except UnknownGpuModel as exc:
            raise WorkloadFormatError(self.path, line, "gpu_model", str(exc)) from None

    def method(self, row: list[str], line: int) -> str:
        """The row's fine-tuning method in any case (`LoRA`), as a configurations CSV takes it; another is an
        error on its line (the models refused it later as "row 0" of the distinct configurations)."""
        text = self.cell(row, "method").lower()
        if text not in METHODS:
            raise WorkloadFormatError(
                self.path, line, "method", f"{text!r} is not a method; one of {', '.join(METHODS)}"
            )
        return text

    def add(self, row: list[str], line: int) -> None:
        job_id = self.cell(row, "job_id")
        if not job_id:
            raise WorkloadFormatError(self.path, line, "job_id", "empty")
        if job_id in self.seen:
            raise WorkloadFormatError(self.path, line, "job_id", f"duplicate job id {job_id!r}")
        self.seen.add(job_id)
        arrival = self.seconds(row, "arrival_s", line)
        gpus = self.gpu_count(row, line)
        gpu_model = self.gpu_model(row, line)
        duration = math.nan
        work = math.nan
        config = NO_CONFIG
        if self.cell(row, "duration_s"):
            duration = self.seconds(row, "duration_s", line)
            if duration < 0:
                raise WorkloadFormatError(self.path, line, "duration_s", f"must be ≥ 0: {duration!r}")
        else:
            for name in CONFIG_REQUIRED:
                if not self.cell(row, name):
                    raise WorkloadFormatError(
                        self.path, line, name, "empty (needed when duration_s is empty)"
                    )
            work = self.number(row, "dataset_tokens", line, positive=True)
            time_limit = self.cell(row, "time_limit_s")
            cfg = JobConfig(
                model_name=self.cell(row, "model_name"),
                method=self.method(row, line),
                gpu_model=gpu_model,
                number_gpus=gpus,
                # As advise and the API read a configuration that does not say (9 GPUs: 3 nodes of 3).
                number_nodes=self.integer(
                    row, "number_nodes", line, default=fewest_nodes({"number_gpus": gpus})
                ),
                batch_size=self.integer(row, "batch_size", line),
                tokens_per_sample=self.integer(row, "tokens_per_sample", line),
                enable_roce=self.flag(row, "enable_roce", line),
                fast_moe=self.integer(row, "fast_moe", line, minimum=0, default=0),
                fast_kernels=self.flag(row, "fast_kernels", line),
                time_limit_s=self.number(row, "time_limit_s", line, positive=True) if time_limit else None,
                extra={name: text for name in DESCRIPTOR_FIELDS if (text := self.cell(row, name))},
            )
            config = self.catalog.setdefault(catalog_key(cfg), len(self.catalog))
            if config == len(self.configs):
                self.configs.append(cfg)
        self.job_ids.append(job_id)
        self.arrival.append(arrival)
        self.gpus.append(gpus)
        self.gpu_models.append(gpu_model)
        self.duration.append(duration)
        self.work.append(work)
        self.config_idx.append(config)

    def build(self) -> Workload:
        return Workload(
            job_ids=self.job_ids,
            arrival_s=np.asarray(self.arrival, dtype=np.float64),
            gpus=np.asarray(self.gpus, dtype=np.int64),
            gpu_models=self.gpu_models,
            duration_s=np.asarray(self.duration, dtype=np.float64),
            work_tokens=np.asarray(self.work, dtype=np.float64),
            config_idx=np.asarray(self.config_idx, dtype=np.int64),
            catalog=self.configs,
        )


def write_jobs_csv(workload: Workload, path: str | Path) -> None:
    """The inverse of `read_jobs_csv` (duration-only and configured rows alike); a text cell a spreadsheet
    would run as a formula (a job id or model name from telemetry) is written with a leading `'`."""
    columns = list(REQUIRED_COLUMNS) + list(OPTIONAL_COLUMNS)
    with Path(path).open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        for i, job_id in enumerate(workload.job_ids):
            cfg = workload.config_of(i)
            duration = float(workload.duration_s[i])
            row: dict[str, object] = {
                "job_id": job_id,
                "arrival_s": repr(float(workload.arrival_s[i])),
                "gpus": int(workload.gpus[i]),
                "duration_s": "" if math.isnan(duration) else repr(duration),
                "gpu_model": workload.gpu_models[i],
            }
            if cfg is not None:
                row |= {
                    "model_name": cfg.model_name,
                    "method": cfg.method,
                    "gpu_model": cfg.gpu_model,
                    "batch_size": cfg.batch_size,
                    "tokens_per_sample": cfg.tokens_per_sample,
                    "number_nodes": cfg.number_nodes,
                    "enable_roce": int(cfg.enable_roce),
                    "fast_moe": cfg.fast_moe,
                    "fast_kernels": int(cfg.fast_kernels),
                    "time_limit_s": "" if cfg.time_limit_s is None else cfg.time_limit_s,
                    "dataset_tokens": repr(float(workload.work_tokens[i])),
                    **cfg.extra,
                }
            writer.writerow(neutralise_row(row.get(c, "") for c in columns))
