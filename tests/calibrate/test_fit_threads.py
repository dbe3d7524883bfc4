"""The fits run on one OpenMP thread (calibrate.fit.FIT_THREADS) even in a process that has not loaded
scikit-learn yet: threadpoolctl limits only the libraries loaded when it is entered, and the models import
scikit-learn only where they fit (so that predicting from compiled trees runs without it). Unlimited, a
calibration beside its comparison worker took 28 s instead of 16."""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = """
import json, sys
from threadpoolctl import threadpool_info
from calibrate import fit
assert "sklearn" not in sys.modules, "this check needs a process without scikit-learn"
with fit._quiet_threads():
    pools = [p["num_threads"] for p in threadpool_info() if p["user_api"] == "openmp"]
print(json.dumps(pools))
"""


def test_a_fit_in_a_fresh_process_runs_on_one_openmp_thread() -> None:
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True)
    pools = json.loads(done.stdout)
    assert pools, "scikit-learn's OpenMP runtime was not loaded when the fit began"
    assert set(pools) == {1}
