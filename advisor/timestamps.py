"""Times in API answers: always with their offset (UTC), as the OpenAPI `date-time` format requires.

SQLite hands back the naive UTC times it stores; PostgreSQL aware ones. Either way an answer says UTC.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from pydantic import AfterValidator


def as_utc(value: datetime) -> datetime:
    """A stored time in UTC: a naive one is UTC already (the store writes UTC)."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


UtcDatetime = Annotated[datetime, AfterValidator(as_utc)]
