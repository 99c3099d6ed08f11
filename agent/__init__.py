"""The QingLong headless worker agent (``qinglong-worker``); it imports no Django.

``tests/agent/unit/test_no_django.py`` keeps it so. The lifecycle: ``agent.runtime``.
"""

__version__ = "0.1.0"
