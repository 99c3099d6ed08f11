"""The agent's local state: its Ed25519 private key and credential, in a private directory.

Layout (directory mode 0700, files 0600, written atomically)::

    <state dir>/key-<credentialId>.pem  PKCS#8 private key (never leaves this machine)
    <state dir>/credential.json         {"server", "workerId", "workerName", "credentialId"}

The key file is written first and ``credential.json`` (which names it) replaced atomically
after, so a crash mid-rotation leaves the previous, still consistent pair in force.

Default state dir: ``$QINGLONG_WORKER_STATE_DIR`` or ``~/.local/state/qinglong-worker``.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from protocol.signer import WorkerKey


def default_state_dir() -> Path:
    configured = os.environ.get("QINGLONG_WORKER_STATE_DIR")
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state")) / "qinglong-worker"


@dataclass(frozen=True)
class Credential:
    server: str
    workerId: str
    workerName: str
    credentialId: str


class StateError(RuntimeError):
    """The state directory is missing, unreadable, or not private."""


def _write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class StateDir:
    """Read and write the agent's key and credential."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @property
    def credential_path(self) -> Path:
        return self.path / "credential.json"

    def key_path(self, credential_id: str) -> Path:
        return self.path / f"key-{credential_id}.pem"

    def save(self, credential: Credential, key: WorkerKey) -> None:
        """Store a credential and its key; older key files are removed afterwards."""
        _write_private(
            self.key_path(credential.credentialId),
            key.to_pem(),
        )
        _write_private(self.credential_path, json.dumps(asdict(credential), indent=2).encode())
        for stale in self.path.glob("key-*.pem"):
            if stale != self.key_path(credential.credentialId):
                stale.unlink(missing_ok=True)

    def load(self) -> tuple[Credential, WorkerKey]:
        """Return the credential and key. Raises StateError if not enrolled or not private."""
        if not self.credential_path.exists():
            raise StateError(
                f"not enrolled: no credential in {self.path} (run `qinglong-worker enroll` first)"
            )
        try:
            credential = Credential(**json.loads(self.credential_path.read_text()))
        except (ValueError, TypeError) as exc:
            raise StateError(f"{self.credential_path} is damaged: {exc}") from None
        key_path = self.key_path(credential.credentialId)
        if not key_path.exists():
            raise StateError(f"{key_path} is missing; enroll again")
        mode = key_path.stat().st_mode & 0o777
        if mode & 0o077:
            raise StateError(f"{key_path} is readable by others (mode {mode:o}); chmod 600 it")
        try:
            key = WorkerKey.from_pem(key_path.read_bytes())
        except ValueError:
            raise StateError(f"{key_path} is not an unencrypted PKCS #8 Ed25519 key") from None
        return credential, key
