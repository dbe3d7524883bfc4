"""Calibration's settings (the model registry, refits, drift), read from `FINETWIN_*` variables."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from twin.settings import TwinSettings


class CalibrateSettings(TwinSettings):
    # Calibrated models.
    models_dir: Path | None = None
    # Trees as machine code (or walked from arrays); off keeps them on Treelite and scikit-learn. Read where
    # the trees run (`calibrate.native_trees.enabled`), declared here so that a value that is no yes/no is
    # refused at the start (a typo such as `of` left them on).
    native_trees: bool = True

    # Calibration online: refits, drift of the live error, and how much observed runs count.
    # Whether this API process refits at all (hourly, on drift, the first model of an empty registry): with
    # several APIs on one registry (one per cluster), one refits and the others use what it puts in use.
    refits: bool = True
    refit_interval_minutes: float = Field(default=60.0, gt=0)  # scheduled refit in the API process
    refit_benchmarks: list[Path] = Field(default_factory=list)  # empty = the in-use version's, else bundled
    refit_observed: bool = True  # scheduled and drift refits add the runs observed through telemetry
    # The rolling live error is over the last N finished jobs of the model in use
    drift_window: int = Field(default=50, ge=1)
    drift_min_jobs: int = Field(default=20, ge=1)  # fewer finished jobs than this say nothing about drift
    # Rolling throughput MdAPE (fraction) that triggers a refit
    drift_mdape_threshold: float = Field(default=0.25, gt=0)
    # Rolling share of wrongly predicted outcomes
    drift_failure_error_threshold: float = Field(default=0.15, gt=0, le=1)
    # The API re-reads the live error this often (ingest may be elsewhere)
    drift_check_seconds: float = Field(default=60.0, gt=0)
    # A drift triggers at most one refit per cooldown
    drift_cooldown_minutes: float = Field(default=30.0, ge=0)
    # A fresh observed run counts this many benchmark rows ...
    observed_weight: float = Field(default=5.0, ge=0)
    # ... and its extra weight halves every this many days
    observed_half_life_days: float = Field(default=30.0, gt=0)
    # Metric differences this small are noise, not "worse"
    promote_tolerance: float = Field(default=0.002, ge=0)
    # Online refits delete older versions (never one rollback can reach)
    models_keep_versions: int = Field(default=20, ge=1)

    @field_validator("models_dir")
    @classmethod
    def _a_directory(cls, value: Path | None) -> Path | None:
        """A file there was read as a registry without versions, and every refit of the API failed on it."""
        if value is not None and value.exists() and not value.is_dir():
            raise ValueError("a file, not a directory")
        return value

    def resolved_models_dir(self) -> Path:
        return self.models_dir if self.models_dir is not None else self.data_dir / "models"
