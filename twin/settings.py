"""The twin's settings (the store, the cluster, forecasts), read from `FINETWIN_*` environment variables.

Each package has its own settings class on top of this one (`ingest.settings`, `calibrate.settings`,
`advisor.settings`); `finetwin.settings.Settings` composes them. Built once by the CLI and passed down;
nothing else reads a setting from the environment, with one exception: `calibrate.native_trees` reads `CC`,
`FINETWIN_CACHE_DIR` and `FINETWIN_NATIVE_TREES` from `os.environ` itself, because the native-tree compiler
runs inside the models, in processes that have no Settings object (an ensemble's workers, a refit's
process). Every variable and its default: docs/settings.md (checked by tests/test_settings_docs.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from twin.limits import MAX_ENSEMBLE_RUNS, MAX_SEED, MAX_SIMULATED_SECONDS, StoredId


def default_data_dir() -> Path:
    """The user's data directory for finetwin (platformdirs); FINETWIN_DATA_DIR overrides it."""
    from platformdirs import user_data_path

    return user_data_path("finetwin", appauthor=False)


# The stores finetwin runs on, as SQLAlchemy names them (`postgresql://` and `postgres://` mean psycopg 3).
STORE_DRIVERS = ("sqlite", "sqlite+pysqlite", "postgresql+psycopg")


class TwinSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FINETWIN_", extra="ignore")

    # Where state lives: one directory per user by platform convention (~/.local/share/finetwin on Linux),
    # so every command finds the same store wherever it is run from. Unset database URL = a SQLite file in it.
    data_dir: Path = Field(default_factory=lambda: default_data_dir())
    database_url: str | None = None

    # The cluster's id, as its telemetry's `cluster_id` states it, and bounded as there (1-200 characters the
    # store can hold): the store's columns of it hold 200 characters.
    cluster_id: StoredId = "default"

    # Twin: forecasts from the live state, and the standing forecast the API refreshes and stores.
    # The standing forecast is made every this much telemetry time (`5m`, `1h` or seconds; a replay at
    # --speed 600 runs it 600 times faster than the wall clock) ...
    forecast_every: float = 300.0
    # ... but at most once per this many wall seconds (an ensemble costs seconds of CPU).
    forecast_min_wall_seconds: float = Field(default=10.0, ge=0)
    # The twin's clock leaves the wall clock for the telemetry's when the two disagree by more than this.
    forecast_clock_tolerance_seconds: float = Field(default=300.0, ge=0)
    forecast_horizon_hours: float = Field(default=24.0, gt=0, le=MAX_SIMULATED_SECONDS / 3600)
    forecast_interval_minutes: float = Field(default=60.0, gt=0)  # width of one step of the forecast's series
    forecast_runs: int = Field(default=32, ge=1, le=MAX_ENSEMBLE_RUNS)  # seeded runs per ensemble
    forecast_seed: int = Field(default=0, ge=0, le=MAX_SEED)
    # Arrivals and the job mix are learned from this much history.
    forecast_lookback_days: float = Field(default=7.0, gt=0, le=MAX_SIMULATED_SECONDS / 86400)
    # The record the store keeps (twin.retention): what is older than this many days of telemetry time is
    # pruned (the events of the jobs that ended by then, the nodes' reports, the forecasts' scores); 0 keeps
    # everything. More than the lookback, which forecasts, their bands and backtests read: unset, 30 days or
    # the lookback and a week more, whichever is longer.
    keep_telemetry_days: float = Field(default=30.0, ge=0, le=36_500)
    # Live forecasts' bands recalibrated on how the stored forecasts of the last lookback did
    # (twin.band_calibration: split conformal on the skill record); false = the ensemble's bands as they are.
    forecast_band_calibration: bool = True
    # The cluster's scheduling policy (twin.policies).
    forecast_policy: Literal["fifo", "backfill", "spf", "conservative"] = "fifo"
    forecast_admission: Literal["off", "reject", "repair"] = "off"  # the cluster's admission control
    # A running job needs attention (twin.job_health) this long past its time limit, or past its last
    # progress report: overdue (its end was not reported) or stalled (it may hang).
    job_attention_minutes: float = Field(default=30.0, gt=0, le=MAX_SIMULATED_SECONDS / 60)
    forecast_workers: int | None = Field(default=None, ge=1)  # processes for an ensemble; unset: by its size
    # A Ray cluster (`ray.init` address, e.g. 10.0.0.5:6379) for capacity-plan sweeps and the ensembles of
    # forecast, whatif and backtest; unset = a local process pool. Needs the `finetwin[ray]` extra.
    ray_address: str | None = None

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, value: str | None) -> str | None:
        """A URL SQLAlchemy reads (`postgresql+psycopg://user@host/db`, `sqlite:///path`): a bad one was a
        traceback from the first command that touched the store, `info` included. And one of the two stores
        finetwin runs on: another (MySQL, `postgresql+psycopg2`) was a traceback about a missing module."""
        if value:
            from sqlalchemy.engine import make_url
            from sqlalchemy.exc import ArgumentError

            from twin.db import normalize_url

            try:
                url = make_url(normalize_url(value))
            except ArgumentError:
                raise ValueError("not a database URL (e.g. postgresql+psycopg://user@host/db)") from None
            if url.drivername not in STORE_DRIVERS:
                raise ValueError(
                    f"finetwin keeps its store in SQLite or PostgreSQL through psycopg 3 (sqlite:///PATH, "
                    f"postgresql://USER@HOST/DB), not {url.drivername}"
                )
        return value

    @model_validator(mode="after")
    def _keeps_the_lookback(self) -> TwinSettings:
        if "keep_telemetry_days" not in self.model_fields_set:  # a long lookback asked for, and kept
            self.keep_telemetry_days = max(self.keep_telemetry_days, self.forecast_lookback_days + 7.0)
        elif 0 < self.keep_telemetry_days <= self.forecast_lookback_days:
            raise ValueError(
                f"FINETWIN_KEEP_TELEMETRY_DAYS ({self.keep_telemetry_days:g}) must be more than "
                f"FINETWIN_FORECAST_LOOKBACK_DAYS ({self.forecast_lookback_days:g}): forecasts learn from "
                "that much telemetry (0 keeps everything)"
            )
        return self

    @field_validator("forecast_every", mode="before")
    @classmethod
    def _duration(cls, value: object) -> float:
        from twin.units import parse_duration

        return parse_duration(value)  # type: ignore[arg-type]

    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a file of that name, no permission: said with the setting that names it
            why = f"the data directory (FINETWIN_DATA_DIR) cannot be made: {exc.strerror or exc}"
            raise OSError(exc.errno, why, str(self.data_dir)) from None
        store = str((self.data_dir / "finetwin.db").resolve())
        # SQLAlchemy reads "?" in a URL as the start of its query and decodes "%XX": a data directory named
        # with either put the store elsewhere (`d?x` made a file `d`, shared by every `d?...`).
        return "sqlite:///" + store.replace("%", "%25").replace("?", "%3F")

    def store_description(self) -> str:
        """Where the store is, for people: the SQLite file, or the database URL without its password."""
        if not self.database_url:
            return str((self.data_dir / "finetwin.db").resolve())
        from sqlalchemy.engine import make_url

        return make_url(self.database_url).render_as_string(hide_password=True)
