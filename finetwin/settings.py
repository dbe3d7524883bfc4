"""The application's settings: every package's, composed (one object, every `FINETWIN_*` variable)."""

from __future__ import annotations

from advisor.settings import AdvisorSettings
from ingest.settings import IngestSettings


class Settings(AdvisorSettings, IngestSettings):
    """What the CLI builds once and passes down; each package's code sees it as its own settings class."""
