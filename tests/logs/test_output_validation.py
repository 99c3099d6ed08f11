"""The output declaration over the operator API (docs/logs.md, Secrets and Artifacts): bad
secretEnv entries are refused naming the entry; names with control characters are refused."""

from __future__ import annotations

import pytest

from runs.models import TaskRevision
from tests.helpers import operator_headers

pytestmark = pytest.mark.django_db


def create(client, env: dict, outputs: dict):
    body = {"name": "t-out", "executor": "shell", "command": "true", "timeoutSeconds": 30, "env": env}
    return client.post(
        "/api/v1/ops/tasks",
        {**body, "outputs": outputs},
        content_type="application/json",
        headers=operator_headers("ops", role="admin"),
    )


@pytest.mark.parametrize(
    "env, secret_env, field, words",
    [
        ({"PIN": "123"}, ["PIN"], "outputs.secretEnv[0]", "shorter than 4 characters"),
        ({"PIN": ""}, ["PIN"], "outputs.secretEnv[0]", "shorter than 4 characters"),
        ({"TOKEN": "s3cr3t-value"}, ["TOKEN", "TOKEN"], "outputs.secretEnv[1]", "named twice"),
        ({"TOKEN": "s3cr3t-value"}, ["OTHER"], "outputs.secretEnv[0]", "no variable of env"),
    ],
)
def test_a_secret_that_could_not_be_masked_or_is_named_twice_is_refused(
    client, env, secret_env, field, words
):
    answer = create(client, env, {"secretEnv": secret_env})
    assert answer.status_code == 400, answer.json()
    assert answer.json()["field"] == field and words in answer.json()["message"], answer.json()
    assert not TaskRevision.objects.exists()


def test_a_secret_of_the_masking_minimum_is_accepted(client):
    answer = create(client, {"TOKEN": "abcd"}, {"secretEnv": ["TOKEN"]})
    assert answer.status_code == 201, answer.json()
