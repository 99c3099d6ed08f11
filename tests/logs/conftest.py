"""Job output tests keep their stored objects in a temporary directory."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def output_dir(settings, tmp_path):
    """``STORAGES["output"]`` on a fresh directory for each test."""
    settings.STORAGES = {
        **settings.STORAGES,
        "output": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path / "output")},
        },
    }
    return tmp_path / "output"


@pytest.fixture
def output_settings(settings):
    """Adjust ``settings.QINGLONG_OUTPUT`` keys for one test."""

    def adjust(**changes):
        settings.QINGLONG_OUTPUT = {**settings.QINGLONG_OUTPUT, **changes}

    return adjust
