"""The cluster right now: nodes, GPUs by type, running and queued jobs, of the cluster the API serves
(FINETWIN_CLUSTER_ID): a store may hold the telemetry of several."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field
from sqlmodel import Session, func, select

from advisor.deps import get_session, get_settings
from advisor.settings import AdvisorSettings
from advisor.timestamps import UtcDatetime
from twin.clock import cluster_clock
from twin.cluster import cluster_from_inventory
from twin.domain import canonical_gpu_name
from twin.job_health import ATTENTION_KINDS, attention_counts, attention_grace
from twin.store import Job, Node

router = APIRouter(prefix="/v1/cluster", tags=["cluster"])


class NodeOut(BaseModel):
    node_id: str
    gpu_model: str
    gpu_count: int
    status: str
    updated_at: UtcDatetime | None  # None: stored out of the range a time can be read in (twin.db)


class GpuPool(BaseModel):
    gpu_model: str
    nodes_up: int  # as the twin counts them: a node reporting more GPUs than a node holds is not one
    gpus_up: int
    gpus_busy: int
    nodes_draining: int = 0  # running their jobs to the end, taking no new one (not in `gpus_up`)


class ClusterOut(BaseModel):
    cluster_id: str = Field(description="the cluster this API serves (FINETWIN_CLUSTER_ID)")
    nodes: list[NodeOut]
    pools: list[GpuPool]
    jobs_by_state: dict[str, int]
    running: int
    queued: int
    attention: dict[str, int] = Field(
        description="running jobs that need attention, by kind (overdue, stalled; twin.job_health)"
    )


@router.get("", response_model=ClusterOut, summary="Nodes, GPU pools and job counts")
def cluster(
    session: Session = Depends(get_session), settings: AdvisorSettings = Depends(get_settings)
) -> ClusterOut:
    cluster_id = settings.cluster_id
    nodes = list(session.exec(select(Node).where(Node.cluster_id == cluster_id).order_by(Node.node_id)))
    by_state = jobs_by_state(session, cluster_id)
    running = by_state.get("running", 0)
    busy = dict(
        session.exec(
            select(Job.gpu_model, func.coalesce(func.sum(Job.number_gpus), 0))
            .where(Job.cluster_id == cluster_id, Job.state == "running")
            .group_by(Job.gpu_model)
        ).all()
    )
    # A pool is a GPU type, whatever each node and job called it (`NVIDIA A100-SXM4-80GB`, `A100-SXM`), as
    # the twin pools them.
    pools: dict[str, GpuPool] = {}

    def pool_of(gpu_model: str) -> GpuPool:
        name = canonical_gpu_name(gpu_model)
        return pools.setdefault(name, GpuPool(gpu_model=name, nodes_up=0, gpus_up=0, gpus_busy=0))

    for node in nodes:
        pool_of(node.gpu_model)  # every type a node reports has a pool, whatever its nodes' state
    # The nodes that serve, as the twin reads them (twin.cluster): one reporting more GPUs than a node holds
    # (stored before telemetry bounded it) is not one; a draining node's GPUs serve no new job.
    for spec in cluster_from_inventory((n.node_id, n.gpu_model, n.gpu_count, n.status) for n in nodes).nodes:
        pool = pool_of(spec.gpu_model)
        if spec.draining:
            pool.nodes_draining += 1
        else:
            pool.nodes_up += 1
            pool.gpus_up += spec.gpus
    for gpu, count in busy.items():
        if gpu is not None:
            pool_of(gpu).gpus_busy += int(count)
    return ClusterOut(
        cluster_id=cluster_id,
        nodes=[NodeOut.model_validate(n, from_attributes=True) for n in nodes],
        pools=sorted(pools.values(), key=lambda p: p.gpu_model),
        jobs_by_state=by_state,
        running=running,
        queued=by_state.get("submitted", 0),
        attention=_attention(session, settings, running=running),
    )


def jobs_by_state(session: Session, cluster_id: str) -> dict[str, int]:
    """How many of the cluster's jobs the store holds in each state (those it has: no zeros)."""
    query = select(Job.state, func.count()).where(Job.cluster_id == cluster_id).group_by(Job.state)
    return {str(state): int(count) for state, count in session.exec(query)}


def _attention(session: Session, settings: AdvisorSettings, running: int) -> dict[str, int]:
    if not running:  # no clock to read, no job to judge
        return dict.fromkeys(ATTENTION_KINDS, 0)
    now = cluster_clock(session.get_bind(), settings).now  # type: ignore[arg-type]
    return attention_counts(session, settings.cluster_id, now, attention_grace(settings))
