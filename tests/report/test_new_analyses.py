"""The analyses the capsule computes beyond the paper's text (batch doubling on matched pairs, the share of
fast-kernel pairs that gain, expert-parallel degrees that never ran, RoCE per model on 4 nodes, the
inventory, Table 1's rounding), each on a small hand-made file with its answer worked out by hand in the
test AND recomputed here in plain pandas on the raw CSV, without the report's helpers."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from calibrate.loader import load_benchmark
from calibrate.report import compute_numbers
from calibrate.report.render import render
from calibrate.report.stats import largest_remainder_pct
from tests.report.conftest import CAPPED, PCIE, SXM, UNCAPPED, pandas_ratios, row, write_bench


def written(tmp_path: Path, rows: list[dict[str, str]]) -> tuple[dict[str, Any], pd.DataFrame]:
    """The report's numbers for `rows`, and the same file as plain pandas reads it."""
    path = write_bench(tmp_path / "bench.csv", rows)
    return compute_numbers(load_benchmark(path), source="hand-made"), pd.read_csv(path)


# ── batch size on matched pairs ─────────────────────────────────────────────────────────────────────────────


def batch_rows() -> list[dict[str, str]]:
    return [
        # llama3.1-8b at 512 tokens: 1 -> 2 gains 1.5x, 2 -> 4 gains 1.2x.
        row(tps=1000, batch=1),
        row(tps=1500, batch=2),
        row(tps=1800, batch=4),
        row(batch=8),  # failed: no 4 -> 8 pair
        # granite-3.1-2b: 1 -> 2 gains 1.1x; batch 8 has no batch-4 partner.
        row(tps=2000, batch=1, model="granite-3.1-2b"),
        row(tps=2200, batch=2, model="granite-3.1-2b"),
        row(tps=5000, batch=8, model="granite-3.1-2b"),
        # llama3.1-8b at 1024 tokens: 2 -> 4 gains 1.5x.
        row(tps=800, batch=2, tokens=1024),
        row(tps=1200, batch=4, tokens=1024),
        # Two datasets (an identifier-only setting): not a pair, but both count in Figure 3's medians.
        row(tps=3000, batch=1, model="llama3.2-3b", identifier_extra="-dataset_id.a"),
        row(tps=100, batch=2, model="llama3.2-3b", identifier_extra="-dataset_id.b"),
        # Two GPUs: not in a one-GPU analysis.
        row(tps=900, batch=2, gpus=2),
        row(tps=9000, batch=4, gpus=2),
        # L40S: one pair, 1 -> 2 loses (0.8x).
        row(tps=500, batch=1, gpu="L40S"),
        row(tps=400, batch=2, gpu="L40S"),
    ]


def test_batch_doubling_on_matched_pairs_and_the_log2_fit(tmp_path: Path) -> None:
    numbers, raw = written(tmp_path, batch_rows())
    sxm = numbers["batch_doubling"][SXM]
    # 1 -> 2: pairs 1.5 and 1.1; 2 -> 4: pairs 1.2 and 1.5. Medians 1.3 and 1.35; quartiles interpolate.
    assert sxm["doublings"] == ["1->2", "2->4"]
    assert sxm["pairs"] == [2, 2]
    assert sxm["ratios"] == pytest.approx([1.3, 1.35])
    assert sxm["q25"] == pytest.approx([1.2, 1.275])
    assert sxm["q75"] == pytest.approx([1.4, 1.425])
    # Figure 3's unmatched medians: batch 1 {1000, 2000, 3000} -> 2000; batch 2 {1500, 2200, 800, 100}
    # -> 1150; batch 4 {1800, 1200} -> 1500; batch 8 {5000}. On x = 0..3: Sxy = 4675, Sxx = 5,
    # Syy = 9,291,875, so slope 935 tokens/s per doubling and R² = Sxy² / (Sxx Syy).
    assert sxm["log2_fit"]["slope"] == pytest.approx(935.0)
    assert sxm["log2_fit"]["r2"] == pytest.approx(4675**2 / (5 * 9_291_875))
    assert sxm["log2_fit"]["points"] == 4
    l40s = numbers["batch_doubling"]["L40S"]
    assert (l40s["doublings"], l40s["ratios"], l40s["pairs"]) == (["1->2"], [pytest.approx(0.8)], [1])
    # Two points lie on a line: R² 1, slope -100.
    assert l40s["log2_fit"] == {"slope": pytest.approx(-100.0), "r2": pytest.approx(1.0), "points": 2}

    # The same in plain pandas on the raw file.
    for gpu in (SXM, "L40S"):
        one = raw[(raw.number_gpus == 1) & (raw.gpu_model == gpu)]
        expected = {
            f"{b}->{2 * b}": r
            for b in (1, 2, 4)
            if len(r := pandas_ratios(one, "batch_size", b, 2 * b, strip=r"-batch_size\.[\d.]+"))
        }
        got = numbers["batch_doubling"][gpu]
        assert got["doublings"] == list(expected)
        assert got["pairs"] == [len(r) for r in expected.values()]
        assert got["ratios"] == pytest.approx([r.median() for r in expected.values()])
        assert got["q25"] == pytest.approx([r.quantile(0.25) for r in expected.values()])
        medians = one[one.is_valid == 1].groupby("batch_size").dataset_tokens_per_second.median()
        x, y = np.log2(medians.index.to_numpy(float)), medians.to_numpy(float)
        assert got["log2_fit"]["slope"] == pytest.approx(np.polyfit(x, y, 1)[0])
        assert got["log2_fit"]["r2"] == pytest.approx(np.corrcoef(x, y)[0, 1] ** 2)


def test_report_says_to_believe_the_matched_doublings_where_the_medians_disagree(tmp_path: Path) -> None:
    numbers, _ = written(tmp_path, batch_rows())
    text = render(numbers, {})  # report.md's text; the figures are tested in test_figures.py
    assert "### Batch size on matched pairs (Figure 3b)" in text
    assert "believe the matched ratio" in text
    # Unmatched 1 -> 2 on A100-SXM: 1150 / 2000 = 0.575 falls, while the matched pairs gain 1.3x.
    assert "1→2 (0.57× unmatched vs 1.30× matched)" in text
    assert "| A100-SXM | 2→4 | 2 | 1.35× | 1.27–1.43 | 1.30× |" in text
    assert (
        "**L40S**: least squares" in text and "Not every matched doubling gains (lowest 0.80× at 1→2)" in text
    )


def test_batch_doubling_without_a_pair_keeps_the_fit_and_says_so(tmp_path: Path) -> None:
    numbers, _ = written(tmp_path, [row(tps=1000, batch=1), row(tps=1000, batch=4, model="granite-3.1-2b")])
    sxm = numbers["batch_doubling"][SXM]
    assert sxm["doublings"] == sxm["ratios"] == sxm["pairs"] == []
    # Two batch sizes with equal medians: a flat line, R² undefined (None, not NaN).
    assert sxm["log2_fit"] == {"slope": pytest.approx(0.0, abs=1e-9), "r2": None, "points": 2}


# ── fast kernels: the share of pairs that gain ──────────────────────────────────────────────────────────────


def test_fast_kernels_share_faster_counts_pairs_above_one(tmp_path: Path) -> None:
    protocol = "SFTTrainer.finetune_full_benchmark-v1.0.0-fms_hf_tuning_version.3.1.0-num_train_epochs.10"
    common = {"experiment": protocol, "version": "3.1.0"}
    numbers, raw = written(
        tmp_path,
        [
            row(tps=200, model="granite-3.1-2b", **common),  # 1.25
            row(tps=250, model="granite-3.1-2b", fast_kernels=True, **common),
            row(tps=1000, model="llama3.2-3b", **common),  # 1.5
            row(tps=1500, model="llama3.2-3b", fast_kernels=True, **common),
            row(tps=1000, model="llama3.1-8b", **common),  # 0.8: slower
            row(tps=800, model="llama3.1-8b", fast_kernels=True, **common),
            row(tps=1000, model="granite-3-8b", **common),  # 1.0: no gain, so not faster
            row(tps=1000, model="granite-3-8b", fast_kernels=True, **common),
            row(tps=1000, model="llama3-8b", **common),  # its fast-kernel run failed: no pair
            row(model="llama3-8b", fast_kernels=True, **common),
        ],
    )
    kernels = numbers["fast_kernels"]
    assert kernels["pairs"] == 4
    assert kernels["share_faster"] == pytest.approx(0.5)  # 1.25 and 1.5 of {1.25, 1.5, 0.8, 1.0}
    ratios = pandas_ratios(raw, "fast_kernels", False, True, protocol=r"-fast_kernels\.\[[^\]]*\]")
    assert len(ratios) == 4
    assert kernels["share_faster"] == pytest.approx((ratios > 1).mean())


def test_fast_kernels_share_faster_is_none_without_pairs(tmp_path: Path) -> None:
    numbers, _ = written(tmp_path, [row(tps=1000)])
    assert numbers["fast_kernels"]["pairs"] == 0 and numbers["fast_kernels"]["share_faster"] is None


# ── fast MoE: degrees tried that never ran ──────────────────────────────────────────────────────────────────


def test_fast_moe_degrees_without_a_valid_run(tmp_path: Path) -> None:
    tiny = "granite-4.0-h-tiny"
    numbers, raw = written(
        tmp_path,
        [
            row(tps=400, model=tiny, fast_moe=0),
            row(tps=1000, model=tiny, fast_moe=1),
            row(tps=700, model=tiny, fast_moe=2, gpus=2),
            row(model=tiny, fast_moe=8, gpus=8, batch=8),  # EP 8 failed once ...
            row(tps=9000, model=tiny, fast_moe=8, gpus=8, batch=16),  # ... and ran once: not listed
            row(model=tiny, fast_moe=16, gpus=16, nodes=2, batch=16),  # EP 16: failed at runtime twice
            row(model=tiny, fast_moe=16, gpus=16, nodes=2, batch=32),
            row(
                model=tiny, fast_moe=32, gpus=16, nodes=2, batch=32
            ),  # EP 32: rejected (32 does not divide 16)
        ],
    )
    never = numbers["fast_moe"]["degrees_without_valid_run"]
    assert never == {"16": 2, "32": 1}
    tried = raw[raw.fast_moe > 0].groupby("fast_moe").is_valid.agg(["max", "size"])
    expected = {str(int(ep)): int(r["size"]) for ep, r in tried.iterrows() if r["max"] == 0}
    assert never == expected
    text = render(numbers, {})
    assert "EP 16 (2 experiments), EP 32 (1 experiment)" in text


# ── RoCE per model on 4 nodes ───────────────────────────────────────────────────────────────────────────────


def roce_rows() -> list[dict[str, str]]:
    def multi(tps: float | None, roce: int, **kw: Any) -> dict[str, str]:
        nodes = kw.pop("nodes", 4)
        return row(tps=tps, roce=roce, nodes=nodes, gpus=8 * nodes, batch=8 * nodes, **kw)

    capped = {"experiment": CAPPED, "version": "2.7.1"}
    return [
        # No time limit, 4 nodes: llama3.1-70b gains 1.5x and 1.1x (median 1.3), mixtral 2.5x.
        multi(1000, 0, model="llama3.1-70b"),
        multi(1500, 1, model="llama3.1-70b"),
        multi(1000, 0, model="llama3.1-70b", tokens=1024),
        multi(1100, 1, model="llama3.1-70b", tokens=1024),
        multi(2000, 0, model="mixtral-8x7b-instruct-v0.1"),
        multi(5000, 1, model="mixtral-8x7b-instruct-v0.1"),
        # 2 nodes: a RoCE pair, but not on 4 nodes.
        multi(1000, 0, model="llama3.1-70b", nodes=2),
        multi(4000, 1, model="llama3.1-70b", nodes=2),
        # 4 nodes without a partner (the RoCE run failed).
        multi(1000, 0, model="llama3.1-8b"),
        multi(None, 1, model="llama3.1-8b"),
        # Capped at 600 s, 4 nodes: 3x.
        multi(100, 0, model="granite-3.1-8b-instruct", **capped),
        multi(300, 1, model="granite-3.1-8b-instruct", **capped),
    ]


def test_roce_per_model_on_four_nodes_per_campaign(tmp_path: Path) -> None:
    numbers, raw = written(tmp_path, roce_rows())
    per_model = numbers["roce"]["per_model_4_nodes"]
    assert set(per_model) == {"no time limit", "600 s cap"}
    uncapped = per_model["no time limit"]
    assert set(uncapped) == {"llama3.1-70b", "mixtral-8x7b-instruct-v0.1"}  # llama3.1-8b has no pair
    assert (uncapped["llama3.1-70b"]["pairs"], uncapped["llama3.1-70b"]["median"]) == (2, pytest.approx(1.3))
    assert uncapped["mixtral-8x7b-instruct-v0.1"]["median"] == pytest.approx(2.5)
    assert uncapped["mixtral-8x7b-instruct-v0.1"]["gpu_hours_saved_pct"] == pytest.approx(60.0)
    assert per_model["600 s cap"] == {"granite-3.1-8b-instruct": pytest.approx(
        {"pairs": 1, "median": 3.0, "q25": 3.0, "q75": 3.0, "iqr": 0.0, "gpu_hours_saved_pct": 100 * 2 / 3}
    )}  # fmt: skip

    ratios = pandas_ratios(raw[raw.number_nodes > 1], "enable_roce", 0, 1, strip=r"-enable_roce\.[\d.]+")
    frame = ratios.rename("ratio").reset_index()
    frame = frame[frame.number_nodes == 4]
    frame["campaign"] = np.where(
        frame.protocol.str.contains("stop_after_seconds"), "600 s cap", "no time limit"
    )
    expected = frame.groupby(["campaign", "model_name"]).ratio.agg(["median", "size"])
    got = {(c, m): (s["median"], s["pairs"]) for c, by in per_model.items() for m, s in by.items()}
    assert got == {k: (pytest.approx(r["median"]), r["size"]) for k, r in expected.iterrows()}
    text = render(numbers, {})
    assert "### RoCE on 4 nodes, per model" in text
    assert "| no time limit | mixtral-8x7b-instruct-v0.1 | 1 | 2.50× |" in text


# ── inventory ───────────────────────────────────────────────────────────────────────────────────────────────


def test_inventory_counts_ids_sizes_the_a100_sxm_share_and_gpus_without_power(tmp_path: Path) -> None:
    numbers, raw = written(
        tmp_path,
        [
            row(tps=1000, model="llama3.2-1b", power=300),
            row(tps=1000, model="llama3.1-405b", experiment=CAPPED, version="2.7.1", power=350),
            row(model="llama3.2-1b", experiment=UNCAPPED + "-optim.sgd"),
            row(tps=900, model="acme-chat", gpu="L40S"),  # ran, but L40S reports no power
            row(model="llama3.2-1b", gpu=PCIE),  # never ran on A100-PCIe: no power either
            row(tps=800, model="llama3.2-1b", gpu="L40S"),
        ],
    )
    inventory = numbers["inventory"]
    assert inventory["experiments"] == 6
    assert inventory["experiment_ids"] == 3
    assert inventory["llms"] == 3
    assert inventory["model_params_billion"] == {
        "min": 1.2, "max": 405, "smallest_model": "llama3.2-1b", "largest_model": "llama3.1-405b",
    }  # fmt: skip
    assert inventory["models_without_known_size"] == ["acme-chat"]
    assert inventory["a100_sxm_rows_pct"] == pytest.approx(50.0)
    assert inventory["gpu_models_without_power_telemetry"] == [PCIE, "L40S"]  # in the paper's GPU order

    assert inventory["experiment_ids"] == raw.experiment_id.nunique()
    assert inventory["a100_sxm_rows_pct"] == pytest.approx(100 * (raw.gpu_model == SXM).mean())
    has_power = raw.groupby("gpu_model").gpu_power_watts_avg.apply(lambda p: p.notna().any())
    assert set(inventory["gpu_models_without_power_telemetry"]) == set(has_power[~has_power].index)
    text = render(numbers, {})
    assert "- 6 experiments in 3 distinct `experiment_id`s, 3 LLMs" in text
    assert "model sizes 1.2 B (llama3.2-1b) to 405 B (llama3.1-405b)" in text
    assert "without power telemetry in any experiment: A100-PCIe, L40S" in text
    # Three of six on the A100-SXM: not most of them, so no pooled number is "mostly A100-SXM".
    assert inventory["most_common_gpu"] == {"gpu_model": SXM, "rows_pct": pytest.approx(50.0)}
    assert "- no GPU type holds most of the experiments (the most, 50.0 %, ran on A100-SXM)" in text
    assert "mostly made of" not in text


@pytest.mark.parametrize(
    ("gpus", "said"),
    [
        (["L40S", "L40S", "L40S", SXM],
         "- 75.0 % of the experiments ran on L40S: a number pooled over GPU types is mostly made of L40S"),
        (["L40S"] * 2, "- every experiment ran on L40S"),
    ],
)  # fmt: skip
def test_the_data_names_the_gpu_type_a_pooled_number_speaks_of(
    tmp_path: Path, gpus: list[str], said: str
) -> None:
    numbers, _ = written(tmp_path, [row(tps=900, model="llama3-8b", gpu=gpu) for gpu in gpus])
    text = render(numbers, {})
    assert said in text, text
    assert "A100-SXM number" not in text and "ran on A100-SXM" not in text
    assert f"- {len(gpus)} experiments in 1 distinct `experiment_id`, 1 LLM\n" in text
    assert "- model size 8 B parameters (llama3-8b)" in text


# ── Table 1: largest remainder ──────────────────────────────────────────────────────────────────────────────


def plain_largest_remainder(counts: list[int]) -> list[float]:
    """Largest remainder written the capsule's way (numpy floor and argsort), to check the report's."""
    tenths = 1000 * np.asarray(counts, dtype=float) / sum(counts)
    out = np.floor(tenths)
    out[np.argsort(out - tenths, kind="stable")[: int(round(1000 - out.sum()))]] += 1
    return list(out / 10)


def test_table1_rows_sum_to_100_by_largest_remainder(tmp_path: Path) -> None:
    rows = [row(tps=1000)] * 3 + [row(gpus=2, batch=3)] * 2 + [row(batch=512)] * 2  # 3 valid, 2, 2 of 7
    rows += [row(tps=700, gpu="L40S"), row(gpus=2, batch=3, gpu="L40S"), row(batch=512, gpu="L40S")]
    numbers, _ = written(tmp_path, rows)
    sxm = numbers["table1"][SXM]
    # 3/7, 2/7, 2/7 = 42.857 %, 28.571 %, 28.571 %: rounded one by one they sum to 100.1; the largest
    # remainders (.71, .71 tenths) get the missing tenths, 42.8 + 28.6 + 28.6 = 100.0.
    assert sxm["pct_rounded"] == {"valid": 42.8, "rejected": 28.6, "runtime": 28.6}
    # 1/3 each: a tie; the first share takes the extra tenth.
    assert numbers["table1"]["L40S"]["pct_rounded"] == {
        "valid": 33.4,
        "rejected": 33.3,
        "runtime": 33.3,
    }
    assert numbers["table1_dataset"]["pct_rounded"] == {
        "valid": 40.0,
        "rejected": 30.0,
        "runtime": 30.0,
    }
    text = render(numbers, {})
    assert "| 7 | 42.8 | 28.6 | 28.6 |" in text and "| 3 | 33.4 | 33.3 | 33.3 |" in text
    table1 = text.split("### Table 1")[1].split("###")[0]
    for line in table1.splitlines():
        if line.startswith("| ") and not line.startswith("| GPU type"):
            shares = [float(c) for c in line.split("|")[5:8]]
            assert round(sum(shares), 1) == 100.0, line


@given(st.lists(st.integers(min_value=0, max_value=100_000), min_size=1, max_size=5).filter(any))
def test_largest_remainder_sums_to_100_and_stays_within_a_tenth(counts: list[int]) -> None:
    shares = largest_remainder_pct(counts, decimals=1)
    assert shares is not None
    assert round(sum(shares) * 10) == 1000
    for share, count in zip(shares, counts, strict=True):
        assert abs(share - 100 * count / sum(counts)) < 0.1 + 1e-9
    # Where equal remainders straddle the cut, the capsule's floats pick by rounding noise (its argsort of
    # nearly equal numbers); the report picks exactly, the earlier share first (the test below).
    left_over = sorted((1000 * c % sum(counts) for c in counts), reverse=True)
    missing = 1000 - sum(1000 * c // sum(counts) for c in counts)
    assume(missing in (0, len(counts)) or left_over[missing - 1] != left_over[missing])
    assert shares == pytest.approx(plain_largest_remainder(counts))


def test_equal_remainders_go_to_the_earlier_share() -> None:
    # 1519, 76, 136, 1519 of 3,250: in tenths of a %, 467.38, 23.38, 41.85, 467.38; two tenths are missing,
    # one to the largest remainder (41.85), one to the first of the three equal .38s.
    assert largest_remainder_pct([1519, 76, 136, 1519]) == [46.8, 2.3, 4.2, 46.7]


def test_largest_remainder_of_nothing_is_none() -> None:
    assert largest_remainder_pct([0, 0, 0]) is None
    assert largest_remainder_pct([5]) == [100.0]
    assert math.isclose(sum(largest_remainder_pct([1, 1, 1, 1, 1, 1, 1]) or []), 100.0)


def test_every_report_number_has_a_definition_entry_for_the_new_terms(tmp_path: Path) -> None:
    numbers, _ = written(tmp_path, batch_rows())
    definitions = numbers["meta"]["definitions"]
    for term in ("batch doubling", "log2 fit", "share faster", "rounded shares"):
        assert re.search(r"\w", definitions[term])
