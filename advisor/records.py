"""The advisor's tables: API keys, declared SLOs, recommendations, the append-only audit log, the outbox of
actions waiting to be published on Kafka, and capacity plans.

The schema is created by migration 0004 (`finetwin/migrations/versions/0004_advisor.py`; capacity plans by
0015; the cluster of a recommendation, an SLO set, a plan and an audit entry by 0018); these classes are how
the code reads and writes it. Timestamps are timezone-aware UTC.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, Column, Index, Text
from sqlmodel import Field, SQLModel

from twin.store import timestamp_field


class ApiKey(SQLModel, table=True):
    """An API key: only the SHA-256 of the secret is stored; `key_id` is the public part of the key."""

    __tablename__ = "api_keys"

    key_id: str = Field(primary_key=True, max_length=32)
    name: str = Field(max_length=200)
    role: str = Field(max_length=16)  # viewer | operator | approver
    key_hash: str = Field(max_length=64)  # hex SHA-256 of the whole key
    created_at: datetime = timestamp_field(nullable=False, default=None)
    revoked_at: datetime | None = timestamp_field(nullable=True, default=None)
    # The one cluster whose API takes the key (FINETWIN_CLUSTER_ID); None: every cluster's API.
    cluster_id: str | None = Field(default=None, max_length=200, nullable=True)
    # When the key stops working by itself; None: when it is revoked.
    expires_at: datetime | None = timestamp_field(nullable=True, default=None)


class SloDocument(SQLModel, table=True):
    """Each `PUT /v1/slos` adds a version; the newest one is in force (older ones stay as history)."""

    __tablename__ = "slo_sets"

    id: int | None = Field(default=None, primary_key=True)
    cluster_id: str = Field(max_length=200)  # the cluster they are of (migration 0018)
    created_at: datetime = timestamp_field(nullable=False, default=None)
    created_by: str = Field(max_length=200)
    document: dict = Field(sa_column=Column(JSON, nullable=False))


TARGET_MAX_LENGTH = 200  # what a recommendation acts on, as the store's column holds it


class Recommendation(SQLModel, table=True):
    """A proposed action with its predicted effect; a person decides what happens to it."""

    __tablename__ = "recommendations"
    __table_args__ = (
        Index("ix_recommendations_state_cluster", "state", "cluster_id"),
        Index("ix_recommendations_target", "target"),
    )

    id: str = Field(primary_key=True, max_length=36)
    cluster_id: str = Field(max_length=200)  # the cluster it acts on (migration 0018)
    kind: str = Field(max_length=32)  # add_nodes | remove_nodes | admission_repair | policy | ...
    target: str = Field(max_length=TARGET_MAX_LENGTH)  # what it acts on; a newer one for it supersedes
    title: str = Field(sa_column=Column(Text, nullable=False))
    action: dict = Field(sa_column=Column(JSON, nullable=False))  # the parameters the cluster applies
    effect: dict = Field(sa_column=Column(JSON, nullable=False))  # predicted effect with its interval
    cost: float  # GPU-hours per day it adds (>= a small floor so effect / cost stays finite)
    score: float  # effect per cost: the ranking key
    state: str = Field(max_length=16)  # pending | approved | rejected | expired | superseded
    source: str = Field(max_length=32)  # schedule | on-demand
    created_at: datetime = timestamp_field(nullable=False, default=None)
    expires_at: datetime = timestamp_field(nullable=False, default=None)
    decided_at: datetime | None = timestamp_field(nullable=True, default=None)
    decided_by: str | None = Field(default=None, max_length=200)
    comment: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    superseded_by: str | None = Field(default=None, max_length=36)


class AuditEntry(SQLModel, table=True):
    """One decision or state change. Append-only: database triggers refuse UPDATE and DELETE."""

    __tablename__ = "audit_log"
    __table_args__ = (
        Index("ix_audit_log_subject", "subject"),
        Index("ix_audit_log_cluster", "cluster_id"),  # each API counts its cluster's entries and the store's
    )

    id: int | None = Field(default=None, primary_key=True)
    # The cluster whose recommendation or SLOs it is about; None: the store's (an API key), or recorded
    # before entries said (migration 0018 adds no cluster to them: the log is never rewritten).
    cluster_id: str | None = Field(default=None, max_length=200)
    ts: datetime = timestamp_field(nullable=False, default=None)
    actor: str = Field(max_length=200)  # "key:<key id> (<name>)" or "system"
    subject: str = Field(max_length=200)  # "recommendation:<id>", "slos", "api_key:<id>"
    from_state: str | None = Field(default=None, max_length=16)
    to_state: str | None = Field(default=None, max_length=16)
    reason: str | None = Field(default=None, sa_column=Column(Text, nullable=True))


class CapacityPlanRecord(SQLModel, table=True):
    """A capacity plan (`POST /v1/plan`): its progress and, once done, its result, kept across restarts and
    read by every API process of the store (`advisor.plan_jobs`). A plan queued or running is the process's
    that took it (`owner`), which marks it alive (`updated_at`) while it lasts."""

    __tablename__ = "capacity_plans"
    __table_args__ = (Index("ix_capacity_plans_created_at", "created_at"),)

    id: str = Field(primary_key=True, max_length=36)
    cluster_id: str = Field(max_length=200)  # the cluster it plans (migration 0018)
    created_at: datetime = timestamp_field(nullable=False, default=None)
    updated_at: datetime = timestamp_field(nullable=False, default=None)
    status: str = Field(max_length=16)  # queued | running | done | failed
    done: int  # tasks finished
    total: int  # tasks in all
    owner: str = Field(max_length=200)  # the API process that runs it: host, process id, a random part
    result: dict | None = Field(default=None, sa_column=Column(JSON, nullable=True))  # `finetwin plan --json`
    error: str | None = Field(default=None, sa_column=Column(Text, nullable=True))


class OutboxMessage(SQLModel, table=True):
    """A message to publish, written in the same transaction as the state change it announces.

    `id` travels as the `finetwin-message-id` header: the dedupe key for consumers and for the relay's
    own recovery after a crash. `attempts` > 0 and `sent_at` unset means "maybe on the topic already".
    """

    __tablename__ = "outbox"
    __table_args__ = (Index("ix_outbox_sent_at", "sent_at"),)

    id: str = Field(primary_key=True, max_length=36)
    topic: str = Field(max_length=200)
    key: str = Field(max_length=200)
    payload: dict = Field(sa_column=Column(JSON, nullable=False))
    created_at: datetime = timestamp_field(nullable=False, default=None)
    attempts: int = 0
    sent_at: datetime | None = timestamp_field(nullable=True, default=None)
    partition: int | None = None
    offset: int | None = None
    last_error: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
