"""The QingLong headless worker agent. It imports no Django (tests/agent/test_no_django.py)."""

__version__ = "0.1.0"
