"""How `forecast`, `simulate`, `whatif` and `backtest` print their documents: JSON as is, or tables."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from finetwin import output
from finetwin.numbers import finite, human, label, pct, signed
from twin.units import duration_text


def emit(document: dict[str, Any], as_json: bool, printer: Callable[[dict[str, Any]], None]) -> None:
    if as_json:
        json.dump(document, sys.stdout, default=_json_default, allow_nan=False)
        sys.stdout.write("\n")
    else:
        printer(document)


def _json_default(value: Any) -> Any:
    import numpy as np

    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def print_forecast(doc: dict[str, Any]) -> None:
    horizon = doc.get("horizon_s")
    output.say(
        f"{doc['runs']} run(s), horizon {'until done' if horizon is None else duration_text(horizon)}, "
        f"policy {doc['policy']}, admission {doc['admission']}, models: {doc['models']}"
    )
    for note in doc.get("notes", []):
        output.say(f"note: {note}")
    rows = [(k, k, v) for k, v in doc["summary"].items() if k != "utilization_by_type"]
    rows += [
        (f"utilization {gpu}", "utilization", v)
        for gpu, v in doc["summary"].get("utilization_by_type", {}).items()
    ]
    output.show(output.table(
        ["figure", ("mean", "right"), ("p10", "right"), ("p90", "right")],
        [[label(name), *(human(unit, v[k]) for k in ("mean", "p10", "p90"))] for name, unit, v in rows],
    ))  # fmt: skip
    skewed = [label(name) for name, _, v in rows if _outside(v["mean"], v["p10"], v["p90"])]
    if skewed:
        output.say(
            f"note: the mean of {', '.join(skewed)} lies outside its p10-p90: the runs are skewed (a few "
            "runs far from the rest pull the mean; p10-p90 is the interval that holds one more run 80 % of "
            "the time, from the runs' order statistics)"
        )
    for slo in doc.get("slos", []):
        a = slo["attainment"]
        output.say(
            f"SLO {slo['name']}: attained in {human('attainment', a['mean'])} of intervals "
            f"(p10 {human('attainment', a['p10'])}, p90 {human('attainment', a['p90'])}), met over the "
            f"horizon in {human('probability_met', slo['probability_met'])} of runs"
        )


def _outside(mean: Any, low: Any, high: Any) -> bool:
    return all(finite(v) for v in (mean, low, high)) and not low - 1e-9 <= mean <= high + 1e-9


def print_whatif(doc: dict[str, Any]) -> None:
    output.say(f"what-if {doc['name']!r}: {json.dumps(doc['changes'])}")
    for note in doc.get("notes", []):
        output.say(f"note: {note}")
    rows = []
    for name, diff in doc["difference"].items():
        if name == "slos":
            continue
        base = doc["baseline"]["summary"][name]["mean"]
        scen = doc["scenario"]["summary"][name]["mean"]
        ci = diff.get("ci95") or [None, None]
        rows.append([
            label(name), human(name, base), human(name, scen), signed(name, diff["mean"]),
            f"[{signed(name, ci[0])}, {signed(name, ci[1])}]",
        ])  # fmt: skip
    columns = ["figure", ("baseline", "right"), ("scenario", "right"), ("difference", "right"), "95% CI"]
    output.show(output.table(columns, rows))
    for slo in doc["difference"]["slos"]:
        a = slo["attainment"]
        ci = a.get("ci95") or [None, None]
        output.say(
            f"SLO {slo['name']}: attainment {_points(a['mean'])} "
            f"(95% CI {_points(ci[0])} to {_points(ci[1])}), "
            f"chance it is met {_points(slo['probability_met'])}"
        )


def _points(change: Any) -> str:
    """A change of a share in percentage points."""
    return f"{100 * change:+.1f} pts" if finite(change) else "-"


def print_backtest(doc: dict[str, Any]) -> None:
    output.say(
        f"backtest: {doc['jobs_in_window']} of {doc['jobs_in_benchmark']} jobs in the window, "
        f"{doc['runs']} run(s), policy {doc['policy']}, models: {doc['models']}"
    )
    _print_figures(doc)


def print_store_backtest(doc: dict[str, Any]) -> None:
    output.say(
        f"backtest from the store at {doc['at']} over {doc['horizon_s']:g} s: {doc['jobs_in_window']} jobs, "
        f"{doc['runs']} run(s), arrivals {doc['arrivals']}, models: {doc['models']}"
    )
    _print_figures(doc)


def print_policy_fit(doc: dict[str, Any]) -> None:
    output.say(
        f"scheduling on record from {doc['at']} over {doc['horizon_s']:g} s: {doc['jobs']} jobs "
        f"({doc['started_on_record']} started), each policy run on their recorded run times; estimates from "
        f"{doc['models']}"
    )
    rows = []
    for name, fit in doc["policies"].items():
        mark = " (best)" if name == doc["best"] else ""  # none where the record does not tell them apart
        start_mae, start_bias = fit["start_mae_s"], fit["start_bias_s"]
        rows.append([
            name + mark, "-" if start_mae is None else human("wait_mean_s", start_mae),
            _or_dash(start_bias, "+,.0f", " s"), f"{fit['queue_mae']:.1f}",
            f"{fit['queue_bias']:+.1f}", str(fit["jobs_compared"]),
        ])  # fmt: skip
    columns = ["policy", ("start error", "right"), ("its bias", "right"), ("queue MAE", "right"),
               ("queue bias", "right"), ("jobs", "right")]  # fmt: skip
    output.show(output.table(columns, rows))
    in_use, best = doc.get("in_use"), doc["best"]
    if best is None:
        tied = doc.get("tied") or []
        output.say(
            f"the record does not tell {', '.join(tied)} apart: their starts match it alike (jobs hardly "
            "queued); a busier window can" if tied
            else "no job started in the window: nothing tells the policies apart; try a longer one"
        )  # fmt: skip
        return
    setting = "FINETWIN_FORECAST_POLICY"
    advice = (
        f"{setting} says so already" if in_use == best
        else f"{setting} says {in_use}: set {setting}={best} to forecast as it schedules"
    )  # fmt: skip
    output.say(f"the record schedules most like {best}; {advice}")


def _print_figures(doc: dict[str, Any]) -> None:
    rows = []
    # The store's backtest also says what persistence (the window before, again) would have forecast.
    baseline = any("persistence" in f for f in doc["figures"].values())
    for name, f in doc["figures"].items():
        t = f["twin"]
        row = [name, human(name, f["truth"]), *(human(name, t[k]) for k in ("mean", "p10", "p90")),
               _signed(f["error"])]  # fmt: skip
        if baseline:
            previous = f.get("persistence") or {}
            value = previous.get("value")
            row += ["-" if value is None else human(name, value), _signed(previous.get("error"))]
        rows.append(row)
    columns = ["figure", ("truth", "right"), ("twin mean", "right"), ("p10", "right"), ("p90", "right"),
               ("error", "right")]  # fmt: skip
    if baseline:
        columns += [("persistence", "right"), ("its error", "right")]
    output.show(output.table(columns, rows))
    if baseline:
        output.say("persistence: the window before T, [T - H, T], measured the same way, forecast to repeat")


def _or_dash(value: float | None, spec: str, unit: str = "") -> str:
    """A figure formatted by `spec` (and `unit`), or "-" where there is none."""
    return "-" if value is None else f"{value:{spec}}{unit}"


def _signed(error: float | None) -> str:
    return _or_dash(error, "+.1%")


def print_skill(doc: dict[str, Any], store: str = "the store", cluster_id: str = "default") -> None:
    if not doc["scored"]:
        if doc.get("since"):  # the window may be what is empty, not the record
            output.say(f"no interval of cluster {cluster_id!r} scored since {doc['since']} in {store}")
            return
        output.say(
            f"no forecast of cluster {cluster_id!r} scored yet in {store}: the standing forecast is made by "
            "`finetwin api` (and `up`) and scored as telemetry time passes its intervals"
        )
        return
    output.say(f"{doc['scored']} forecasts scored over {doc['intervals']} interval figures")
    rows = []
    for figure, stats in doc["figures"].items():
        raw = stats.get("raw_coverage")
        own = "-" if raw is None else f"{100 * raw:.0f} %"
        baseline, score = stats.get("persistence_mae"), stats.get("skill_score")
        rows.append([figure, stats["n"], pct(stats.get("wape")), pct(stats["mape"]),
                     f"{stats['mae']:.3g}", f"{stats['bias']:.3g}", f"{100 * stats['coverage']:.0f} %",
                     own, _or_dash(baseline, ".3g"), _or_dash(score, "+.2f")])  # fmt: skip
    columns = ["figure", ("n", "right"), ("WAPE", "right"), ("MAPE", "right"), ("MAE", "right"),
               ("bias", "right"), ("p10-p90 coverage", "right"),
               ("ensemble's own band", "right"), ("persistence MAE", "right"),
               ("skill vs persistence", "right")]  # fmt: skip
    output.show(output.table(columns, rows))
    # A queue of 1 forecast as 3 is a 200 % error: MAPE runs into the thousands where actuals are near 0.
    output.say(
        "WAPE: the intervals' absolute errors summed over their actuals summed; MAPE: each interval's "
        "relative error averaged (intervals whose actual is 0 left out), large where actuals are small; "
        "persistence: the interval before each forecast, forecast to go on; skill vs persistence: "
        "1 - MAE(twin) / MAE(persistence), above 0 the twin is better (+0.30: 30 % less error)"
    )
    if doc.get("slos"):
        print_slo_skill(doc["slos"])


def print_slo_skill(slos: dict[str, dict[str, Any]]) -> None:
    """Each SLO's forecasts (per interval, the share of runs in which it held) against whether it held."""
    rows = []
    for name, stats in slos.items():
        baseline, score = stats.get("persistence_brier"), stats.get("brier_skill")
        rows.append([name, stats["n"], pct(stats["forecast_share"]), pct(stats["held_share"]),
                     f"{stats['brier']:.3f}", f"{stats['climatology_brier']:.3f}",
                     _or_dash(baseline, ".3f"), _or_dash(score, "+.2f")])  # fmt: skip
    columns = ["SLO", ("n", "right"), ("forecast to hold", "right"), ("held", "right"), ("Brier", "right"),
               ("always the share held", "right"), ("persistence Brier", "right"),
               ("skill vs persistence", "right")]  # fmt: skip
    output.show(output.table(columns, rows))
    output.say(
        "per interval each forecast says in what share of its runs the SLO held: read as the chance it "
        "holds, against whether it did on the record. Brier: the mean squared difference (0 is perfect; "
        "always 50 % scores 0.25); always the share held: the Brier of saying, every interval, the share it "
        "held in (known only in hindsight); skill vs persistence: 1 - Brier(twin) / Brier(persistence), "
        "above 0 the twin is better"
    )


def print_slos_record(record: dict[str, Any]) -> None:
    """Each SLO in force as the record has it: in how many of the intervals with data it held."""
    hours = (record["until"] - record["since"]).total_seconds() / 3600.0
    parts = []
    for slo in record["slos"]:
        if not slo["judged"]:
            parts.append(f"{slo['name']}: no data")
            continue
        met = sum(1 for held in slo["held"] if held)
        share = f"{100 * slo['attainment']:.0f} %"
        parts.append(f"{slo['name']}: met in {met} of {slo['judged']} intervals ({share})")
    said = "; ".join(parts) if parts else "no SLO declared"
    output.say(f"SLOs as they happened, the last {hours:,.0f} h of telemetry: {said}")
