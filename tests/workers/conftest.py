"""Fixtures shared by the worker tests."""

from __future__ import annotations

import pytest

from tests.helpers import enrolled_worker, register


@pytest.fixture
def worker_session():
    """An enrolled worker and its registered session (2 of 2 slots free)."""
    worker = enrolled_worker()
    return worker, register(worker)
