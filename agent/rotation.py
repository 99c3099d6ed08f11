"""Worker key rotation (ADR-0012 §2): a new Ed25519 key, sent signed by the current one.

Run by the heartbeat loop when the operator requires it (``rotationRequired``), or by
``qinglong-worker rotate``. The new key is saved before the old one is forgotten
(``agent.state``), so a crash mid-rotation leaves a consistent pair (docs/transport.md).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, cast

from protocol import messages as m
from protocol import wire
from protocol.signer import WorkerKey

from .state import Credential

if TYPE_CHECKING:
    from .runtime import Agent

log = logging.getLogger("qinglong.agent")

#: Seconds a rotation keeps retrying while the control plane does not answer.
ROTATE_PATIENCE = 30.0


def rotate_key(agent: Agent) -> str:
    """Rotate the worker key; returns the new credential id.

    The rotation is retried with the *same* new key while the control plane does not answer
    (the server answers a repeated rotation as an exact replay), then the new key and
    credential are saved before the client switches to them and the old key file is removed.
    Raises Stop when the credential is refused, ApiError for other refusals
    (``credential_superseded``), TransportError when the control plane stayed unreachable for
    ``ROTATE_PATIENCE`` seconds.
    """
    new_key = WorkerKey.generate()
    body: m.Rotate = {"publicKey": new_key.public_key_text()}
    answer = cast(m.RotateAnswer, agent.call(wire.ROTATE_KEY, body, patience=ROTATE_PATIENCE))
    old = agent.credential
    agent.credential = Credential(old.server, old.workerId, old.workerName, answer["credentialId"])
    agent.state.save(agent.credential, new_key)
    agent.client = agent.client.with_key(answer["credentialId"], new_key)
    log.info(
        "rotated the worker key; new credential %s (the old key works until %s)",
        answer["credentialId"],
        answer["previousCredentialValidUntil"],
    )
    return answer["credentialId"]
