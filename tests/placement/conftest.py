"""Fixtures for placement tests: a superuser and an operator API client (admin-role token)."""

from __future__ import annotations

import pytest

from tests.helpers import api_token, operator_user
from tests.placement.support import OperatorClient


@pytest.fixture
def operator(db):
    return operator_user("operator", superuser=True)


@pytest.fixture
def ops(client, operator) -> OperatorClient:
    return OperatorClient(client, api_token(operator))
