"""One settings object for every part of finetwin, read from `FINETWIN_*` environment variables.

Built once by the CLI and passed down; nothing reads the environment on its own.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from twin.limits import DEFAULT_MAX_CLOCK_SKEW


def default_data_dir() -> Path:
    """The user's data directory for finetwin (platformdirs); FINETWIN_DATA_DIR overrides it."""
    from platformdirs import user_data_path

    return user_data_path("finetwin", appauthor=False)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FINETWIN_", extra="ignore")

    # Where state lives: one directory per user by platform convention (~/.local/share/finetwin on Linux),
    # so every command finds the same store wherever it is run from. Unset database URL = a SQLite file in it.
    data_dir: Path = Field(default_factory=lambda: default_data_dir())
    database_url: str | None = None

    # Kafka. Unset bootstrap = `finetwin up` starts an embedded broker.
    kafka_bootstrap: str | None = None
    telemetry_topic: str = "finetwin.telemetry"
    dlq_topic: str = "finetwin.telemetry.dlq"
    actions_topic: str = "finetwin.actions"
    telemetry_partitions: int = 6
    consumer_group: str = "finetwin-ingest"
    # Most messages per ingest transaction. A poll returns what is there, so this only bites under backlog,
    # where bigger transactions go faster (bench/ingest.py: 1000 -> 6.4k, 5000 -> 8.7k events/s).
    ingest_batch_size: int = 5000
    ingest_poll_timeout_ms: int = 500
    # Events dated further ahead of the ingest worker's clock go to the dead-letter topic (`clock_skew`):
    # seconds, or an ISO 8601 duration such as PT1H.
    max_clock_skew: timedelta = Field(DEFAULT_MAX_CLOCK_SKEW, ge=timedelta(0))
    session_timeout_ms: int = 6000
    heartbeat_interval_ms: int = 1000

    cluster_id: str = "default"

    # Calibrated models.
    models_dir: Path | None = None

    # Calibration online: refits, drift of the live error, and how much observed runs count.
    refit_interval_minutes: float = 60.0  # scheduled refit in the API process
    refit_benchmarks: list[Path] = Field(default_factory=list)  # empty = the in-use version's, else bundled
    refit_observed: bool = True  # scheduled and drift refits add the runs observed through telemetry
    drift_window: int = 50  # the rolling live error is over the last N finished jobs of the model in use
    drift_min_jobs: int = 20  # fewer finished jobs than this say nothing about drift
    drift_mdape_threshold: float = 0.25  # rolling throughput MdAPE (fraction) that triggers a refit
    drift_failure_error_threshold: float = 0.15  # rolling share of wrongly predicted outcomes
    drift_check_seconds: float = 60.0  # the API re-reads the live error this often (ingest may be elsewhere)
    drift_cooldown_minutes: float = 30.0  # a drift triggers at most one refit per cooldown
    observed_weight: float = 5.0  # a fresh observed run counts this many benchmark rows ...
    observed_half_life_days: float = 30.0  # ... and its extra weight halves every this many days
    promote_tolerance: float = 0.002  # metric differences this small are noise, not "worse"
    models_keep_versions: int = 20  # online refits delete older versions (never one rollback can reach)

    # API.
    api_host: str = "127.0.0.1"
    api_port: int = 8080
    # Periodic work in the API process (refits, standing forecast, recommendations); off in most tests.
    scheduler_enabled: bool = True
    # A request body larger than this is refused (413) before anything reads it (advisor.guards).
    max_body_bytes: int = Field(1_048_576, ge=1024)
    # Failed key checks per client address: more than this many in the window and the address gets 429
    # for unknown keys until the window has passed (keys verified before keep working).
    auth_max_failures: int = Field(30, ge=1)
    auth_failure_window_seconds: float = Field(60.0, gt=0)
    # An unknown key is remembered as unknown this long (a repeat costs no database lookup).
    auth_negative_cache_seconds: float = Field(30.0, ge=0)
    # POST /v1/forecast/refresh: at most one stored refresh per this many seconds.
    forecast_refresh_min_seconds: float = Field(60.0, ge=0)

    # Declared SLOs file (YAML); unset = built-in defaults.
    slo_file: Path | None = None

    # Twin: forecasts from the live state, and the standing forecast the API refreshes and stores.
    # The standing forecast is made every this much telemetry time (`5m`, `1h` or seconds; a replay at
    # --speed 600 runs it 600 times faster than the wall clock) ...
    forecast_every: float = 300.0
    # ... but at most once per this many wall seconds (an ensemble costs seconds of CPU).
    forecast_min_wall_seconds: float = 10.0
    # The twin's clock leaves the wall clock for the telemetry's when the two disagree by more than this.
    forecast_clock_tolerance_seconds: float = 300.0
    forecast_horizon_hours: float = 24.0
    forecast_interval_minutes: float = 60.0  # width of one step of the forecast's series
    forecast_runs: int = 32  # seeded runs per ensemble
    forecast_seed: int = 0
    forecast_lookback_days: float = 7.0  # arrivals and job mix are learned from this much history
    forecast_policy: str = "fifo"  # the cluster's scheduling policy: fifo | backfill | spf
    forecast_admission: str = "off"  # the cluster's admission control: off | reject | repair
    forecast_workers: int | None = None  # processes for an ensemble; unset = decided by its size
    # A Ray cluster (`ray.init` address, e.g. 10.0.0.5:6379) for capacity-plan sweeps and the ensembles of
    # forecast, whatif and backtest; unset = a local process pool. Needs the `finetwin[ray]` extra.
    ray_address: str | None = None

    # Advisor: API keys, recommendations and the actions outbox.
    auth_cache_seconds: float = 5.0  # a verified key is trusted this long (revocation takes up to this)
    recommendation_ttl_hours: float = 24.0  # a pending recommendation expires after this long
    steering_interval_minutes: float = 30.0  # scheduled cluster steering (what-ifs against the SLOs)
    # ... of telemetry time (a replay at --speed 600 steers every few wall minutes), at most once per this
    # many wall seconds (a steering run is a dozen paired ensembles)
    steering_min_wall_seconds: float = 120.0
    steering_horizon_hours: float = 24.0  # how far each what-if forecast looks ahead
    steering_replications: int = 8  # seeded runs per what-if (paired between baseline and action)
    relay_poll_seconds: float = 2.0  # the outbox relay also looks for unsent messages this often
    advice_cache_size: int = 2048  # advice answers remembered per model version (same config, same answer)
    advice_max_batch: int = Field(64, ge=1)  # uncached advice requests answered together in one model call
    advice_fast_path: bool = True  # answer repeated advice before FastAPI parses it (advisor.fastpath)

    # Fail instead of skipping when a test service is missing (CI).
    require_services: bool = Field(default=False)

    @field_validator("forecast_every", mode="before")
    @classmethod
    def _duration(cls, value: object) -> float:
        from twin.units import parse_duration

        return parse_duration(value)  # type: ignore[arg-type]

    @field_validator("max_clock_skew", mode="before")
    @classmethod
    def _seconds_as_text(cls, value: object) -> object:
        """`FINETWIN_MAX_CLOCK_SKEW=90` means 90 seconds (pydantic reads a bare number only when not text)."""
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                return value
        return value

    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        self.data_dir.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{(self.data_dir / 'finetwin.db').resolve()}"

    def store_description(self) -> str:
        """Where the store is, for people: the SQLite file, or the database URL without its password."""
        if not self.database_url:
            return str((self.data_dir / "finetwin.db").resolve())
        from sqlalchemy.engine import make_url

        return make_url(self.database_url).render_as_string(hide_password=True)

    def resolved_models_dir(self) -> Path:
        return self.models_dir if self.models_dir is not None else self.data_dir / "models"
