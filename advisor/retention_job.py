"""The store's retention on the API's scheduler: `twin.retention.prune_due` every PRUNE_EVERY_S of wall time,
so that a store an API runs on keeps FINETWIN_KEEP_TELEMETRY_DAYS of telemetry and no more."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from advisor.parts import ApiRuntime
from advisor.store_errors import log_failure
from twin.retention import prune_due

log = logging.getLogger(__name__)

# Often enough that a replay at --speed 600 (100 hours of telemetry in 10 minutes) stays near its horizon;
# with nothing to delete, a tick reads two ends of an index.
PRUNE_EVERY_S = 600.0


def prune_tick(runtime: ApiRuntime) -> None:
    try:
        pruned = prune_due(runtime.engine, runtime.settings)
    except Exception as exc:  # the scheduler must keep running; the next tick tries again
        log_failure(log, "pruning the store's old telemetry failed", exc)
        return
    if pruned is not None and (pruned.events or pruned.node_changes or pruned.scores):
        log.info("pruned telemetry: %s", pruned.describe())


def schedule_pruning(runtime: ApiRuntime) -> None:
    """Put the prune on the API's scheduler (started by the lifespan), unless the settings keep everything."""
    if not runtime.settings.keep_telemetry_days:
        return
    runtime.scheduler.add_job(
        prune_tick,
        "interval",
        args=[runtime],
        seconds=PRUNE_EVERY_S,
        id="prune-telemetry",
        next_run_time=datetime.now(UTC),
        max_instances=1,
        coalesce=True,
        replace_existing=True,
    )
