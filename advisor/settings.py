"""The advisor's settings (the API, keys, recommendations, steering, the outbox), read from `FINETWIN_*`
variables; on top of calibration's, whose refits and models the API runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, Field, StringConstraints

from calibrate.settings import CalibrateSettings
from twin.limits import MAX_ENSEMBLE_RUNS, MAX_SIMULATED_SECONDS, check_topic_name


class AdvisorSettings(CalibrateSettings):
    # API.
    api_host: str = "127.0.0.1"
    api_port: int = Field(default=8080, ge=0, le=65_535)
    # The reverse proxies whose X-Forwarded-For `finetwin api` believes (comma-separated addresses, or *):
    # the failed-key limit then counts each client's own address. Unset: uvicorn's default (127.0.0.1).
    forwarded_allow_ips: str | None = None
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
    # POST /v1/whatif: at most this many at once in this process, the next answered 429 (each forks a pool
    # of worker processes: unbounded, a few viewers' what-ifs took every core and gigabytes of memory).
    whatif_concurrency: int = Field(2, ge=1)
    # How much lower the twin's workers run than the requests (`os.nice`): the standing forecast, steering
    # runs and plans take the cores the requests leave, as refits do (`calibrate.refit_process`).
    twin_worker_nice: int = Field(10, ge=0, le=19)
    # How long a thread of the API's process may hold the interpreter while another waits for it (Python's
    # default is 5 ms): a standing forecast too small for worker processes, and steering's preparation of
    # its what-ifs (the models asked for each), run on a thread of this process and held it from requests.
    api_switch_interval_ms: float = Field(0.5, gt=0, le=100)

    # Declared SLOs file (YAML); unset = built-in defaults.
    slo_file: Path | None = None

    # Approved actions are published here (the outbox, whose rows hold a topic's name in 200 characters).
    actions_topic: Annotated[str, StringConstraints(max_length=200), AfterValidator(check_topic_name)] = (
        "finetwin.actions"
    )

    # Advisor: API keys, recommendations and the actions outbox.
    # A verified key is trusted this long (revocation takes up to this)
    auth_cache_seconds: float = Field(default=5.0, ge=0)
    # A pending recommendation expires after this long
    recommendation_ttl_hours: float = Field(default=24.0, gt=0)
    # Scheduled cluster steering (what-ifs against the SLOs)
    steering_interval_minutes: float = Field(default=30.0, gt=0)
    # ... of telemetry time (a replay at --speed 600 steers every few wall minutes), at most once per this
    # many wall seconds (a steering run is a dozen paired ensembles)
    steering_min_wall_seconds: float = Field(default=120.0, ge=0)
    # How far each what-if forecast looks ahead
    steering_horizon_hours: float = Field(default=24.0, gt=0, le=MAX_SIMULATED_SECONDS / 3600)
    # Seeded runs per what-if (paired between baseline and action)
    steering_replications: int = Field(default=8, ge=1, le=MAX_ENSEMBLE_RUNS)
    # The outbox relay also looks for unsent messages this often
    relay_poll_seconds: float = Field(default=2.0, gt=0)
    # Advice answers remembered per model version (same config, same answer)
    advice_cache_size: int = Field(default=2048, ge=0)
    advice_max_batch: int = Field(64, ge=1)  # uncached advice requests answered together in one model call
    advice_fast_path: bool = True  # answer repeated advice before FastAPI parses it (advisor.fastpath)
