"""Write paths: one named function per act, one transaction each (``docs/architecture.md``).

A module here may use every app's domain modules; the interfaces (``api``, ``console``,
``qinglong.tasks``) call these functions and nothing below them writes on their behalf.
"""
