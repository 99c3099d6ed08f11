"""``qinglong-worker run --job-user``: refused with a clear message unless it can work."""

from __future__ import annotations

import os
import pwd

import pytest

from agent.cli import _prepare_job_user


def test_an_unknown_user_is_refused(tmp_path):
    problem = _prepare_job_user("no-such-user-ql", tmp_path / "work", tmp_path / "state")
    assert problem == "no such user 'no-such-user-ql'"


@pytest.mark.skipif(os.geteuid() != 0, reason="the agent runs as root for --job-user")
def test_a_work_dir_inside_the_private_state_dir_is_refused(tmp_path):
    problem = _prepare_job_user("nobody", tmp_path / "state" / "work", tmp_path / "state")
    assert problem and "--work-dir outside the state directory" in problem


@pytest.mark.skipif(os.geteuid() != 0, reason="the agent runs as root for --job-user")
def test_the_work_dir_is_handed_to_the_job_user(tmp_path):
    assert _prepare_job_user("nobody", tmp_path / "work", tmp_path / "state") is None
    assert (tmp_path / "work").stat().st_uid == pwd.getpwnam("nobody").pw_uid


@pytest.mark.skipif(os.geteuid() == 0, reason="only a non-root agent is refused")
def test_a_non_root_agent_is_refused(tmp_path):
    assert "needs the agent to run as root" in _prepare_job_user(
        "nobody", tmp_path / "work", tmp_path / "state"
    )
