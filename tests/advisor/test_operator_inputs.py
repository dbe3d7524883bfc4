"""Inputs through the API and `finetwin advise`: a misspelled GPU in a what-if is a 422 naming the closest
known type; an advise file with a misspelled key names it and the key it resembles."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine
from sqlmodel import select

from finetwin.cli import main


def test_whatif_with_a_misspelled_gpu_is_a_422_with_a_suggestion(
    client: TestClient, keys: dict[str, dict[str, str]]
) -> None:
    body = {"runs": 2, "changes": {"nodes": [{"gpu_model": "A100-SXM4", "add": 1}]}}
    response = client.post("/v1/whatif", json=body, headers=keys["operator"])
    assert response.status_code == 422, response.text
    assert "unknown GPU model 'A100-SXM4'" in response.text and "did you mean" in response.text
    assert "Value error" not in response.text, response.text


def test_whatif_cancelling_a_job_that_is_not_known_is_a_422_naming_it(
    client: TestClient, keys: dict[str, dict[str, str]], engine: Engine
) -> None:
    from tests.advisor.seed import seed_overloaded_cluster

    seed_overloaded_cluster(engine)  # job-000 running, job-001.. queued
    body = {"runs": 2, "horizon": "2h", "changes": {"cancel_jobs": ["job-000", "no-such-job"]}}
    refused = client.post("/v1/whatif", json=body, headers=keys["operator"])
    assert refused.status_code == 422, refused.text
    assert "cancel_jobs: 'no-such-job' not among the known jobs" in refused.json()["detail"], refused.text
    body["changes"] = {"cancel_jobs": ["job-000"]}
    answered = client.post("/v1/whatif", json=body, headers=keys["operator"])
    assert answered.status_code == 200, answered.text
    known = answered.json()["baseline"]["known_jobs"], answered.json()["scenario"]["known_jobs"]
    assert (known[0]["running"], known[1]["running"]) == (1, 0) and known[1]["total"] == known[0]["total"] - 1


def test_advise_with_a_misspelled_gpu_suggests_the_known_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "job.yaml"
    config.write_text(
        "model_name: llama3-8b\nmethod: lora\ngpu_model: H100-PCI\nnumber_gpus: 2\n"
        "batch_size: 8\ntokens_per_sample: 2048\n"
    )
    assert main(["advise", str(config)]) == 2
    error = capsys.readouterr().err
    assert "did you mean 'NVIDIA-H100-PCIe'" in error, error
    # The validator's sentence, without pydantic's "Value error, " before it.
    assert "gpu_model: unknown GPU model 'H100-PCI'" in error, error


def test_advise_reads_stdin_as_it_reads_a_file(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`finetwin advise -`: a byte-order mark is not text (else the first key is '\\ufeffmodel_name'), and a
    line that is not UTF-8 is named as a file's is."""
    import io
    import sys

    def advise_stdin(data: bytes) -> str:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))
        assert main(["advise", "-"]) == 2
        return " ".join(capsys.readouterr().err.split())

    job = (
        b"model_name: llama3-8b\nmethod: lora\ngpu_model: H100-PCI\nnumber_gpus: 2\nbatch_size: 8\n"
        b"tokens_per_sample: 2048\n"
    )
    error = advise_stdin(b"\xef\xbb\xbf" + job)
    assert "did you mean 'NVIDIA-H100-PCIe'" in error and "unknown key" not in error, error
    error = advise_stdin(job.replace(b"lora", b"l\xe9ra"))
    assert "-, line 2: is not UTF-8 text" in error, error


def test_advise_names_an_unknown_key_and_the_one_it_resembles(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "job.yaml"
    config.write_text(
        "model_name: llama3-8b\nmethod: lora\ngpu_model: L40S\nnumber_gpus: 2\n"
        "batchsize: 8\ntokens_per_sample: 2048\n"
    )
    assert main(["advise", str(config)]) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert "unknown key 'batchsize' (did you mean 'batch_size'?)" in error, error
    assert "missing: batch_size" in error


def test_a_key_given_twice_in_a_file_is_refused_naming_both_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The second `number_gpus` replaced the first silently, in YAML and in JSON; a YAML merge key (`<<`)
    may still be overridden, as YAML means it to be."""
    config = tmp_path / "job.yaml"
    config.write_text(f"{LORA_JOB}number_gpus: 8\n")
    assert main(["advise", str(config)]) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert "line 7, column 1: the key 'number_gpus' is given twice (first on line 4)" in error, error
    as_json = tmp_path / "job.json"
    as_json.write_text('{"model_name": "llama3-8b", "number_gpus": 2, "number_gpus": 8}')
    assert main(["advise", str(as_json)]) == 2
    assert "the key 'number_gpus' is given twice in one object" in capsys.readouterr().err
    from twin.text_files import parse_yaml

    merged = parse_yaml("base: &b {number_gpus: 2, batch_size: 8}\njob:\n  <<: *b\n  number_gpus: 4\n")
    assert merged["job"] == {"number_gpus": 4, "batch_size": 8}


def test_a_json_number_too_long_for_python_is_refused_saying_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Valid JSON that Python will not hold (an integer of over 4,300 digits) was a traceback (ValueError)."""
    config = tmp_path / "job.json"
    config.write_text('{"model_name": "llama3-8b", "number_gpus": ' + "9" * 5000 + "}")
    assert main(["advise", str(config)]) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert (
        "job.json: a number too long to read (exceeds the limit (4300 digits) for integer string conversion: "
        "value has 5000 digits)" in error
    ), error
    assert "Traceback" not in error and "set_int_max_str_digits" not in error


LORA_JOB = (
    "model_name: llama3-8b\nmethod: lora\ngpu_model: L40S\nnumber_gpus: 2\nbatch_size: 8\n"
    "tokens_per_sample: 2048\n"
)


@pytest.fixture
def models_in_use(calibrated_models_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`finetwin advise` run with the session's calibrated models in use."""
    monkeypatch.setenv("FINETWIN_MODELS_DIR", str(calibrated_models_dir))
    return calibrated_models_dir


def _not_json(constant: str) -> None:
    raise AssertionError(f"{constant} is not JSON")


def test_advise_json_is_json_whatever_the_protocols_cap_says(
    tmp_path: Path, models_in_use: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A protocol's `stop_after_seconds` of 400 digits read as an infinite cap, printed as `Infinity`."""
    config = tmp_path / "job.yaml"
    config.write_text(f"{LORA_JOB}experiment_id: SFTTrainer.x-stop_after_seconds.{'1' + '0' * 400}-v1\n")
    assert main(["advise", str(config), "--json"]) == 0, capsys.readouterr().err
    answer = json.loads(capsys.readouterr().out, parse_constant=_not_json)
    assert answer["config"]["time_limit_s"] is None  # no run could be capped there: no cap


def test_advise_reads_a_number_written_with_an_exponent_as_the_number(
    tmp_path: Path, models_in_use: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`dataset_tokens: 1e8` was text to YAML 1.1 (it wants `1.0e+8`), and refused as "not a valid number"."""
    config = tmp_path / "job.yaml"
    answers = []
    for written in ("1e8", "1.0e8", "100000000"):
        config.write_text(f"{LORA_JOB}dataset_tokens: {written}\n")
        assert main(["advise", str(config), "--json"]) == 0, capsys.readouterr().err
        answers.append(json.loads(capsys.readouterr().out))
    assert [a["work"] for a in answers] == [{"dataset_tokens": 1e8, "assumed": False}] * 3
    assert answers[0]["verdict"] == answers[1]["verdict"] == answers[2]["verdict"]
    config.write_text(f"{LORA_JOB}dataset_tokens: 1e8x\n")
    assert main(["advise", str(config)]) == 2  # text is still text
    assert "dataset_tokens" in capsys.readouterr().err


def test_advise_says_up_front_that_a_model_was_never_measured(
    tmp_path: Path, models_in_use: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "job.yaml"
    config.write_text(LORA_JOB.replace("llama3-8b", "lama3-8b"))
    assert main(["advise", str(config)]) == 0, capsys.readouterr().err
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("warning: 'lama3-8b' is not a model the benchmark measured"), lines[:3]
    assert "did you mean 'llama3-8b'" in lines[1]
    config.write_text(config.read_text().replace("lama3-8b", "llama3-8b"))
    assert main(["advise", str(config)]) == 0
    assert "warning:" not in capsys.readouterr().out  # a measured model: nothing to warn about


def test_a_model_written_in_capitals_or_as_hugging_face_names_it_gets_the_advice_of_the_model(
    tmp_path: Path, models_in_use: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """'Llama3-8B' is llama3-8b to the models (the same tokens/s and p_valid), but it was warned about as
    never measured, and its LLM-method pair was taken for one the version never saw: the novel lower bound
    (0.64 where llama3-8b's was 0.97), so no recommendation at all. Meta's name for it,
    'meta-llama/Meta-Llama-3-8B', was all that and extrapolated from its name besides."""
    config = tmp_path / "job.json"
    answers = []
    names = ("llama3-8b", " Llama3-8B", "LLAMA3-8B", "meta-llama/Meta-Llama-3-8B", "Llama-3-8B")
    for name in names:
        job = {"model_name": name, "method": "full", "gpu_model": "NVIDIA-A100-SXM4-80GB", "number_gpus": 4,
               "batch_size": 8, "tokens_per_sample": 2048}  # fmt: skip
        config.write_text(json.dumps(job))
        assert main(["advise", str(config), "--json"]) == 0, capsys.readouterr().err
        answers.append(without_model_names(json.loads(capsys.readouterr().out)))
        assert main(["advise", str(config)]) == 0
        assert "warning:" not in capsys.readouterr().out, name
    assert answers[1:] == [answers[0]] * (len(names) - 1)
    assert answers[0]["fewest_gpus"] is not None, answers[0]  # a known pair: something to recommend


def without_model_names(document: object) -> object:
    """The document with every `model_name` left out (each configuration in it says the name as written)."""
    if isinstance(document, dict):
        return {k: without_model_names(v) for k, v in document.items() if k != "model_name"}
    if isinstance(document, list):
        return [without_model_names(v) for v in document]
    return document


def test_jobs_are_filtered_by_gpu_type_in_any_spelling(
    client: TestClient, engine: Engine, keys: dict
) -> None:
    """Every other input takes A100-SXM for the benchmark's NVIDIA-A100-SXM4-80GB; the jobs filter found no
    job by it."""
    from tests.advisor.seed import seed_overloaded_cluster

    seed_overloaded_cluster(engine, jobs=3)
    for spelling in ("A100-SXM", "nvidia-a100-sxm4-80gb", "NVIDIA-A100-SXM4-80GB"):
        page = client.get("/v1/jobs", params={"gpu_model": spelling}, headers=keys["viewer"]).json()
        assert page["total"] == 3 and {j["gpu_model"] for j in page["jobs"]} == {"NVIDIA-A100-SXM4-80GB"}
    assert client.get("/v1/jobs", params={"gpu_model": "L40S"}, headers=keys["viewer"]).json()["total"] == 0


def test_a_gpu_filter_that_names_no_gpu_type_is_a_422_with_the_names_meant(
    client: TestClient, engine: Engine, keys: dict
) -> None:
    """`gpu_model=A100` matched no job and answered an empty page, as if the cluster had no A100 job. A name
    the catalogue does not know is refused with its family's members, unless a stored job carries it."""
    from tests.advisor.seed import seed_overloaded_cluster
    from twin.db import session_scope
    from twin.store import Job

    seed_overloaded_cluster(engine, jobs=3)
    response = client.get("/v1/jobs", params={"gpu_model": "A100"}, headers=keys["viewer"])
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert detail.startswith("query.gpu_model: unknown GPU model 'A100'; did you mean ")
    assert "'NVIDIA-A100-SXM4-80GB'" in detail and "'NVIDIA-A100-80GB-PCIe'" in detail
    assert response.json()["errors"][0]["loc"] == ["query", "gpu_model"]
    # A GPU the cluster reported that the catalogue lacks (telemetry takes it) is still a filter.
    with session_scope(engine) as session:
        job = session.get(Job, session.exec(select(Job.job_id)).first())
        assert job is not None
        job.gpu_model = "Acme X1"
    for spelling in ("Acme X1", "acme-x1"):
        page = client.get("/v1/jobs", params={"gpu_model": spelling}, headers=keys["viewer"]).json()
        assert page["total"] == 1 and page["jobs"][0]["gpu_model"] == "Acme X1", spelling


def test_a_gpu_type_only_the_cluster_s_nodes_report_is_a_filter_and_a_job_id_may_hold_a_slash(
    client: TestClient, engine: Engine, keys: dict
) -> None:
    """A node of a GPU the catalogue lacks (telemetry takes it) made its type a pool of the cluster, and the
    jobs filter refused it as unknown; a job id with a slash was listed but could not be fetched."""
    from tests.advisor.seed import seed_overloaded_cluster
    from twin.db import session_scope
    from twin.store import Job, Node

    seed_overloaded_cluster(engine, jobs=2)
    with session_scope(engine) as session:
        node = session.exec(select(Node)).first()
        assert node is not None
        session.add(Node(node_id="x1-0", gpu_model="Weird GPU 9000", gpu_count=8, status="up",
                         updated_at=node.updated_at))  # fmt: skip
        job = session.exec(select(Job)).first()
        assert job is not None
        session.add(Job(**{**job.model_dump(), "job_id": "team/run-7"}))
    page = client.get("/v1/jobs", params={"gpu_model": "weird gpu 9000"}, headers=keys["viewer"])
    assert page.status_code == 200 and page.json()["total"] == 0, page.text
    one = client.get("/v1/jobs/team%2Frun-7", headers=keys["viewer"])
    assert one.status_code == 200 and one.json()["job_id"] == "team/run-7", one.text
    assert client.get("/v1/jobs/team%2Fnone", headers=keys["viewer"]).status_code == 404


def test_gpu_names_as_a_cluster_reports_them_are_one_type(
    client: TestClient, engine: Engine, keys: dict
) -> None:
    """nvidia-smi and DCGM name the GPU `NVIDIA A100-SXM4-80GB`, feature discovery with hyphens, people
    `A100-SXM`: the store keeps each as reported, and the jobs filter, the cluster's pools and the nodes'
    gauge take them for the one GPU type they are (the filter found only its own spelling, and each
    spelling made a pool and a series of its own)."""
    from tests.advisor.seed import seed_overloaded_cluster
    from twin.db import session_scope
    from twin.store import Job, Node, utcnow

    seed_overloaded_cluster(engine, jobs=3)  # one node and one running job as NVIDIA-A100-SXM4-80GB
    with session_scope(engine) as session:
        session.add(
            Node(
                node_id="smi-0",
                gpu_model="NVIDIA A100-SXM4-80GB",
                gpu_count=8,
                status="up",
                updated_at=utcnow(),
            )
        )
        for job_id, spelling in (("smi-job", "NVIDIA A100-SXM4-80GB"), ("short-job", "A100-SXM")):
            job = session.get(Job, "job-001")
            assert job is not None
            copy = Job.model_validate(job.model_dump() | {"job_id": job_id, "gpu_model": spelling})
            copy.state, copy.node_ids = "running", ["smi-0"]
            session.add(copy)
    for spelling in ("A100-SXM", "NVIDIA A100-SXM4-80GB", "nvidia_a100_sxm4_80gb"):
        page = client.get("/v1/jobs", params={"gpu_model": spelling}, headers=keys["viewer"]).json()
        assert page["total"] == 5, (spelling, page)
    cluster = client.get("/v1/cluster", headers=keys["viewer"]).json()
    assert cluster["pools"] == [
        {"gpu_model": "NVIDIA-A100-SXM4-80GB", "nodes_up": 2, "gpus_up": 16, "gpus_busy": 24,
         "nodes_draining": 0}
    ]  # fmt: skip
    assert {n["gpu_model"] for n in cluster["nodes"]} == {"NVIDIA-A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB"}
    nodes = [line for line in client.get("/metrics").text.splitlines() if line.startswith("finetwin_nodes{")]
    expected = 'finetwin_nodes{cluster="default",gpu_model="NVIDIA-A100-SXM4-80GB",status="up"} 2.0'
    assert nodes == [expected], nodes


def test_the_pools_count_nodes_as_the_twin_does(client: TestClient, engine: Engine, keys: dict) -> None:
    """A node stored before telemetry bounded its GPUs (2^31 - 1) made the pool's `gpus_up` that large, which
    the twin leaves out; a draining node is counted apart, its GPUs in no capacity (twin.cluster)."""
    from twin.db import session_scope
    from twin.store import Node, utcnow

    nodes = (("a", 8, "up"), ("b", 8, "drain"), ("c", 8, "down"), ("huge", 2**31 - 1, "up"))
    with session_scope(engine) as session:
        for node_id, gpus, status in nodes:
            session.add(Node(node_id=node_id, gpu_model="NVIDIA-A100-SXM4-80GB", gpu_count=gpus,
                             status=status, updated_at=utcnow()))  # fmt: skip
    pools = client.get("/v1/cluster", headers=keys["viewer"]).json()["pools"]
    assert pools == [{"gpu_model": "NVIDIA-A100-SXM4-80GB", "nodes_up": 1, "gpus_up": 8, "gpus_busy": 0,
                      "nodes_draining": 1}]  # fmt: skip
