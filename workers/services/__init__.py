"""Worker write paths (one transaction each): identity in ``enrollment``, sessions in ``sessions``."""

from .enrollment import (
    IssuedToken,
    credential_force_rotation,
    credential_rotate,
    enrollment_token_create,
    worker_create,
    worker_drain,
    worker_enroll,
    worker_revoke,
    worker_undrain,
)
from .sessions import (
    SessionView,
    session_drain,
    session_expire,
    session_heartbeat,
    session_offline,
    session_operator_offline,
    session_register,
    sweep_expired_sessions,
)

__all__ = [
    "IssuedToken",
    "SessionView",
    "credential_force_rotation",
    "credential_rotate",
    "enrollment_token_create",
    "session_drain",
    "session_expire",
    "session_heartbeat",
    "session_offline",
    "session_operator_offline",
    "session_register",
    "sweep_expired_sessions",
    "worker_create",
    "worker_drain",
    "worker_enroll",
    "worker_revoke",
    "worker_undrain",
]
