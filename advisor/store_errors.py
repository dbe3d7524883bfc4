"""What the API says and logs when its store does not answer: the database down or restarting, refusing
connections, its connection pool exhausted, or SQLite locked. Such a failure is the server's, passes by
itself, and is the same whoever asks, so a request gets a 503 in the API's error shape and background work
(the standing forecast, steering, plans, the relay, pruning) one log line per attempt, not a traceback each
time a scheduler ticks. The driver's own message names the database's host and port: it goes to the log,
never to a caller or into what the API shows (a plan's error, steering's reason).
"""

from __future__ import annotations

import logging

from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

STORE_ERRORS = (OperationalError, PoolTimeout)
STORE_UNAVAILABLE = (
    "the store does not answer (its database is down, refuses connections, or is busy); retry shortly"
)
STORE_RETRY_AFTER_S = "5"


def store_unavailable(exc: BaseException) -> bool:
    return isinstance(exc, STORE_ERRORS)


def driver_says(exc: BaseException) -> str:
    """The first line of what the database driver said (without SQLAlchemy's SQL and background link)."""
    orig = getattr(exc, "orig", None)
    lines = str(orig if orig is not None else exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def public_reason(exc: BaseException) -> str:
    """Why background work failed, for the API to show: a store that does not answer in the words of the
    503, anything else as its type and message."""
    return STORE_UNAVAILABLE if store_unavailable(exc) else f"{type(exc).__name__}: {exc}"


def log_failure(logger: logging.Logger, what: str, exc: BaseException) -> None:
    """`what` failed with `exc` (called in its except block): a store that does not answer as one warning,
    anything else as an error with its traceback."""
    if store_unavailable(exc):
        logger.warning("%s: the store does not answer: %s", what, driver_says(exc))
    else:
        logger.error("%s", what, exc_info=exc)
