"""The ensemble's summary of its series: per interval, the mean and the p10-p90 across runs, for every
series a forecast document holds.

    .venv/bin/python bench/ensemble_summary.py [--runs 32] [--repeat 3]

The series of a forecast of four GPU types under three SLOs (the run metrics' series, utilization per
type, each SLO's held-or-not), each run a full row, over a day of hourly intervals (the standing
forecast), a week of 5-minute ones and a day of 1-second ones (`finetwin forecast --interval 1s`, the
finest the CLI takes for a day). Measured, best of `--repeat`, on the same rows in one run:

- now: `twin.ensemble.spread_series`, the intervals with as many runs with a value reduced at once (the two
  waits have none in half of each run's intervals, as where no job started);
- the baseline: one `twin.ensemble.spread` per interval, as spread_series did before.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from timing import Row, best_of, print_table  # noqa: E402

from tests.twin.test_spread import spread_of_each_interval  # noqa: E402  (the reference: the code before)
from twin.ensemble import spread_series  # noqa: E402
from twin.run_metrics import SERIES_FIGURES  # noqa: E402

SERIES_PER_DOCUMENT = len(SERIES_FIGURES) + 4 + 3  # the figures, utilization of 4 GPU types, 3 SLOs
WIDTHS = (("a day of hourly intervals", 24), ("a week of 5-minute intervals", 2016),
          ("a day of 1-second intervals", 86_400))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    rows: list[Row] = []
    for name, width in WIDTHS:
        document = [
            [rng.lognormal(0.0, 1.0, width) for _ in range(args.runs)] for _ in range(SERIES_PER_DOCUMENT)
        ]
        for series in document[:2]:  # the waits: no value in a run's interval where no job started
            for run in series:
                run[rng.random(width) < 0.5] = np.nan
        now = best_of(args.repeat, lambda d=document: [spread_series(series) for series in d])
        repeat = 1 if width > 10_000 else args.repeat  # the baseline takes a minute and a half there
        before = best_of(repeat, lambda d=document: [spread_of_each_interval(series) for series in d])
        rows.append((f"{SERIES_PER_DOCUMENT} series x {args.runs} runs, {name} (s)", now, before,
                     "one spread per interval"))  # fmt: skip
    print_table(rows, value="now", baseline="before")


if __name__ == "__main__":
    main()
