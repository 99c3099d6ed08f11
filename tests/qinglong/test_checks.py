"""System checks (ADR-0012 §6, docs/sessions.md, Storage): a cluster profile is refused on SQLite or
a per-process cache; session timings are refused when a lease would lapse between heartbeats."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from qinglong.checks import check_profile_storage, check_session_timings

ROOT = Path(__file__).resolve().parents[2]
SQLITE = "django.db.backends.sqlite3"
POSTGRES = "django.db.backends.postgresql"
REDIS = "django.core.cache.backends.redis.RedisCache"
LOCMEM = "django.core.cache.backends.locmem.LocMemCache"


@pytest.fixture
def profile(monkeypatch):
    """Run the check against a given configuration (without swapping the live connections)."""

    def apply(name: str, engine: str, cache: str) -> list[str]:
        configured = SimpleNamespace(
            QINGLONG_PROFILE=name,
            DATABASES={"default": {"ENGINE": engine, "NAME": "x"}},
            CACHES={"default": {"BACKEND": cache, "LOCATION": "redis://127.0.0.1:6379/3"}},
        )
        monkeypatch.setattr("qinglong.checks.settings", configured)
        return [error.id for error in check_profile_storage(None)]

    return apply


@pytest.mark.parametrize(
    ("name", "engine", "cache", "errors"),
    [
        ("cluster-control", SQLITE, REDIS, ["qinglong.E001"]),
        ("cluster-control", SQLITE, LOCMEM, ["qinglong.E001", "qinglong.E002"]),
        ("cluster-control", POSTGRES, LOCMEM, ["qinglong.E002"]),
        ("cluster-control", POSTGRES, REDIS, []),
        ("standalone", SQLITE, LOCMEM, []),
        ("standalone", POSTGRES, REDIS, []),
    ],
)
def test_cluster_profile_needs_postgresql_and_a_shared_cache(profile, name, engine, cache, errors):
    assert profile(name, engine, cache) == errors


def run_check(**env: str) -> subprocess.CompletedProcess:
    clean = {
        key: value for key, value in os.environ.items() if not key.startswith(("QINGLONG_", "DATABASE_URL"))
    }
    return subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env={**clean, **env}, capture_output=True, text=True
    )


#: The subprocess tests configure their own SQLite file and touch no test database: run them once.
once = pytest.mark.sqlite


@once
def test_manage_py_refuses_to_start_a_cluster_on_sqlite(tmp_path):
    refused = run_check(
        QINGLONG_PROFILE="cluster-control",
        DJANGO_SECRET_KEY="test",
        DATABASE_URL=f"sqlite:///{tmp_path / 'cluster.sqlite3'}",
        REDIS_URL="redis://127.0.0.1:6379/3",
        QINGLONG_VAR_DIR=str(tmp_path),
    )
    assert refused.returncode != 0
    assert "qinglong.E001" in refused.stderr and "SQLite is never a cluster store" in refused.stderr
    accepted = run_check(
        QINGLONG_PROFILE="standalone",
        DATABASE_URL=f"sqlite:///{tmp_path / 'one.sqlite3'}",
        QINGLONG_VAR_DIR=str(tmp_path),
    )
    assert accepted.returncode == 0, accepted.stderr


@pytest.mark.parametrize(
    ("ttl", "interval", "jitter", "ok"),
    [
        (30, 10, 0.1, True),  # standalone default: 11 s + 1 s ≤ 15 s
        (45, 15, 0.1, True),  # cluster default: 16.5 s + 1 s ≤ 22.5 s
        (24, 10, 0.1, True),  # the tightest lease for a 10 s ± 10 % cadence
        (23, 10, 0.1, False),
        (20, 10, 0.0, False),
        (30, 0, 0.1, False),
        (30, 10, 1.0, False),
    ],
)
def test_session_lease_must_outlive_the_heartbeat_cadence(protocol_settings, ttl, interval, jitter, ok):
    protocol_settings(
        SESSION_LEASE_SECONDS=ttl, HEARTBEAT_INTERVAL_SECONDS=interval, HEARTBEAT_JITTER_RATIO=jitter
    )
    errors = check_session_timings(None)
    assert (errors == []) is ok
    assert all(error.id == "qinglong.E003" for error in errors)


@once
def test_manage_py_refuses_a_lease_shorter_than_the_cadence(tmp_path):
    refused = run_check(
        QINGLONG_SESSION_LEASE_SECONDS="20",
        DATABASE_URL=f"sqlite:///{tmp_path / 'x.sqlite3'}",
        QINGLONG_VAR_DIR=str(tmp_path),
    )
    assert refused.returncode != 0 and "qinglong.E003" in refused.stderr
    assert "QINGLONG_SESSION_LEASE_SECONDS ≥ 24" in refused.stderr
