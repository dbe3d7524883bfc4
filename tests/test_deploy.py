"""deploy/ without a Docker engine: what can be checked is that the files parse and say things that exist."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from finetwin.cli import command as finetwin_command
from finetwin.settings import Settings

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"


def _finetwin_commands() -> list[list[str]]:
    commands = []
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    for service in compose["services"].values():
        if str(service.get("image", "")).startswith("finetwin"):
            commands.append(service["command"])
    for document in yaml.safe_load_all((DEPLOY / "k8s" / "finetwin.yaml").read_text()):
        if document["kind"] in ("Deployment", "Job"):
            for container in document["spec"]["template"]["spec"]["containers"]:
                commands.append(container["args"])
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    cmd = re.search(r"^CMD (\[.*\])$", dockerfile, flags=re.M)
    assert cmd, "the Dockerfile has a default CMD"
    commands.append(yaml.safe_load(cmd.group(1)))
    return commands


def test_compose_has_kafka_kraft_postgres_ingest_and_api() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert {"kafka", "postgres", "ingest", "api"} <= set(services)
    assert "controller" in services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"]  # KRaft, no ZooKeeper
    assert services["ingest"]["command"][0] == "ingest"


@pytest.mark.parametrize("command", _finetwin_commands(), ids=shlex.join)
def test_every_service_runs_a_finetwin_command_that_exists(command: list[str]) -> None:
    # Resolve the command line as the console script would, down to the command that runs, and parse its
    # options (a usage error, so a failure, if a subcommand or a flag is unknown); nothing is invoked.
    words, found, name = list(command), finetwin_command(), "finetwin"
    while hasattr(found, "commands"):  # a group: descend to the subcommand named next
        name, words = words[0], words[1:]
        found = found.commands.get(name)
        assert found is not None, f"no command {name!r}"
    found.make_context(name, words)
    assert callable(found.callback)


def test_service_environment_names_real_settings() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    known = {f"FINETWIN_{name.upper()}" for name in Settings.model_fields}
    for service in compose["services"].values():
        if not str(service.get("image", "")).startswith("finetwin"):
            continue  # e.g. PostgreSQL's FINETWIN_*_PASSWORD, read by deploy/postgres/roles.sql
        for name in service.get("environment", {}) if isinstance(service.get("environment"), dict) else []:
            if name.startswith("FINETWIN_"):
                assert name in known, name


def test_dockerfile_copies_paths_that_exist() -> None:
    for line in (DEPLOY / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            sources = line.split()[1:-1]
            for source in sources:
                assert (REPO / source).exists(), source


def test_services_connect_as_the_role_that_owns_nothing() -> None:
    """Only `migrate` connects as the schema's owner (docs/advisor.md); roles.sql is what creates both."""
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    roles_sql = (DEPLOY / "postgres" / "roles.sql").read_text()
    assert "\\set owner finetwin_owner" in roles_sql and "\\set service finetwin_app" in roles_sql
    mounted = [v for v in compose["services"]["postgres"]["volumes"] if "roles.sql" in v]
    assert mounted and mounted[0].split(":")[1].startswith("/docker-entrypoint-initdb.d/")
    for name, service in compose["services"].items():
        if not str(service.get("image", "")).startswith("finetwin"):
            continue
        url = service["environment"]["FINETWIN_DATABASE_URL"]
        role = url.split("://", 1)[1].split(":", 1)[0]
        assert role == ("finetwin_owner" if name == "migrate" else "finetwin_app"), name
        if name != "migrate":
            assert service["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    roles, secret_of = {}, {}
    for document in yaml.safe_load_all((DEPLOY / "k8s" / "finetwin.yaml").read_text()):
        if document["kind"] == "Secret":
            url = document["stringData"]["FINETWIN_DATABASE_URL"]
            roles[document["metadata"]["name"]] = url.split("://", 1)[1].split(":", 1)[0]
        if document["kind"] in ("Deployment", "Job"):
            for container in document["spec"]["template"]["spec"]["containers"]:
                secret_of[container["args"][0]] = container["envFrom"][0]["secretRef"]["name"]
    assert {command: roles[secret] for command, secret in secret_of.items()} == {
        "migrate": "finetwin_owner", "ingest": "finetwin_app", "api": "finetwin_app",
    }  # fmt: skip


def test_the_serving_image_has_a_c_compiler() -> None:
    """The image's last stage (the one that runs) installs a C compiler: the trees run as machine code
    compiled where they run, and without one fall back to Treelite's interpreter (docs/advisor.md)."""
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    serving_stage = dockerfile.rsplit("\nFROM ", 1)[1]
    assert re.search(r"apt-get install[^\n]*(\\\n[^\n]*)*\bgcc\b", serving_stage), serving_stage


def test_the_image_installs_the_locked_versions() -> None:
    """The image installs finetwin with the lock the suite runs on (constraints.txt), not the newest releases
    of its dependencies on the day it is built."""
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    installs = [line for line in dockerfile.splitlines() if re.search(r"\bpip install\b", line)]
    assert installs, "the Dockerfile installs finetwin with pip"
    assert all("-c constraints.txt" in line for line in installs), installs
    assert re.search(r"^COPY [^\n]*\bconstraints\.txt\b", dockerfile, re.M), (
        "the lock is copied into the build"
    )


def _runs(command: list[str]) -> str:
    return command[0] if command else ""


def test_every_service_that_predicts_sees_the_models_in_use() -> None:
    """ingest predicts each submitted job with the models in FINETWIN_MODELS_DIR (the live error that
    triggers drift refits); only the API mounted them, so a deployed stack recorded no live error at all.
    In Kubernetes no volume was mounted anywhere: the API's models went with its pod."""
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    sources = set()
    for name in ("ingest", "api"):
        service = compose["services"][name]
        models = service["environment"]["FINETWIN_MODELS_DIR"]
        mounts = [volume.split(":") for volume in service.get("volumes", [])]
        holding = [source for source, target, *_ in mounts if models.startswith(target.rstrip("/") + "/")]
        assert holding, f"{name} does not mount {models}"
        sources.update(holding)
    assert len(sources) == 1 and sources <= set(compose["volumes"])  # one named volume, shared
    claims = set()
    for document in yaml.safe_load_all((DEPLOY / "k8s" / "finetwin.yaml").read_text()):
        if document["kind"] != "Deployment":
            continue
        pod = document["spec"]["template"]["spec"]
        volumes = {volume["name"]: volume for volume in pod.get("volumes", [])}
        for container in pod["containers"]:
            env = {item["name"]: item["value"] for item in container.get("env", [])}
            models = env.get("FINETWIN_MODELS_DIR")
            assert models, f"{document['metadata']['name']} names no FINETWIN_MODELS_DIR"
            mounted = [m["name"] for m in container.get("volumeMounts", []) if m["mountPath"] == models]
            assert mounted, f"{document['metadata']['name']} mounts nothing at {models}"
            claims.add(volumes[mounted[0]]["persistentVolumeClaim"]["claimName"])
    kinds = {
        d["metadata"]["name"]: d["kind"]
        for d in yaml.safe_load_all((DEPLOY / "k8s" / "finetwin.yaml").read_text())
    }
    assert len(claims) == 1 and kinds[claims.pop()] == "PersistentVolumeClaim"


def test_a_service_that_serves_no_api_has_a_health_check_of_its_own() -> None:
    """The image's HEALTHCHECK polls the API's /healthz: every ingest replica read `unhealthy` forever."""
    assert "/healthz" in (DEPLOY / "Dockerfile").read_text()
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    for name, service in compose["services"].items():
        if not str(service.get("image", "")).startswith("finetwin") or _runs(service["command"]) == "api":
            continue
        check = service.get("healthcheck")
        assert check is not None, f"{name} inherits the image's check of the API"
        assert check.get("disable") or "/healthz" not in " ".join(check["test"]), name
    ingest = compose["services"]["ingest"]
    port = ingest["command"][ingest["command"].index("--metrics-port") + 1]
    assert f":{port}/metrics" in " ".join(ingest["healthcheck"]["test"])
