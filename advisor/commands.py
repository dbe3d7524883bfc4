"""`finetwin api` (serve the HTTP API and dashboard), `finetwin keys` (API keys), `finetwin advise`
(advice for one job configuration) and `finetwin relay` (publish approved actions from the outbox)."""

from __future__ import annotations

import argparse
from pathlib import Path

from twin.settings import Settings

ROLES = ("viewer", "operator", "approver")


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    api = subparsers.add_parser("api", help="serve the HTTP API and dashboard")
    api.add_argument("--host", default=None, help="address to bind (default FINETWIN_API_HOST or 127.0.0.1)")
    api.add_argument("--port", type=int, default=None, help="port (default FINETWIN_API_PORT or 8080)")
    api.add_argument(
        "--access-log",
        action="store_true",
        help="log every request (off by default: it costs ~15%% of the requests per second)",
    )
    api.set_defaults(handler=run_api)

    keys = subparsers.add_parser("keys", help="create, list or revoke API keys")
    keys_sub = keys.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    create = keys_sub.add_parser("create", help="create a key and print it (alone, once) on stdout")
    create.add_argument("--role", required=True, choices=ROLES, help="viewer < operator < approver")
    create.add_argument("--name", default=None, help="who or what uses it (shown in the audit log)")
    create.set_defaults(handler=run_keys_create)
    listing = keys_sub.add_parser("list", help="list keys (ids, names, roles; never the keys)")
    listing.set_defaults(handler=run_keys_list)
    revoke = keys_sub.add_parser("revoke", help="revoke a key by its id")
    revoke.add_argument("key_id", help="the id shown by `finetwin keys list`")
    revoke.set_defaults(handler=run_keys_revoke)

    advise = subparsers.add_parser("advise", help="advice for one job configuration (JSON or YAML file)")
    advise.add_argument("config", type=Path, help="JSON or YAML file with one configuration ('-' = stdin)")
    advise.add_argument("--json", action="store_true", help="print the whole answer as JSON")
    advise.set_defaults(handler=run_advise)

    relay = subparsers.add_parser("relay", help="publish approved actions from the outbox to Kafka")
    relay.add_argument("--once", action="store_true", help="one round, then exit")
    relay.set_defaults(handler=run_relay)


def run_api(args: argparse.Namespace, settings: Settings) -> int:
    import uvicorn

    from advisor.app import create_app

    app = create_app(settings)
    uvicorn.run(
        app,
        host=args.host or settings.api_host,
        port=args.port or settings.api_port,
        log_level="info",
        access_log=False,
    )
    return 0


def _migrated_engine(settings: Settings):  # type: ignore[no-untyped-def]
    from twin.db import engine_from_settings, migrate

    engine = engine_from_settings(settings)
    migrate(engine)
    return engine


def run_keys_create(args: argparse.Namespace, settings: Settings) -> int:
    from advisor.auth import Role
    from advisor.keys import create_api_key

    engine = _migrated_engine(settings)
    key = create_api_key(engine, Role(args.role), name=args.name or f"{args.role} key", actor="cli")
    print(key)
    return 0


def run_keys_list(args: argparse.Namespace, settings: Settings) -> int:
    from sqlmodel import Session, col, select

    from advisor.records import ApiKey

    engine = _migrated_engine(settings)
    with Session(engine) as session:
        rows = list(session.exec(select(ApiKey).order_by(col(ApiKey.created_at))))
    print(f"{'id':<14}{'role':<10}{'created':<22}{'revoked':<22}name")
    for row in rows:
        revoked = row.revoked_at.strftime("%Y-%m-%d %H:%M:%S") if row.revoked_at else "-"
        print(f"{row.key_id:<14}{row.role:<10}{row.created_at:%Y-%m-%d %H:%M:%S}   {revoked:<22}{row.name}")
    return 0


def run_keys_revoke(args: argparse.Namespace, settings: Settings) -> int:
    from advisor.keys import revoke_api_key
    from twin.cli import CommandError

    engine = _migrated_engine(settings)
    if not revoke_api_key(engine, args.key_id, actor="cli"):
        raise CommandError(f"no active key with id {args.key_id!r} (see `finetwin keys list`)")
    print(f"revoked {args.key_id}")
    return 0


def run_advise(args: argparse.Namespace, settings: Settings) -> int:
    import json
    import sys

    from advisor.advice import advise_job
    from advisor.advice_plan import AdviceError
    from advisor.advice_predict import ModelsUnusable
    from advisor.advice_schemas import AdviceRequest
    from advisor.advice_text import render_text
    from advisor.config_file import ConfigFileError, read_config_file
    from twin.cli import CommandError

    try:
        raw = read_config_file(args.config)
    except ConfigFileError as exc:
        raise CommandError(str(exc)) from exc
    try:
        request = AdviceRequest.model_validate(raw)
    except ValueError as exc:
        raise CommandError(f"{args.config}: {_first_error(exc)}") from exc
    from calibrate.registry import ModelRegistry, RegistryError

    try:
        loaded = ModelRegistry(settings.resolved_models_dir()).load_in_use()
    except RegistryError as exc:
        raise CommandError(f"the model in use cannot be loaded: {exc}") from exc
    if loaded is None:
        raise CommandError("no calibrated models yet: run `finetwin calibrate` first")
    version, models = loaded
    config, dataset_tokens = request.to_job()
    try:
        answer = advise_job(config, dataset_tokens, models, model_version=version)
    except AdviceError as exc:
        raise CommandError(f"{args.config}: {exc}") from exc
    except ModelsUnusable as exc:
        raise CommandError(f"{exc}; run `finetwin calibrate`") from exc
    if args.json:
        json.dump(answer.model_dump(mode="json"), sys.stdout, indent=2)
        print()
    else:
        print(render_text(answer))
    return 0


def _first_error(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        return f"{where}: {first.get('msg', '')}" if where else str(first.get("msg", ""))
    return str(exc)


def run_relay(args: argparse.Namespace, settings: Settings) -> int:
    import logging
    import time

    from advisor.outbox import OutboxRelay, relay_lock
    from twin.cli import CommandError

    if not settings.kafka_bootstrap:
        raise CommandError("set FINETWIN_KAFKA_BOOTSTRAP to the Kafka cluster that carries finetwin.actions")
    engine = _migrated_engine(settings)
    relay = OutboxRelay(engine, settings.kafka_bootstrap)
    log = logging.getLogger("finetwin.relay")
    try:
        while True:
            with relay_lock(engine) as held:
                if held:
                    sent = relay.publish_pending()
                    if sent:
                        log.info("published %d action(s)", sent)
                elif args.once:
                    raise CommandError("another relay holds the outbox lock")
            if args.once:
                return 0
            time.sleep(settings.relay_poll_seconds)  # polling the outbox table: there is no event to await
    finally:
        relay.close()
