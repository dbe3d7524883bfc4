"""report.md: the four questions in the paper's order, each with its figure, its numbers and the
definition it uses. A section without data says so in words."""

from __future__ import annotations

from typing import Any

from calibrate.report.figures import short_gpu
from calibrate.report.figures.style import plural
from calibrate.report.markdown import NO_DATA, figure, fmt, summary_cells, table
from calibrate.report.render_batch import batch_section
from calibrate.report.render_inventory import inventory_section


def render(numbers: dict[str, Any], figures: dict[str, str | None]) -> str:
    meta = numbers["meta"]
    parts = [
        "# Characterization report: LLM fine-tuning runs",
        f"Source: `{meta['source']}` — {meta['rows']:,} experiments; generated {meta['generated_at']}.  \n"
        f"Throughput is `{meta['throughput_column']}` ({meta['units']['throughput']}), whole job. "
        "Every number below is also in `numbers.json`.",
        inventory_section(numbers),
        _q1(numbers, figures),
        _q2(numbers, figures),
        _q3(numbers, figures),
        _q4(numbers, figures),
        "## Definitions\n\n" + "\n".join(f"- **{k}**: {v}" for k, v in meta["definitions"].items()),
    ]
    return "\n\n".join(parts) + "\n"


def _table1_shares(row: dict[str, Any]) -> list[str]:
    """valid, rejected and runtime %, rounded by largest remainder so they add up to 100.0."""
    shares = row["pct_rounded"]
    if shares is None:
        return ["—", "—", "—"]
    return [f"{shares[k]:.1f}" for k in ("valid", "rejected", "runtime")]


def _q1(n: dict[str, Any], figures: dict[str, str | None]) -> str:
    o = n["outcomes"]
    if not o["experiments"]:
        return f"## Q1 — Will the job run?\n\n{NO_DATA}: the input holds no experiments._"
    rows = [
        [
            short_gpu(gpu),
            f"`{gpu}`",
            fmt(r["memory_gb"], 0, " GB"),
            f"{r['experiments']:,}",
            *_table1_shares(r),
            str(r["llms"]),
            "{}–{}".format(*r["gpus"]),
            "{}–{}".format(*r["nodes"]),
        ]
        for gpu, r in n["table1"].items()
    ]
    d = n["table1_dataset"]
    rows.append(
        [
            "**all**",
            "",
            "",
            f"{d['experiments']:,}",
            *_table1_shares(d),
            str(d["llms"]),
            "{}–{}".format(*d["gpus"]),
            "{}–{}".format(*d["nodes"]),
        ]
    )
    table1 = table(
        [
            "GPU type",
            "gpu_model",
            "memory",
            "experiments",
            "valid %",
            "rejected %",
            "runtime %",
            "LLMs",
            "GPUs",
            "nodes",
        ],
        rows,
    )
    rules = table(
        ["rule (checked in this order)", "rejected experiments"],
        [[k, f"{v:,}"] for k, v in n["rejections_by_rule"].items()],
    )
    batch = n["failure_by_batch_size"]
    batch_table = table(
        ["batch size", "runs", "valid", "rejected", "runtime", "failure %"],
        [
            [
                b,
                str(r["runs"]),
                str(r["valid"]),
                str(r["rejected"]),
                str(r["runtime"]),
                fmt(r["failure_pct"], 1),
            ]
            for b, r in batch.items()
        ],
    )
    others = []
    for key, title in (
        ("failure_by_tokens_per_sample", "tokens per sample"),
        ("failure_by_gpu_model", "GPU model"),
        ("failure_by_method", "method"),
    ):
        others.append(
            f"**{title}**: "
            + "; ".join(
                f"{short_gpu(k) if key == 'failure_by_gpu_model' else k}: {fmt(r['failure_pct'], 0)}% "
                f"({r['failing']:,} of {r['runs']:,}; rejected {fmt(r['rejected_pct'], 0)}%, "
                f"runtime {fmt(r['runtime_pct'], 0)}%)"
                for k, r in n[key].items()
            )
        )
    return "\n\n".join(
        [
            "## Q1 — Will the job run?",
            f"{o['no_valid_run']:,} of {o['experiments']:,} experiments ({fmt(o['no_valid_run_pct'], 1)}%) "
            f"yield no valid run: {o['rejected']:,} rejected before launch and {o['runtime']:,} failed at "
            "runtime; "
            f"{o['valid']:,} ran.",
            "### Table 1 — outcomes per GPU type (rows sum to 100.0 %: shares rounded by largest remainder)",
            table1,
            "### Rejections per admission rule",
            rules,
            "### Failure ratios per factor (Figure 2)",
            figure(
                figures,
                "failures",
                "Figure 2: failure ratio per factor; hatched = rejected before launch, "
                "solid = failed at runtime",
                "no experiments",
            ),
            batch_table,
            f"Batch sizes 16–64 pooled: {fmt(n['failure_pct_batch_16_to_64_pooled'], 1)} % fail.",
            "\n\n".join(others),
        ]
    )


def _q2(n: dict[str, Any], figures: dict[str, str | None]) -> str:
    single = n["throughput_single_gpu"]
    parts = ["## Q2 — How fast?", "### Throughput by batch size on one GPU (Figure 3)"]
    if single["valid_single_gpu_runs"]:
        parts.append(
            figure(
                figures,
                "single_gpu",
                "Figure 3: (a) median throughput by batch size, single-GPU valid runs (unmatched); "
                "(b) matched ratio per batch doubling",
                "",
            )
        )
        for gpu, e in single["by_gpu_model"].items():
            cells = ", ".join(
                f"{b}: {fmt(c['median'], 0)} (n={c['runs']})"
                for b, c in e["median_tokens_per_s_by_batch"].items()
            )
            parts.append(
                f"**{short_gpu(gpu)}** — median tokens/s by batch: {cells}. Gain batch 8 vs 1: "
                f"{fmt(e['gain_batch8_vs_1'], 2, '×')}; "
                f"batch 128 vs 8: {fmt(e['gain_batch128_vs_8'], 2, '×')}; "
                f"each doubling adds {fmt(e['tokens_per_s_added_per_batch_doubling'], 0)} tokens/s "
                "(least-squares on log2 batch); "
                f"largest batch that ran: {e['largest_batch_that_ran']}."
            )
        parts += batch_section(n)
    else:
        parts.append(f"{NO_DATA}: no valid single-GPU run._")
    grid = n["throughput_grid"]
    parts.append("### Throughput per batch × tokens per sample (Figure 4)")
    if grid["min_median"]:
        lo, hi = grid["min_median"], grid["max_median"]
        parts.append(
            figure(
                figures,
                "grid",
                "Figure 4: median throughput per (batch, tokens per sample) cell, all valid runs",
                "",
            )
        )
        parts.append(
            f"Lowest median {fmt(lo['median'], 0)} tokens/s at batch {lo['batch_size']}, "
            f"{lo['tokens_per_sample']} tokens (n={lo['valid_runs']}); "
            f"highest {fmt(hi['median'], 0)} tokens/s "
            f"at batch {hi['batch_size']}, {hi['tokens_per_sample']} tokens (n={hi['valid_runs']}, "
            f"on {', '.join(map(str, hi['gpus']))} GPUs)."
        )
    else:
        parts.append(f"{NO_DATA}: no valid run._")
    parts.append("### GPU types on matched pairs")
    comparisons = n["gpu_model_pairs"]["comparisons"]
    if comparisons:
        parts.append(
            table(
                [
                    "comparison (ratio = first / second)",
                    "pairs",
                    "median ratio",
                    "IQR (q25–q75)",
                    "IQR width",
                    "pairs slower",
                ],
                [[k, *summary_cells(s, "×"), str(s["slower_pairs"])] for k, s in comparisons.items()],
            )
        )
    else:
        parts.append(f"{NO_DATA}: no configuration ran on two GPU types._")
    return "\n\n".join(parts)


def _scaling_rows(block: dict[str, Any]) -> list[list[str]]:
    rows = []
    for doubling, e in block["per_doubling"].items():
        for campaign, value in e["by_campaign"].items():
            groups = [("n/a", value)] if e["placement"] == "intra-node" else list(value.items())
            for roce, s in groups:
                rows.append(
                    [
                        doubling,
                        e["placement"],
                        campaign,
                        roce,
                        *summary_cells(s),
                        fmt(s["gain_median"], 2, "×"),
                    ]
                )
    return rows


def _scaling_section(block: dict[str, Any], header: list[str]) -> list[str]:
    campaigns = block["campaigns"]
    left_out = (
        f"Left out: {block['pairs_left_out_memory_starved']} pair(s) whose smaller run peaked at "
        f"≥ {block['memory_starved_threshold_pct']:g} % GPU memory, "
        f"{block['pairs_left_out_no_memory_telemetry']} without memory telemetry, "
        f"{block['pairs_left_out_one_network_only']} across-node pair(s) run on one network only."
    )
    parts = []
    if campaigns:
        parts.append(
            "Campaigns (experiments that ran multi-node jobs with and without RoCE): "
            + "; ".join(f"**{c}**: {len(ids)} experiment_id(s)" for c, ids in campaigns.items())
            + ". "
            + left_out
        )
    else:
        parts.append(
            f"{NO_DATA} per campaign: no experiment ran multi-node jobs both with and without RoCE._"
        )
    rows = _scaling_rows(block)
    if rows:
        rng = block["intra_node_efficiency_range"]
        if rng:
            parts.append(
                f"Intra-node median efficiency per doubling and campaign: {fmt(rng[0])}–{fmt(rng[1])}."
            )
        if not any(e["placement"] == "across nodes" for e in block["per_doubling"].values()):
            parts.append(f"{NO_DATA} across nodes: no matched multi-node pair._")
        parts.append(table(header, rows))
    elif campaigns:
        parts.append(f"{NO_DATA}: no matched pair of runs at g and 2g GPUs in the campaigns._")
    everything = block["intra_node_all_experiments"]
    if everything:
        parts.append(
            "Intra-node, every experiment (not only the campaigns): "
            + "; ".join(
                f"{d}: {fmt(s['median'])} ({plural(s['pairs'], 'pair')})" for d, s in everything.items()
            )
            + "."
        )
    else:
        parts.append(
            f"{NO_DATA} intra-node over every experiment: no matched pair of runs at g and 2g GPUs._"
        )
    return parts


def _q3(n: dict[str, Any], figures: dict[str, str | None]) -> str:
    parts = ["## Q3 — Will it scale?", "### Throughput by GPU count (Figure 5)"]
    if n["throughput_by_gpu_count"]:
        parts.append(
            figure(
                figures,
                "scaling",
                "Figure 5: median throughput by GPU count per method (1 node = 8 GPUs)",
                "",
            )
        )
        one, eight = n["median_tokens_per_s_1_gpu_range"], n["median_tokens_per_s_8_gpu_range"]
        parts.append(
            "Median throughput across methods: "
            + (f"{fmt(one[0], 0)}–{fmt(one[1], 0)} tokens/s on 1 GPU" if one else "no 1-GPU run")
            + "; "
            + (f"{fmt(eight[0], 0)}–{fmt(eight[1], 0)} tokens/s on 8 GPUs." if eight else "no 8-GPU run.")
        )
    else:
        parts.append(f"{NO_DATA}: no valid run._")
    header = [
        "doubling",
        "placement",
        "campaign",
        "RoCE",
        "pairs",
        "median efficiency",
        "IQR (q25–q75)",
        "IQR width",
        "gain",
    ]
    for key, title in (
        ("weak_scaling", "Weak scaling (equal batch per GPU)"),
        ("strong_scaling", "Strong scaling (equal total batch)"),
    ):
        parts.append(f"### {title}")
        parts += _scaling_section(n[key], header)
    parts.append(
        figure(
            figures,
            "efficiency",
            "Figure 5b: scaling efficiency per doubling (median, middle 50 %, pairs)",
            "no scaling pair",
        )
    )
    lvf = n["lora_vs_full"]
    parts.append("### LoRA vs full fine-tuning, same job")
    parts.append(
        f"LoRA / full throughput over {plural(lvf['pairs'], 'pair')}: median {fmt(lvf['median'], 2, '×')} "
        f"(IQR {fmt(lvf['q25'])}–{fmt(lvf['q75'])})."
        if lvf["pairs"]
        else f"{NO_DATA}: no job ran with both methods._"
    )
    params = n["median_params_billion_above_8_gpus"]
    if params:
        parts.append(
            "Median model size of valid runs above 8 GPUs: "
            + ", ".join(f"{m} {fmt(v, 1)} B" for m, v in params.items())
            + "."
        )
    return "\n\n".join(parts)


def _q4(n: dict[str, Any], figures: dict[str, str | None]) -> str:
    rows = [
        [
            "RoCE",
            "all multi-node",
            *summary_cells(n["roce"]["all"], "×"),
            fmt(n["roce"]["all"]["gpu_hours_saved_pct"], 0, " %"),
        ]
    ]
    for campaign, s in n["roce"]["by_campaign"].items():
        rows.append(["RoCE", campaign, *summary_cells(s, "×"), fmt(s["gpu_hours_saved_pct"], 0, " %")])
    for campaign, by_nodes in n["roce"]["by_campaign_and_nodes"].items():
        for nodes, s in by_nodes.items():
            rows.append(
                [
                    "RoCE",
                    f"{campaign}, {nodes} nodes",
                    *summary_cells(s, "×"),
                    fmt(s["gpu_hours_saved_pct"], 0, " %"),
                ]
            )
    moe = n["fast_moe"]
    for ep, s in moe["by_expert_parallel_degree"].items():
        rows.append(
            [
                "fast MoE",
                f"EP {ep}, all methods",
                *summary_cells(s, "×"),
                fmt(s["gpu_hours_saved_pct"], 0, " %"),
            ]
        )
    for method, by_ep in moe["by_method_and_expert_parallel_degree"].items():
        for ep, s in by_ep.items():
            rows.append(
                [
                    "fast MoE",
                    f"{method}, EP {ep}",
                    *summary_cells(s, "×"),
                    fmt(s["gpu_hours_saved_pct"], 0, " %"),
                ]
            )
    fk = n["fast_kernels"]
    rows.append(
        ["fast kernels", "all pairs", *summary_cells(fk, "×"), fmt(fk["gpu_hours_saved_pct"], 0, " %")]
    )
    parts = [
        "## Q4 — How to go faster?",
        figure(
            figures,
            "speedups",
            "Figure 6: median speedup per optimization over matched pairs (whiskers: middle 50 %)",
            "no pair differs only in an optimization",
        ),
        table(
            [
                "optimization",
                "group",
                "pairs",
                "median speedup",
                "IQR (q25–q75)",
                "IQR width",
                "GPU-hours saved",
            ],
            rows,
        ),
    ]
    if not n["roce"]["all"]["pairs"]:
        parts.append(f"{NO_DATA} for RoCE: no multi-node job ran both with and without RoCE._")
    if not moe["by_expert_parallel_degree"]:
        parts.append(f"{NO_DATA} for fast MoE: no job ran both with and without it._")
    never = moe["degrees_without_valid_run"]
    if never:
        parts.append(
            "Expert-parallel degrees tried without a single valid run (so without a pair): "
            + ", ".join(f"EP {ep} ({k:,} experiment{'s' if k != 1 else ''})" for ep, k in never.items())
            + "."
        )
    parts += _roce_per_model(n["roce"]["per_model_4_nodes"])
    if fk["pairs"]:
        parts.append(
            f"Fast kernels: {fmt(100 * fk['share_faster'], 1)} % of the {fk['pairs']:,} pairs are faster "
            f"with them (median {fmt(fk['median'], 2, '×')}). "
            f"The pairs cover {len(fk['models'])} model(s) of up to "
            f"{fmt(fk['models_max_params_billion'], 1)} B parameters."
        )
    else:
        parts.append(f"{NO_DATA} for fast kernels: no job ran both with and without them._")
    return "\n\n".join(parts)


def _roce_per_model(per_campaign: dict[str, dict[str, Any]]) -> list[str]:
    """RoCE on 4 nodes per model: the campaign's median can hide models that gain beside ones that do not."""
    rows = [
        [campaign, model, *summary_cells(s, "×"), fmt(s["gpu_hours_saved_pct"], 0, " %")]
        for campaign, by_model in per_campaign.items()
        for model, s in by_model.items()
    ]
    if not rows:
        return []
    header = ["campaign", "model", "pairs", "median speedup", "IQR (q25–q75)", "IQR width", "GPU-hours saved"]
    return ["### RoCE on 4 nodes, per model", table(header, rows)]
