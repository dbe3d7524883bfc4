"""`finetwin keys create | list | revoke`: API keys."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Annotated, Literal

import typer

from finetwin import output
from finetwin.commands import add_command
from finetwin.commands.options import Json
from finetwin.errors import CommandError
from finetwin.settings import Settings

RoleName = Literal["viewer", "operator", "approver"]


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="create, list or revoke API keys", no_args_is_help=True)
    add_command(
        group, create, "create", help="create a key and print it (alone, once) on stdout", group="keys"
    )
    add_command(group, list_keys, "list", help="list keys (ids, names, roles; never the keys)", group="keys")
    add_command(group, revoke, "revoke", help="revoke a key by its id", group="keys")
    app.add_typer(group, name="keys")


def create(
    ctx: typer.Context,
    role: Annotated[RoleName, typer.Option(help="viewer < operator < approver")],
    name: Annotated[str | None, typer.Option(help="who or what uses it (shown in the audit log)")] = None,
    cluster: Annotated[
        str | None,
        typer.Option(
            help="the one cluster whose API takes it (its FINETWIN_CLUSTER_ID); default: every cluster's"
        ),
    ] = None,
    expires_in: Annotated[
        str | None,
        typer.Option(help="it stops working after this long (90d, 12h); default: when revoked"),
    ] = None,
) -> int:
    from advisor.auth import Role
    from advisor.keys import create_api_key, key_cluster_problem, key_name_problem
    from finetwin.wiring import migrated_engine
    from twin.units import parse_duration

    if name is not None and not name.strip():  # it became "viewer key" without a word
        raise CommandError("--name is empty: give who or what uses the key, or leave --name out")
    problem = key_name_problem(name) if name is not None else None
    if problem is not None:  # before the store is touched: PostgreSQL refused it with a traceback
        raise CommandError(f"--name {problem}")
    problem = key_cluster_problem(cluster) if cluster is not None else None
    if problem is not None:
        raise CommandError(f"--cluster {problem}")
    expires_at = None
    if expires_in is not None:
        try:
            expires_at = datetime.now(UTC) + timedelta(seconds=parse_duration(expires_in))
        except ValueError as exc:
            raise CommandError(f"--expires-in: {exc}") from None
        except OverflowError:  # past the year 9999
            raise CommandError(f"--expires-in: {expires_in!r} is too far ahead") from None
    engine = migrated_engine(ctx.obj)
    key = create_api_key(
        engine, Role(role), name=name or f"{role} key", actor="cli", cluster_id=cluster, expires_at=expires_at
    )
    print(key)
    return 0


def list_keys(ctx: typer.Context, as_json: Json = False) -> int:
    from sqlmodel import Session, col, select

    from advisor.records import ApiKey
    from finetwin.wiring import migrated_engine

    settings: Settings = ctx.obj
    engine = migrated_engine(settings)
    with Session(engine) as session:
        rows = list(session.exec(select(ApiKey).order_by(col(ApiKey.created_at))))
    if as_json:
        listed = [
            {"id": row.key_id, "role": row.role, "name": row.name, "cluster_id": row.cluster_id,
             "created_at": _iso(row.created_at),
             "expires_at": _iso(row.expires_at) if row.expires_at else None,
             "revoked_at": _iso(row.revoked_at) if row.revoked_at else None}
            for row in rows
        ]  # fmt: skip
        print(json.dumps(listed, indent=2))
        return 0
    output.show(output.table(
        ["id", "role", "cluster", "created", "expires", "revoked", "name"],
        [[row.key_id, row.role, row.cluster_id if row.cluster_id is not None else "(every)",
          f"{row.created_at:%Y-%m-%d %H:%M:%S}",
          row.expires_at.strftime("%Y-%m-%d %H:%M:%S") if row.expires_at else "-",
          row.revoked_at.strftime("%Y-%m-%d %H:%M:%S") if row.revoked_at else "-", row.name] for row in rows],
    ))  # fmt: skip
    return 0


def _iso(ts: datetime) -> str:
    return (ts if ts.tzinfo else ts.replace(tzinfo=UTC)).isoformat()  # SQLite: naive UTC


def revoke(
    ctx: typer.Context, key_id: Annotated[str, typer.Argument(help="the id shown by `finetwin keys list`")]
) -> int:
    from advisor.keys import revoke_api_key
    from finetwin.wiring import migrated_engine

    engine = migrated_engine(ctx.obj)
    if not revoke_api_key(engine, key_id, actor="cli"):
        raise CommandError(f"no active key with id {key_id!r} (see `finetwin keys list`)")
    output.say(f"revoked {key_id}")
    return 0
