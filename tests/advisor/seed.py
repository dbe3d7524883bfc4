"""A small overloaded cluster in the store (one 8-GPU A100 node, a queue of 8-GPU jobs), for steering and
the dashboard."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import Engine

from twin.db import session_scope
from twin.store import Job, Node, utcnow


def seed_overloaded_cluster(
    engine: Engine, jobs: int = 12, nodes: int = 1, cluster_id: str = "default"
) -> None:
    """Of `cluster_id`: the ids of a cluster other than `default` begin with its name (ids are unique
    across the store)."""
    now = utcnow()
    named = "" if cluster_id == "default" else f"{cluster_id}-"
    with session_scope(engine) as session:
        for n in range(nodes):
            session.add(
                Node(
                    node_id=f"{named}a100-{n}",
                    cluster_id=cluster_id,
                    gpu_model="NVIDIA-A100-SXM4-80GB",
                    gpu_count=8,
                    status="up",
                    updated_at=now,
                )
            )
        for i in range(jobs):
            running = i < nodes
            session.add(
                Job(
                    job_id=f"{named}job-{i:03d}", cluster_id=cluster_id,
                    state="running" if running else "submitted",
                    model_name="llama3-8b", method="lora", gpu_model="NVIDIA-A100-SXM4-80GB",
                    number_gpus=8, number_nodes=1, batch_size=128, tokens_per_sample=2048,
                    enable_roce=False, fast_moe=0, fast_kernels=False, dataset_tokens=3e8,
                    submitted_at=now - timedelta(minutes=30 - i),
                    started_at=now - timedelta(minutes=5) if running else None,
                    node_ids=[f"{named}a100-{i}"] if running else None, updated_at=now,
                )
            )  # fmt: skip
