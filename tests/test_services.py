"""The choice of broker and database for the integration tests (tests/services.py): containers of Apache
Kafka and PostgreSQL where a Docker engine answers, Tansu and the local PostgreSQL where none does, and the
environment forcing either."""

from __future__ import annotations

import pytest

from tests.services import Services, choose_services


def docker(answer: bool) -> tuple[list[bool], object]:
    asked: list[bool] = []

    def available() -> bool:
        asked.append(answer)
        return answer

    return asked, available


@pytest.mark.parametrize(
    ("env", "has_docker", "expected"),
    [
        ({}, True, Services("kafka", "container")),
        ({}, False, Services("tansu", "local")),
        ({"FINETWIN_TEST_BROKER": "tansu"}, True, Services("tansu", "container")),
        ({"FINETWIN_TEST_BROKER": "kafka"}, False, Services("kafka", "local")),  # then the fixture says why
        ({"FINETWIN_TEST_BROKER": " Kafka "}, True, Services("kafka", "container")),
        ({"FINETWIN_TEST_PG_URL": "postgresql://me@db/test"}, True, Services("kafka", "local")),
        ({"FINETWIN_TEST_PG_HOST": "db.internal"}, True, Services("kafka", "local")),
        ({"FINETWIN_TEST_POSTGRES": "container"}, False, Services("tansu", "container")),
        (
            {"FINETWIN_TEST_POSTGRES": "local", "FINETWIN_TEST_BROKER": "kafka"},
            True,
            Services("kafka", "local"),
        ),
    ],
)
def test_docker_decides_unless_the_environment_does(
    env: dict[str, str], has_docker: bool, expected: Services
) -> None:
    asked, available = docker(has_docker)
    assert choose_services(env, available) == expected  # type: ignore[arg-type]
    assert len(asked) <= 1


def test_docker_is_not_asked_when_both_are_forced() -> None:
    asked, available = docker(True)
    env = {"FINETWIN_TEST_BROKER": "tansu", "FINETWIN_TEST_POSTGRES": "local"}
    assert choose_services(env, available) == Services("tansu", "local")  # type: ignore[arg-type]
    assert asked == []


@pytest.mark.parametrize("env", [{"FINETWIN_TEST_BROKER": "redpanda"}, {"FINETWIN_TEST_POSTGRES": "sqlite"}])
def test_an_unknown_choice_is_an_error_that_names_the_choices(env: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="use one of"):
        choose_services(env, lambda: True)
