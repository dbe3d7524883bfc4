"""One settings object for every part of finetwin, read from `FINETWIN_*` environment variables.

Built once by the CLI and passed down; nothing reads the environment on its own.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FINETWIN_", extra="ignore")

    # Where state lives. Unset database URL = a SQLite file in the data directory.
    data_dir: Path = Path(".finetwin")
    database_url: str | None = None

    # Kafka. Unset bootstrap = `finetwin up` starts an embedded broker.
    kafka_bootstrap: str | None = None
    telemetry_topic: str = "finetwin.telemetry"
    dlq_topic: str = "finetwin.telemetry.dlq"
    actions_topic: str = "finetwin.actions"
    telemetry_partitions: int = 6
    consumer_group: str = "finetwin-ingest"
    ingest_batch_size: int = 500
    ingest_poll_timeout_ms: int = 500
    session_timeout_ms: int = 6000
    heartbeat_interval_ms: int = 1000

    cluster_id: str = "default"

    # Calibrated models.
    models_dir: Path | None = None

    # API.
    api_host: str = "127.0.0.1"
    api_port: int = 8080
    # Periodic work in the API process (refits, standing forecast, recommendations); off in most tests.
    scheduler_enabled: bool = True

    # Declared SLOs file (YAML); unset = built-in defaults.
    slo_file: Path | None = None

    # Fail instead of skipping when a test service is missing (CI).
    require_services: bool = Field(default=False)

    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        self.data_dir.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{(self.data_dir / 'finetwin.db').resolve()}"

    def resolved_models_dir(self) -> Path:
        return self.models_dir if self.models_dir is not None else self.data_dir / "models"
