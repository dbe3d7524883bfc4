"""A check shared by the tests of the GPUs up read from the store (`twin.gpus_up`) and of what ingest keeps
for it (`ingest.node_changes`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import numpy as np
from sqlalchemy import Engine
from sqlmodel import Session

from twin.gpus_up import NodeReport, gpus_up_from_reports, load_gpus_up


def assert_window_reads_as_every_report_folded(
    engine: Engine, reports: Sequence[NodeReport], origin: datetime, until: datetime, pieces: int = 6
) -> None:
    """The GPUs up read from the store over [origin, until), in `pieces` equal intervals, are those that
    folding every report up to `until` gives."""
    edges = np.linspace(0.0, (until - origin).total_seconds(), pieces + 1)
    with Session(engine) as session:
        read = load_gpus_up(session, "default", origin, until).seconds_up(edges)
    folded = gpus_up_from_reports([r for r in reports if r.ts < until], origin).seconds_up(edges)
    assert {k for k, v in read.items() if v.any()} == {k for k, v in folded.items() if v.any()}
    for name, seconds in folded.items():
        np.testing.assert_allclose(read.get(name, 0.0 * seconds), seconds, err_msg=f"{origin} {until}")
