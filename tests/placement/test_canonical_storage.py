"""Canonical capability and placement text is stored byte-identically on SQLite and PostgreSQL.

Each leg registers the same snapshot written three ways (reordered keys and sets, aliases,
whitespace, escapes) over signed HTTP, then reads the stored text back with raw SQL: every copy
must equal the same golden RFC 8785 text, whose bytes and SHA-256 are fixed here, so both legs
agree with each other as well as with themselves.
"""

from __future__ import annotations

import hashlib
import json

import pytest
from django.db import connection

from protocol import wire
from tests.helpers import SignedClient, enrolled_worker, register_body

pytestmark = pytest.mark.django_db

GOLDEN = (
    '{"arch":"aarch64","cpuCount":4,"diskMiB":20480,"executors":["python","shell"],"features":["docker","zstd"],'
    '"gpus":[],"labels":{"disk":"ssd","zone":"eu-1"},"memoryMiB":4096,"os":"linux",'
    '"runtimes":[{"name":"bash","version":"5.2.15"},{"name":"python","version":"3.11.7"}]}'
)

WRITTEN_AS = [
    # compact, canonical order
    GOLDEN.replace('"aarch64"', '"arm64"'),
    # reordered keys and sets, aliases in upper case, pretty whitespace
    json.dumps(
        {
            "runtimes": [{"version": "3.11.7", "name": "python"}, {"name": "bash", "version": "5.2.15"}],
            "labels": {"zone": "eu-1", "disk": "ssd"},
            "os": "Linux",
            "arch": "ARM64",
            "gpus": [],
            "features": ["zstd", "docker"],
            "executors": ["shell", "python"],
            "cpuCount": 4,
            "diskMiB": 20480,
            "memoryMiB": 4096,
        },
        indent=4,
    ),
    # \u escapes and tabs
    '{\t"arch" : "aarch64" , "os":"\\u006cinux","executors":["shell","python"],"runtimes":[{"name":"bash",'
    '"version":"5.2.15"},{"name":"python","version":"3.11.7"}],"labels":{"zone":"eu\\u002d1","disk":"ssd"},'
    '"memoryMiB":4096,"diskMiB":20480,"cpuCount":4,"gpus":[],"features":["docker","zstd"]\n}',
]


def raw_body(capabilities_text: str) -> bytes:
    envelope = json.dumps(register_body("__CAPS__"))
    return envelope.replace('"__CAPS__"', capabilities_text).encode("utf-8")


def stored_text(table: str, column: str, digest_column: str, key: str) -> tuple[bytes, str]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {column}, {digest_column} FROM {table} WHERE id = %s", [key])
        text, digest = cursor.fetchone()
    return text.encode("utf-8"), digest


def test_the_same_snapshot_written_three_ways_is_stored_as_the_same_bytes(client):
    expected = GOLDEN.encode("ascii")
    expected_digest = hashlib.sha256(expected).hexdigest()
    answers = []
    for written in WRITTEN_AS:
        worker = enrolled_worker()
        answer = SignedClient(client, worker).post(wire.SESSION_REGISTER, raw_body(written))
        assert answer.status_code == 201, answer.json()
        answers.append(answer.json())
    for answer in answers:
        assert answer["capabilitiesSha256"] == expected_digest
        text, digest = stored_text(
            "workers_workersession",
            "capabilities",
            "capabilities_sha256",
            answer["sessionId"]
            if connection.vendor == "postgresql"
            else answer["sessionId"].replace("-", ""),
        )
        assert text == expected
        assert digest == expected_digest == hashlib.sha256(text).hexdigest()


def test_placement_text_is_stored_canonically(ops):
    variants = [
        {
            "required": {"arch": ["arm64", "AMD64"], "runtimes": {"python": " >=3.9   <4"}},
            "preferred": {
                "labels": [
                    {"weight": 5, "value": "ssd", "key": "disk"},
                    {"key": "zone", "value": "eu-1", "weight": 50},
                ]
            },
        },
        {
            "preferred": {
                "labels": [
                    {"key": "zone", "value": "eu-1", "weight": 50},
                    {"key": "disk", "value": "ssd", "weight": 5},
                ]
            },
            "required": {"runtimes": {"python": ">=3.9 <4"}, "arch": ["x86_64", "aarch64"]},
        },
    ]
    golden = (
        '{"preferred":{"labels":[{"key":"disk","value":"ssd","weight":5},{"key":"zone","value":"eu-1","weight":50}]},'
        '"required":{"arch":["aarch64","x86_64"],"executor":"shell","gpu":null,"labels":{},"minDiskMiB":0,'
        '"minMemoryMiB":0,"os":[],"runtimes":{"python":">=3.9 <4"}}}'
    ).encode("ascii")
    for index, placement in enumerate(variants):
        body = {
            "name": f"canon-{index}",
            "executor": "shell",
            "command": "true",
            "timeoutSeconds": 5,
            "placement": placement,
        }
        answer = ops.post("/api/v1/ops/tasks", json.dumps(body, indent=index))
        assert answer.status_code == 201, answer.json()
        key = (
            answer.json()["id"] if connection.vendor == "postgresql" else answer.json()["id"].replace("-", "")
        )
        text, digest = stored_text("runs_taskrevision", "placement", "placement_sha256", key)
        assert text == golden
        assert digest == answer.json()["placementSha256"] == hashlib.sha256(golden).hexdigest()
