"""Logging for the console script: finetwin's own parts at INFO, libraries only their warnings.

A start of `finetwin up` used to print a hundred lines (apscheduler's every job, alembic's every
migration, kafka's connection chatter); the operator reads the few lines finetwin itself writes and
the banner. `-v` brings the libraries' INFO lines back, `-vv` everything at DEBUG.
"""

from __future__ import annotations

import logging
import sys

# Loggers of finetwin's own packages: their INFO lines are the ones meant for the operator.
OWN_LOGGERS = ("finetwin", "twin", "ingest", "calibrate", "advisor")

# Warnings that are expected on a small machine running everything in one process, with what they mean:
# the first of each is shown with its explanation, repeats are dropped. With -v all pass untouched.
EXPECTED_WARNINGS: dict[str, str] = {
    "blocking the event loop": (
        "kafka-python's network thread got the CPU late (a busy machine or a long batch); it carries on, "
        "nothing is lost"
    ),
    "maximum number of running instances reached": (
        "a periodic job (forecast, steering) was still running when its next turn came: that turn is "
        "skipped and the next one runs; on a busy machine this is normal"
    ),
}


def configure_logging(verbose: int) -> None:
    """The root at WARNING (INFO with -v, DEBUG with -vv); finetwin's own loggers at INFO at least."""
    root_level = logging.DEBUG if verbose >= 2 else logging.INFO if verbose else logging.WARNING
    logging.basicConfig(
        level=root_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )
    own_levels(root_level)
    if not verbose:
        explained = ExplainExpected()
        for handler in logging.getLogger().handlers:
            handler.addFilter(explained)


def own_levels(root_level: int) -> None:
    """finetwin's loggers at INFO, or lower when the root is lower (a child process calls this too)."""
    for name in OWN_LOGGERS:
        logging.getLogger(name).setLevel(min(root_level, logging.INFO))


class ExplainExpected(logging.Filter):
    """Rewrites the first of each expected warning into its explanation and drops the repeats."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING or record.name.split(".")[0] in OWN_LOGGERS:
            return True
        message = record.getMessage()
        for needle, explanation in EXPECTED_WARNINGS.items():
            if needle in message:
                if needle in self._seen:
                    return False
                self._seen.add(needle)
                record.msg, record.args = f"{message} (expected: {explanation})", ()
                return True
        return True
