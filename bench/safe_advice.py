"""Does the advice hold in reality (issue 14, point 3)? On held-out splits of the benchmark: fit the models
on the training rows only, ask the advisor about every held-out configuration, look each recommended
configuration up among the held-out rows (exact match on the configuration columns) and count the share
of those found that ran validly. Repairs (of configurations the admission rules reject) and fewest-GPU
recommendations are counted apart, before (ranked and filtered on the point estimate of p_valid, as the
advisor did) and after (on the calibrated lower bound `p_valid_low`).

Before: the repair as the rules give it, and the fewest GPUs with p_valid >= 0.7. After: the repair only when
its lower bound meets the threshold (else the closest configuration that does, else nothing), and the
fewest GPUs whose lower bound meets it.

Run on its own: `.venv/bin/python bench/accuracy.py --advice [--seeds 3] [--blocks 10]`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import pandas as pd

from advisor.advice import advise_many
from advisor.advice_answer import RECOMMEND_P_VALID_LOW
from advisor.advice_plan import AdviceError
from advisor.advice_schemas import AdviceOut, ConfigOut
from calibrate.fit import fit_models
from calibrate.splits import Split
from twin.job_config import config_from_row

TARGET = 0.97  # issue 14: share of checkable recommendations that ran
KEY_FIELDS = (
    "model_name", "method", "gpu_model", "number_gpus", "number_nodes", "batch_size", "tokens_per_sample",
    "enable_roce", "fast_moe", "fast_kernels",
)  # fmt: skip
MODES = {"before": 0.0, "after": RECOMMEND_P_VALID_LOW}
KINDS = ("repair", "fewest_gpus")


@dataclass
class Tally:
    """Recommendations made, those found among the held-out rows, and how many of those found ran."""

    made: int = 0
    found: int = 0
    ran: float = 0.0  # a configuration with several held-out rows counts the share of them that ran
    abstained: int = 0  # questions the advisor gave no recommendation for

    def share(self) -> float:
        return self.ran / self.found if self.found else float("nan")


def _key(config: object) -> tuple:
    return tuple(str(getattr(config, name)) for name in KEY_FIELDS)


def _recommended(answer: AdviceOut, kind: str, mode: str) -> ConfigOut | None:
    if kind == "fewest_gpus":
        return answer.fewest_gpus.config if answer.fewest_gpus is not None else None
    repair = answer.repair
    if repair is None:
        return None
    if mode == "before" or repair.confident:
        return repair.config
    return repair.alternative.config if repair.alternative is not None else None


def measure(table: pd.DataFrame, splits: list[Split]) -> dict[tuple[str, str, str], Tally]:
    """(split kind, recommendation kind, mode) -> tally, pooled over the folds of each kind."""
    tallies: dict[tuple[str, str, str], Tally] = defaultdict(Tally)
    for split in splits:
        train, test = table.iloc[split.train], table.iloc[split.test]
        models = fit_models(train, seed=0)
        configs = [config_from_row(row) for _, row in test.iterrows()]
        outcomes: dict[tuple, list[bool]] = defaultdict(list)
        for config, outcome in zip(configs, test["outcome"].astype(str), strict=True):
            outcomes[_key(config)].append(outcome == "valid")
        questions = [(config, None) for config in dict.fromkeys(configs)]
        for mode, threshold in MODES.items():
            answers = advise_many(questions, models, min_p_valid_low=threshold)
            for answer in answers:
                if isinstance(answer, AdviceError):
                    continue
                for kind in KINDS:
                    if kind == "repair" and answer.repair is None:
                        continue
                    tally = tallies[(split.kind, kind, mode)]
                    chosen = _recommended(answer, kind, mode)
                    if chosen is None:
                        tally.abstained += 1
                        continue
                    tally.made += 1
                    seen = outcomes.get(_key(chosen))
                    if seen:
                        tally.found += 1
                        tally.ran += float(np.mean(seen))
    return tallies


def print_advice_table(tallies: dict[tuple[str, str, str], Tally]) -> bool:
    header = (
        f"{'recommendation':<12} {'split':<9} {'mode':<7} {'made':>6} {'found':>6} {'ran':>7} "
        f"{'share':>7} {'none':>5} {'target':>7}  ok"
    )
    print(header)
    print("-" * len(header))
    all_ok = True
    for kind in KINDS:
        for split_kind in dict.fromkeys(k[0] for k in tallies):
            for mode in MODES:
                tally = tallies.get((split_kind, kind, mode))
                if tally is None:
                    continue
                share = tally.share()
                ok = mode == "before" or (share >= TARGET if np.isfinite(share) else True)
                all_ok &= bool(ok)
                target = f"{TARGET:.2f}" if mode == "after" else "-"
                print(
                    f"{kind:<12} {split_kind:<9} {mode:<7} {tally.made:>6} {tally.found:>6} "
                    f"{tally.ran:>7.1f} {share:>7.3f} {tally.abstained:>5} {target:>7}  "
                    f"{'yes' if ok else 'NO'}"
                )
    print(
        "\nmade: recommendations; found: of them, configurations among the held-out rows; "
        "ran: of those found, valid runs; none: questions with no recommendation that meets the bar"
    )
    return all_ok
