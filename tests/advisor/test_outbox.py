"""The actions outbox against the real Tansu broker and a real PostgreSQL: each approved recommendation
lands on the topic exactly once (by message id), even when the relay is SIGKILLed mid-send."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlmodel import Session, select

from advisor import workflow
from advisor.outbox import MESSAGE_ID_HEADER, relay_lock
from advisor.records import OutboxMessage
from finetwin.schema import migrate
from finetwin.wiring import outbox_relay
from tests.advisor.conftest import FINETWIN
from tests.advisor.kafka_util import read_topic
from tests.conftest import unique
from twin.db import make_engine, session_scope

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def pg_engine(postgres_url: str):  # type: ignore[no-untyped-def]
    engine = make_engine(postgres_url)
    migrate(engine)
    yield engine
    engine.dispose()


def approve_some(engine: Engine, topic: str, n: int) -> list[str]:
    proposals = [
        workflow.Proposal(kind="policy", target=f"target-{i}", title=f"action {i}", action={"i": i})
        for i in range(n)
    ]
    with session_scope(engine) as session:
        recs = workflow.propose(
            session, proposals, cluster_id="default", actor="system", source="test", ttl=timedelta(hours=1)
        )
        ids = [r.id for r in recs]
    for rec_id in ids:
        with session_scope(engine) as session:
            workflow.approve(
                session, "default", rec_id, actor="key:t (tester)", comment=None, actions_topic=topic
            )
    return ids


def outbox_rows(engine: Engine) -> list[OutboxMessage]:
    with Session(engine) as session:
        return list(session.exec(select(OutboxMessage)))


def assert_exactly_once(bootstrap: str, topic: str, engine: Engine, rec_ids: list[str]) -> None:
    messages = read_topic(bootstrap, topic)
    by_id = Counter(m.headers[MESSAGE_ID_HEADER] for m in messages)
    rows = outbox_rows(engine)
    assert len(messages) == len(rec_ids), [m.headers for m in messages]
    assert by_id == Counter({row.id: 1 for row in rows})
    assert sorted(m.key for m in messages) == sorted(rec_ids)
    for m in messages:
        assert m.value["recommendation_id"] == m.key and m.value["message_id"] == m.headers[MESSAGE_ID_HEADER]
    assert all(row.sent_at is not None for row in rows)


def test_the_relay_publishes_each_approval_once(pg_engine: Engine, kafka_bootstrap: str) -> None:
    topic = unique("actions")
    rec_ids = approve_some(pg_engine, topic, 3)
    relay = outbox_relay(pg_engine, kafka_bootstrap)  # ingest's publisher, as the API and `relay` use
    try:
        assert relay.publish_pending() == 3
        assert relay.publish_pending() == 0  # nothing left: a second round sends nothing
    finally:
        relay.close()
    assert_exactly_once(kafka_bootstrap, topic, pg_engine, rec_ids)


@pytest.mark.slow
@pytest.mark.parametrize("point", ["before_send", "after_send"])
def test_a_relay_killed_mid_send_neither_loses_nor_duplicates(
    point: str, pg_engine: Engine, postgres_url: str, kafka_bootstrap: str
) -> None:
    topic = unique("actions")
    rec_ids = approve_some(pg_engine, topic, 3)
    crashed = subprocess.run(
        [sys.executable, "-m", "tests.advisor.relay_crash", postgres_url, kafka_bootstrap, point, "2"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    rows = {row.id: row for row in outbox_rows(pg_engine)}
    assert sum(row.sent_at is not None for row in rows.values()) == 1  # the first, before the crash
    in_doubt = [row for row in rows.values() if row.sent_at is None and row.attempts > 0]
    assert len(in_doubt) == 1
    on_topic = {m.headers[MESSAGE_ID_HEADER] for m in read_topic(kafka_bootstrap, topic)}
    assert (in_doubt[0].id in on_topic) == (point == "after_send")

    env = {**os.environ, "FINETWIN_DATABASE_URL": postgres_url}
    env.pop("FINETWIN_KAFKA_BOOTSTRAP", None)  # the broker named on the command line, as for ingest
    restarted = subprocess.run(
        [*FINETWIN, "relay", "--once", "--bootstrap", kafka_bootstrap],
        cwd=REPO, capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert restarted.returncode == 0, restarted.stderr
    assert_exactly_once(kafka_bootstrap, topic, pg_engine, rec_ids)


def test_one_relay_per_database(pg_engine: Engine, engine: Engine) -> None:
    for store in (pg_engine, engine):
        with relay_lock(store) as first:
            assert first
            with relay_lock(store) as second:
                assert not second
        with relay_lock(store) as again:
            assert again


def test_a_relay_without_a_kafka_says_how_to_name_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from finetwin.cli import main

    monkeypatch.delenv("FINETWIN_KAFKA_BOOTSTRAP", raising=False)
    monkeypatch.setenv("FINETWIN_DATA_DIR", str(tmp_path))
    assert main(["relay", "--once"]) == 2
    assert "pass --bootstrap HOST:PORT or set FINETWIN_KAFKA_BOOTSTRAP" in capsys.readouterr().err
