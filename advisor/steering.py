"""Cluster steering toward the SLOs: generate candidate actions, evaluate each with a twin what-if
against ONE shared baseline (paired seeds: run i of every scenario shares run i's arrivals and per-job
draws with the baseline), and record those that improve SLO attainment as recommendations, ranked by
effect per cost.

Candidates (Table 3 of the paper, as actions on the cluster):
- provisioning: add one node of each GPU type; remove one where there are several;
- admission control: repair rule-breaking configurations instead of rejecting them (F1-F2);
- scheduling policy: each other policy the twin knows;
- optimization choice: make Fast Kernels / RoCE / Fast MoE the default (F5-F6);
- right-sizing: cap the batch per GPU, or the sequence length, on one GPU type (F1, F3);
- a stalled job (running, no progress reported for longer than the attention grace: `twin.job_health`)
  cancelled, its GPUs freed now. An overdue job is none: the forecast already ends it at its limit, so
  cancelling it changes nothing the twin can measure.

Effect: the paired difference, run by run, of the mean attainment over the declared SLOs (scenario minus
baseline): its mean, p10-p90 and 95 % confidence interval. Recorded when the interval is above zero.
Cost: GPU-hours per day the action adds (nodes); actions that add no hardware count a nominal floor, so
"effect per cost" ranks free improvements first and still orders them by effect.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

import numpy as np
from sqlalchemy import Engine

from advisor import workflow
from advisor.records import TARGET_MAX_LENGTH, Recommendation
from advisor.settings import AdvisorSettings
from advisor.slos_in_force import current_slos
from twin.db import session_scope
from twin.domain import GPU_TYPES, GPUS_PER_NODE, JobConfig, canonical_gpu_name, gpu_type
from twin.ensemble import EnsembleSpec, run_ensembles
from twin.executors import Executor, LocalExecutor
from twin.forecast import ForecastOptions, TwinInputs, make_spec
from twin.slo_attainment import SloSet

log = logging.getLogger(__name__)

COST_FLOOR_GPU_HOURS_PER_DAY = 1.0
BATCH_PER_GPU_CAPS = (8, 32)
SEQUENCE_CAP = 4096
MAX_CANDIDATES = 24
# Stalled jobs weighed per run, those holding the most GPUs first (the rest are on the dashboard's list).
MAX_CANCEL_CANDIDATES = 4


class SteeringUnavailable(RuntimeError):
    """Steering cannot run now (no calibrated models, no cluster in the store, bad SLO file...)."""


@dataclass(frozen=True)
class Candidate:
    kind: str
    target: str
    title: str
    action: dict[str, Any]
    cost: float  # GPU-hours per day added (negative: saved)
    changes: dict[str, Any] = field(default_factory=dict)  # twin.whatif.ScenarioChanges fields
    transform: Any = None  # (JobConfig) -> JobConfig applied to every configuration, or None


@dataclass
class SteeringResult:
    evaluated: int
    recommendations: list[Recommendation]
    notes: list[str]
    why_none: str | None = None  # when nothing was recommended: why, for the dashboard's panel


def _cap_batch(gpu_model: str, per_gpu: int):  # type: ignore[no-untyped-def]
    def transform(config: JobConfig) -> JobConfig:
        if config.gpu_model != gpu_model or config.batch_size <= per_gpu * config.number_gpus:
            return config
        return config.with_changes(batch_size=per_gpu * config.number_gpus)

    return transform


def _cap_sequence(gpu_model: str, tokens: int):  # type: ignore[no-untyped-def]
    def transform(config: JobConfig) -> JobConfig:
        if config.gpu_model != gpu_model or config.tokens_per_sample <= tokens:
            return config
        return config.with_changes(tokens_per_sample=tokens)

    return transform


def candidates(inputs: TwinInputs, options: ForecastOptions) -> list[Candidate]:
    from twin.config_changes import Admission, Optimization
    from twin.policies import Policy

    out: list[Candidate] = _cancel_candidates(inputs)  # first: what a person must act on is never cut
    by_type = inputs.cluster.gpus_by_model()
    nodes_by_type: dict[str, int] = {}
    for node in inputs.cluster.nodes:
        nodes_by_type[node.gpu_model] = nodes_by_type.get(node.gpu_model, 0) + 1
    day_gpu_hours = GPUS_PER_NODE * 24.0
    for gpu, count in sorted(nodes_by_type.items()):
        if canonical_gpu_name(gpu) not in GPU_TYPES:
            continue  # a type telemetry reported but the catalogue lacks: a what-if refuses to buy more of it
        short = _short(gpu)
        out.append(
            Candidate("add_nodes", f"nodes:{gpu}", f"add 1 {short} node", {"gpu_model": gpu, "add_nodes": 1},
                      day_gpu_hours, changes={"nodes": [{"gpu_model": gpu, "add": 1}]})
        )  # fmt: skip
        if count > 1:
            out.append(
                Candidate("remove_nodes", f"nodes:{gpu}", f"remove 1 {short} node",
                          {"gpu_model": gpu, "remove_nodes": 1}, -day_gpu_hours,
                          changes={"nodes": [{"gpu_model": gpu, "remove": 1}]})
            )  # fmt: skip
    if options.plan.admission != Admission.REPAIR:
        out.append(
            Candidate("admission_repair", "admission", "switch admission control to repair",
                      {"admission": "repair"}, 0.0, changes={"admission": "repair"})
        )  # fmt: skip
    for policy in Policy:
        if policy != options.policy:
            out.append(
                Candidate("policy", "policy", f"schedule with {policy.value}", {"policy": policy.value}, 0.0,
                          changes={"policy": policy.value})
            )  # fmt: skip
    for optimization in Optimization:
        if optimization not in options.plan.optimizations:
            out.append(
                Candidate("optimization_default", f"optimization:{optimization.value}",
                          f"make {optimization.value.replace('_', ' ')} the default",
                          {"optimization": optimization.value, "default": True}, 0.0,
                          changes={"optimizations": [optimization.value]})
            )  # fmt: skip
    configs = list(inputs.workload.catalog) + (list(inputs.arrivals.mix.catalog) if inputs.arrivals else [])
    for gpu in sorted(by_type):
        short = _short(gpu)
        for cap in BATCH_PER_GPU_CAPS:
            if any(c.gpu_model == gpu and c.batch_size > cap * c.number_gpus for c in configs):
                out.append(
                    Candidate("cap_batch", f"cap_batch:{gpu}", f"cap the batch at {cap} per GPU on {short}",
                              {"gpu_model": gpu, "max_batch_per_gpu": cap}, 0.0,
                              transform=_cap_batch(gpu, cap))
                )  # fmt: skip
        if any(c.gpu_model == gpu and c.tokens_per_sample > SEQUENCE_CAP for c in configs):
            out.append(
                Candidate("cap_sequence", f"cap_sequence:{gpu}",
                          f"cap the sequence length at {SEQUENCE_CAP} tokens on {short}",
                          {"gpu_model": gpu, "max_tokens_per_sample": SEQUENCE_CAP}, 0.0,
                          transform=_cap_sequence(gpu, SEQUENCE_CAP))
            )  # fmt: skip
    return out[:MAX_CANDIDATES]


def _cancel_candidates(inputs: TwinInputs) -> list[Candidate]:
    """Cancelling each stalled job: it may hang, holding its GPUs (the forecast holds them for the rest of
    its work), while the queue waits behind it."""
    gpus = dict(zip(inputs.workload.job_ids, inputs.workload.gpus.tolist(), strict=True))
    stalled = sorted(
        (job_id for job_id, said in inputs.attention.items() if said.kind == "stalled"),
        key=lambda job_id: (-gpus[job_id], job_id),
    )
    return [
        Candidate(
            "cancel_job",
            job_target(job_id),
            f"cancel stalled job {job_id}",
            {"job_id": job_id, "cancel": True, "gpus": gpus[job_id], "why": inputs.attention[job_id].why},
            0.0,
            changes={"cancel_jobs": [job_id]},
        )
        for job_id in stalled[:MAX_CANCEL_CANDIDATES]
    ]


def job_target(job_id: str) -> str:
    """A recommendation's target for one job: `job:ID`, within the 200 characters a target may have (a job
    id may have 200 itself: a longer one is named by its digest, still one target per job)."""
    target = f"job:{job_id}"
    if len(target) <= TARGET_MAX_LENGTH:
        return target
    return f"job:sha256:{hashlib.sha256(job_id.encode()).hexdigest()}"


def _short(gpu: str) -> str:
    try:
        return gpu_type(gpu).short
    except KeyError:
        return gpu


def _transformed(inputs: TwinInputs, transform: Any) -> TwinInputs:
    workload = replace(inputs.workload, catalog=[transform(c) for c in inputs.workload.catalog])
    arrivals = inputs.arrivals
    if arrivals is not None:
        arrivals = replace(
            arrivals, mix=replace(arrivals.mix, catalog=[transform(c) for c in arrivals.mix.catalog])
        )
    return replace(inputs, workload=workload, arrivals=arrivals)


def mean_attainment(outputs: list[Any]) -> list[float]:
    """Per run, the mean attainment over the SLOs that have data in that run."""
    out = []
    for o in outputs:
        values = [s["attainment"] for s in o.slos if not math.isnan(s["attainment"])]
        out.append(float(np.mean(values)) if values else math.nan)
    return out


def evaluate(
    inputs: TwinInputs, models: Any, options: ForecastOptions, slos: SloSet, found: list[Candidate],
    progress: Callable[[], object] | None = None, executor: Executor | None = None,
) -> list[tuple[Candidate, dict[str, Any]]]:  # fmt: skip
    """Each candidate's paired effect on mean SLO attainment, against one baseline ensemble. The ensembles
    are prepared here (the models asked about what each candidate changes) and run as one batch on
    `executor` (default: `options.workers` local processes, 1: in this thread); in the API those run niced
    and never hold its interpreter from the requests. `progress` is called after every run (an exception
    it raises stops the evaluation)."""
    from twin.whatif import compare, paired_difference

    baseline = make_spec(inputs, models, options, slos)
    specs = [baseline] + [scenario_spec(inputs, models, options, slos, c, baseline) for c in found]
    runner = executor if executor is not None else LocalExecutor(options.workers)
    base, *scenarios = run_ensembles(specs, options.runs, runner, progress)
    base_attainment = mean_attainment(base)
    results = []
    for candidate, scenario in zip(found, scenarios, strict=True):
        effect = paired_difference(base_attainment, mean_attainment(scenario))
        per_slo = compare(base, scenario, slos)["slos"]
        results.append((candidate, {"effect": effect, "per_slo": per_slo}))
    return results


def scenario_spec(
    inputs: TwinInputs, models: Any, options: ForecastOptions, slos: SloSet, candidate: Candidate,
    baseline: EnsembleSpec,
) -> EnsembleSpec:  # fmt: skip
    """The candidate's ensemble. The models are asked only about the configurations it changes (a cap, an
    optimization, a repair); the rest take the baseline's predictions, which asking again would give."""
    from twin.whatif import ScenarioChanges, apply_changes

    scenario_inputs = _transformed(inputs, candidate.transform) if candidate.transform else inputs
    changes = ScenarioChanges.model_validate(candidate.changes)
    scenario_inputs, scenario_options = apply_changes(scenario_inputs, options, changes)
    return make_spec(scenario_inputs, models, scenario_options, slos, known=baseline.catalog)


def proposals(evaluated: list[tuple[Candidate, dict[str, Any]]], runs: int) -> list[workflow.Proposal]:
    """Those whose 95 % interval of the attainment change lies above zero, best effect per cost first."""
    out = []
    for candidate, result in evaluated:
        effect = result["effect"]
        ci = effect.get("ci95")
        if effect.get("mean") is None or ci is None or ci[0] <= 0:
            continue
        cost_for_rank = max(candidate.cost, COST_FLOOR_GPU_HOURS_PER_DAY)
        out.append(
            workflow.Proposal(
                kind=candidate.kind,
                target=candidate.target,
                title=candidate.title,
                action=candidate.action,
                effect={
                    "metric": "mean SLO attainment (scenario - baseline, paired runs)",
                    "mean": effect["mean"],
                    "p10": effect["p10"],
                    "p90": effect["p90"],
                    "ci95": ci,
                    "runs": runs,
                    "per_slo": [
                        {
                            "name": s["name"],
                            "attainment": s["attainment"],
                            "probability_met": s["probability_met"],
                        }
                        for s in result["per_slo"]
                    ],
                    "cost_gpu_hours_per_day": candidate.cost,
                    "helps": helped_slo(result["per_slo"]),
                },
                cost=candidate.cost,
                score=effect["mean"] / cost_for_rank,
            )
        )
    # One per target (two batch caps on one GPU type would supersede each other): the best of each.
    best: dict[str, workflow.Proposal] = {}
    for proposal in sorted(out, key=lambda p: p.score, reverse=True):
        best.setdefault(proposal.target, proposal)
    return list(best.values())


def helped_slo(per_slo: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The SLO the action helps most: its name, the change of its attainment (share of intervals that meet
    it; mean and 95 % interval over paired runs) and of the probability that it is met over the horizon."""
    best = None
    for s in per_slo:
        change = s["attainment"]
        if change.get("mean") is None:
            continue
        if best is None or change["mean"] > best["attainment_change"]:
            best = {
                "slo": s["name"],
                "attainment_change": change["mean"],
                "ci95": change.get("ci95"),
                "probability_met_change": s["probability_met"],
            }
    return best if best is not None and best["attainment_change"] > 0 else None


def why_nothing(evaluated: list[tuple[Candidate, dict[str, Any]]]) -> str:
    """Why no candidate was recommended, in a sentence for the recommendations panel."""
    if not evaluated:
        return "no candidate action applies to this cluster and workload"
    scored = [(c, r["effect"]) for c, r in evaluated if r["effect"].get("mean") is not None]
    if not scored:
        return f"{len(evaluated)} candidates evaluated: no SLO has data in the forecast horizon yet"
    best, effect = max(scored, key=lambda item: item[1]["mean"])
    ci = effect.get("ci95") or [None, None]
    low = "?" if ci[0] is None else f"{100 * ci[0]:+.1f}"
    high = "?" if ci[1] is None else f"{100 * ci[1]:+.1f}"
    return (
        f"{len(evaluated)} candidates evaluated; none raises mean SLO attainment with 95 % confidence. "
        f"The best, {best.title}, moves it {100 * effect['mean']:+.1f} points ({low} to {high})"
    )


@dataclass(frozen=True)
class SteeringInputs:
    """What a steering run starts from: the SLOs in force, the models in use and the live state."""

    slos: SloSet
    models: Any
    inputs: TwinInputs


def prepare_steering(engine: Engine, settings: AdvisorSettings, models_in_use: Any) -> SteeringInputs:
    """The SLOs, the models in use (`get() -> (version, models) | None`) and the live state; raises
    `SteeringUnavailable` (why) when steering cannot run. Quick: a caller learns at once what stops a run."""
    from twin.live_state import NoClusterError, load_cluster_inputs
    from twin.slo_attainment import SloFormatError

    try:
        slos = current_slos(engine, settings).slos
    except SloFormatError as exc:
        raise SteeringUnavailable(str(exc)) from None
    if not slos.slos:
        raise SteeringUnavailable("no SLOs declared: PUT /v1/slos or set FINETWIN_SLO_FILE")
    models = _models(models_in_use)
    try:
        inputs = load_cluster_inputs(engine, settings)
    except NoClusterError as exc:
        raise SteeringUnavailable(str(exc)) from None
    return SteeringInputs(slos, models, inputs)


def run_steering(
    engine: Engine, settings: AdvisorSettings, models_in_use: Any, *, actor: str, source: str,
    progress: Callable[[], object] | None = None, prepared: SteeringInputs | None = None,
) -> SteeringResult:  # fmt: skip
    """Evaluate the candidates from `prepared` (else `prepare_steering`'s), record the helpful ones.
    `progress`: called after every ensemble run (it may raise to stop the run)."""
    began = time.perf_counter()
    start = prepared or prepare_steering(engine, settings, models_in_use)
    inputs, slos = start.inputs, start.slos
    options = baseline_options(settings)
    found = candidates(inputs, options)
    executor = LocalExecutor(options.workers)
    evaluated = evaluate(inputs, start.models, options, slos, found, progress, executor)
    chosen = proposals(evaluated, options.runs)
    with session_scope(engine) as session:
        recorded = workflow.propose(
            session,
            chosen,
            cluster_id=settings.cluster_id,
            actor=actor,
            source=source,
            ttl=timedelta(hours=settings.recommendation_ttl_hours),
        )
    where = "in the API's process" if executor.workers == 1 else "on worker processes"
    notes = list(inputs.notes) + [f"{len(found)} candidates in {time.perf_counter() - began:.1f} s {where}"]
    why = None if chosen else why_nothing(evaluated)
    return SteeringResult(evaluated=len(found), recommendations=recorded, notes=notes, why_none=why)


def baseline_options(settings: AdvisorSettings) -> ForecastOptions:
    """The cluster as it is run today (its policy and admission control), over the steering horizon."""
    from twin.config_changes import Admission
    from twin.plan import PlanOptions
    from twin.policies import Policy

    return ForecastOptions(
        horizon_s=settings.steering_horizon_hours * 3600.0,
        interval_s=settings.forecast_interval_minutes * 60.0,
        runs=settings.steering_replications,
        seed=settings.forecast_seed,
        policy=Policy(settings.forecast_policy),
        plan=PlanOptions(admission=Admission(settings.forecast_admission)),
        workers=settings.forecast_workers,
    )


def _models(models_in_use: Any) -> Any:
    from calibrate.registry import RegistryError

    try:
        loaded = models_in_use.get()
    except RegistryError as exc:
        raise SteeringUnavailable(f"the model in use cannot be loaded: {exc}") from None
    if loaded is None:
        raise SteeringUnavailable("no calibrated model is in use; run `finetwin calibrate` first")
    return loaded[1]
