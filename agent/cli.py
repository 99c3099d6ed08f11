"""``qinglong-worker``: enroll this machine, or run it as a worker.

    qinglong-worker enroll --server URL --token TOKEN [--worker NAME] [--state-dir DIR]
    qinglong-worker run [--server URL] [--max-concurrent N] [--label KEY=VALUE …] [--drain-timeout S]
    qinglong-worker rotate [--server URL]

Exit status of ``run``: 0 clean shutdown (drained, offline); 1 start-up error; 2 usage;
3 session fenced (a supervisor should start a fresh process); 4 credential refused (re-enroll;
do not restart in a loop); 5 drain timeout or failed offline. ``rotate`` exits 0 when the new
key is saved, 4 when the credential is refused, 1 otherwise. ``QINGLONG_WORKER_ENABLED=0`` makes
``run`` exit 0 at once without touching the network, a thread or a timer (ADR-0012 §5).
"""

from __future__ import annotations

import argparse
import logging
import os
import pwd
import sys
from pathlib import Path
from typing import cast

from protocol import messages as m
from protocol import wire
from protocol.errors import ProtocolError
from protocol.signer import WorkerKey

from . import __version__
from .calls import Stop
from .capabilities import detect_valid
from .client import DEFAULT_TIMEOUT, MAX_TIMEOUT, ApiError, Client, TransportError
from .rotation import rotate_key
from .runtime import Agent, Settings
from .state import Credential, StateDir, StateError, default_state_dir


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"labels are KEY=VALUE, not {text!r}")
    return key, value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="qinglong-worker", description="QingLong headless worker agent")
    parser.add_argument("--version", action="version", version=__version__)
    parser.add_argument("--state-dir", type=Path, default=None, help="where the key and credential live")
    commands = parser.add_subparsers(dest="command", required=True)

    enroll = commands.add_parser("enroll", help="exchange an enrollment token for a credential")
    enroll.add_argument("--server", required=True, help="control plane URL, e.g. http://127.0.0.1:8000")
    enroll.add_argument("--token", required=True, help="single-use enrollment token from an operator")
    enroll.add_argument("--worker", default=None, help="the worker name the token was issued for")

    run = commands.add_parser("run", help="run as a worker until SIGTERM")
    run.add_argument("--server", default=None, help="override the server stored at enrollment")
    run.add_argument("--max-concurrent", type=int, default=1, help="attempts run at once (1-256)")
    run.add_argument("--label", type=_label, action="append", default=[], help="KEY=VALUE, repeatable")
    run.add_argument("--feature", action="append", default=[], help="capability feature, repeatable")
    run.add_argument("--drain-timeout", type=float, default=60.0, help="seconds to wait for running attempts")
    run.add_argument(
        "--work-dir", type=Path, default=None, help="where attempts run (default: state dir/work)"
    )
    run.add_argument(
        "--job-user",
        default=None,
        help="run every job as this user (the agent must run as root): a job then cannot "
        "signal, stop or inspect the agent or its guard",
    )
    run.add_argument("--poll-max", type=float, default=5.0, help="longest wait between idle claims, seconds")
    run.add_argument(
        "--no-long-poll",
        action="store_true",
        help="claim by short polling instead of waiting claims (docs/leases.md 'Waiting claims')",
    )
    run.add_argument(
        "--wait",
        type=float,
        default=30.0,
        help="the wait a waiting claim asks for, seconds (server bounds it)",
    )
    run.add_argument(
        "--backoff-max",
        type=float,
        default=8.0,
        help="longest wait between retries while the control plane is unreachable, seconds",
    )
    run.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        help=f"seconds one request may take (at most {MAX_TIMEOUT:.0f})",
    )

    rotate = commands.add_parser("rotate", help="replace the worker key (signed by the current one)")
    rotate.add_argument("--server", default=None, help="override the server stored at enrollment")
    return parser


def _enroll(args: argparse.Namespace, state: StateDir) -> int:
    key = WorkerKey.generate()
    body: m.Enroll = {
        "token": args.token,
        "publicKey": key.public_key_text(),
        "agentVersion": __version__,
    }
    if args.worker:
        body["workerName"] = args.worker
    try:
        answer = cast(m.EnrollAnswer, Client(args.server).post(wire.ENROLL, body, signed=False))
    except (ApiError, TransportError, ValueError) as exc:
        print(f"enrollment failed: {exc}", file=sys.stderr)
        return 1
    state.save(Credential(args.server, answer["workerId"], answer["workerName"], answer["credentialId"]), key)
    print(f"enrolled as worker {answer['workerName']} ({answer['workerId']}); key kept in {state.path}")
    return 0


def _run(args: argparse.Namespace, state: StateDir) -> int:
    if not 1 <= args.max_concurrent <= 256:
        print("--max-concurrent must be 1-256", file=sys.stderr)
        return 2
    if not 0 < args.timeout <= MAX_TIMEOUT or not 0.5 <= args.backoff_max <= 300:
        print(f"--timeout must be in (0, {MAX_TIMEOUT:.0f}] and --backoff-max in [0.5, 300]", file=sys.stderr)
        return 2
    try:
        credential, key = state.load()
    except StateError as exc:
        print(f"cannot start: {exc}", file=sys.stderr)
        return 1
    server = args.server or credential.server
    work_dir = args.work_dir or state.path / "work"
    if args.job_user is not None:
        problem = _prepare_job_user(args.job_user, work_dir, state.path)
        if problem:
            print(f"cannot start: --job-user: {problem}", file=sys.stderr)
            return 2
    try:
        capabilities = detect_valid(work_dir=work_dir, labels=dict(args.label), features=args.feature)
    except ProtocolError as exc:
        print(f"cannot start: capability {exc.field}: {exc.message}", file=sys.stderr)
        return 1
    settings = Settings(
        max_concurrent=args.max_concurrent,
        labels=dict(args.label),
        work_dir=work_dir,
        drain_timeout=args.drain_timeout,
        poll_max=max(1.0, args.poll_max),
        long_poll=not args.no_long_poll,
        wait_seconds=min(max(1.0, args.wait), 60.0),
        backoff_max=args.backoff_max,
        job_user=args.job_user,
    )
    client = Client(server, key_id=credential.credentialId, key=key, timeout=args.timeout)
    agent = Agent(client, credential, state, settings)
    return agent.run(capabilities)


def _prepare_job_user(user: str, work_dir: Path, state_dir: Path) -> str | None:
    """Check that jobs can run as ``user`` and give it the work directory; the problem, or None."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        return f"no such user {user!r}"
    if os.geteuid() != 0:
        return "running jobs as another user needs the agent to run as root"
    if work_dir.resolve().is_relative_to(state_dir.resolve()):
        return "give a --work-dir outside the state directory, which only the agent may enter"
    work_dir.mkdir(parents=True, exist_ok=True)
    os.chown(work_dir, entry.pw_uid, entry.pw_gid)
    return None


def _rotate(args: argparse.Namespace, state: StateDir) -> int:
    try:
        credential, key = state.load()
    except StateError as exc:
        print(f"cannot rotate: {exc}", file=sys.stderr)
        return 1
    agent = Agent(
        Client(args.server or credential.server, key_id=credential.credentialId, key=key),
        credential,
        state,
        Settings(),
    )
    try:
        new_id = rotate_key(agent)
    except Stop as stop:
        print(stop.reason, file=sys.stderr)
        return stop.exit_code
    except (ApiError, TransportError) as exc:
        print(f"rotation failed: {exc}", file=sys.stderr)
        return 1
    print(f"rotated: new credential {new_id}; key kept in {state.path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=os.environ.get("QINGLONG_WORKER_LOG_LEVEL", "INFO"),
        format="%(asctime)s worker %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    state = StateDir(args.state_dir or default_state_dir())
    if args.command == "enroll":
        return _enroll(args, state)
    if args.command == "rotate":
        return _rotate(args, state)
    if os.environ.get("QINGLONG_WORKER_ENABLED", "1") == "0":
        print("worker disabled (QINGLONG_WORKER_ENABLED=0): nothing started", file=sys.stderr)
        return 0
    return _run(args, state)
