"""The shipped systemd units (deploy/systemd/) pass ``systemd-analyze verify`` and keep the
restart rules the agent's exit statuses call for (protocol.wire EXIT_*)."""

from __future__ import annotations

import configparser
import shutil
import subprocess
from pathlib import Path

import pytest

from protocol import wire

ROOT = Path(__file__).resolve().parents[2]
UNITS = sorted((ROOT / "deploy" / "systemd").glob("*.service"))


def unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read(path)
    return parser


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verify_accepts_every_unit(tmp_path):
    """The units point at /opt/qinglong; verify them pointed at this checkout (verify checks that
    each ExecStart= names an executable)."""
    copies = []
    for path in UNITS:
        copy = tmp_path / path.name
        copy.write_text(path.read_text().replace("/opt/qinglong", str(ROOT)))
        copies.append(str(copy))
    done = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *copies], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and not done.stderr.strip() and not done.stdout.strip(), (
        done.stdout + done.stderr
    )


def test_every_unit_restarts_on_failure_and_kills_its_whole_control_group():
    assert {path.name for path in UNITS} == {
        "qinglong-control-plane.service",
        "qinglong-celery-worker.service",
        "qinglong-celery-beat.service",
        "qinglong-worker.service",
    }
    for path in UNITS:
        service = unit(path)["Service"]
        assert service["Restart"] == "on-failure", path.name
        assert service["KillMode"] == "control-group", path.name


def test_the_agent_unit_restarts_a_fenced_session_never_a_refused_credential_or_old_agent():
    service = unit(ROOT / "deploy" / "systemd" / "qinglong-worker.service")["Service"]
    prevented = {int(status) for status in service["RestartPreventExitStatus"].split()}
    assert prevented == {wire.EXIT_CREDENTIAL_REFUSED, wire.EXIT_AGENT_OUTDATED}
    assert wire.EXIT_FENCED not in prevented  # a fresh process registers a new session
    assert service["KillSignal"] == "SIGTERM" and "run" in service["ExecStart"].split()
