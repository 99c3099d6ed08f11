"""Fixtures for placement tests: a staff user and an operator API client."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token

from tests.placement.support import OperatorClient


@pytest.fixture
def operator(db):
    return get_user_model().objects.create_user("operator", password="x", is_staff=True, is_superuser=True)


@pytest.fixture
def ops(client, operator) -> OperatorClient:
    return OperatorClient(client, Token.objects.create(user=operator).key)
