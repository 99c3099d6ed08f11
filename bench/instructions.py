"""`make bench-instructions`: instructions per claim loop, counted by valgrind's callgrind.

Usage::

    .venv/bin/python bench/instructions.py --pg-url postgres://postgres@127.0.0.1:5432/qinglong_instr \\
        [--claim-loops 300] [--signed-loops 300]

The timed benchmarks (bench-claim, bench-heartbeat) divide by ``pgbench`` to see past the
machine, but on a shared 2-core machine their figures still move by a fifth between windows of
one run: a change worth a few per cent cannot be told from the noise by them. Callgrind counts
the instructions a process executes, the same count whatever else the machine is doing (seen
twice to the instruction on one machine, but not from one child to the next: two children of
the same code started together differ by up to 36M instructions, in start-up and the warm-up, so
the measured loops must be many enough to carry that: ±0.12M a signed loop at 300 loops, ±0.6M
(5 %) at 60). Two figures, each from two runs of this script's child under
``valgrind --tool=callgrind``, one with N loops after the warm-up and one with the warm-up
alone, so that start-up, imports and fixtures cancel out:

* ``claim_release_instructions``: one claimer's ``lease_claim`` → ``lease_release`` loop in
  process over a 1k backlog (``claim_measure``: what bench-claim's claimers run), counted in
  the claimer's process — its Python, psycopg and libpq; PostgreSQL's side is not counted;
* ``signed_loop_instructions``: bench-claim's HTTP loop (offer → starting ACK → running ACK →
  complete carrying the next claim; a claim of its own only for the first) through serve's
  handler of the worker API in process (``qinglong.handlers``: Django's WSGI handler, the
  middleware less the console's, the hot endpoints, the cluster-control profile
  with Redis), the client's JSON and signing included (as ``bench/signed_path.py`` does): the
  request threads' work of bench-claim's HTTP loop, without Granian, the event loop and the
  thread hop, and without PostgreSQL's and Redis's side.

Both are per loop, in millions. The database is migrated and its QingLong tables wiped (use one of
your own). Needs valgrind (``make bench-instructions`` installs Debian's when it is missing). A
child takes a minute or two under callgrind. Last line::

    claim_release_instructions=<n> signed_loop_instructions=<n>   (millions per loop)
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WARM_UP = 30
_COLLECTED = re.compile(r"Collected : (\d+)")


def _count(pg_url: str, kind: str, loops: int) -> int:
    """Instructions callgrind counted in one child run of ``kind`` with ``loops`` measured loops."""
    completed = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            __file__,
            "--child",
            kind,
            "--pg-url",
            pg_url,
            "--loops",
            str(loops),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    found = _COLLECTED.search(completed.stderr)
    if completed.returncode != 0 or found is None:
        raise SystemExit(f"the {kind} child failed ({completed.returncode}):\n{completed.stderr[-3000:]}")
    return int(found.group(1))


def per_loop(pg_url: str, kind: str, loops: int) -> float:
    """Millions of instructions per loop of ``kind``: (a run with ``loops`` − a run without) / loops."""
    with_loops, without = _count(pg_url, kind, loops), _count(pg_url, kind, 0)
    return (with_loops - without) / loops / 1e6


def _claim_child(pg_url: str, loops: int) -> None:
    import claim  # noqa: PLC0415  (bench/claim.py: Django set up for the benchmark database)

    claim.setup_django(pg_url)
    import claim_measure  # noqa: PLC0415  (imports Django models: only after django.setup())

    (claimer,) = claim_measure.reset_and_load(1_000, 1)
    claim_measure.vacuum_churned()
    for _ in range(WARM_UP + loops):
        lease, token = claim_measure.claim_once(claimer)
        claim_measure.release(claimer, lease, token)


class _InProcessClient:
    """What the HTTP loop asks of ``agent.client.Client``, served by Django's WSGI handler in this
    process: ``post`` signs as the agent signs and answers the JSON (SystemExit on anything but
    200)."""

    def __init__(self, handler, key_id: str, key) -> None:
        self.handler, self.key_id, self.key = handler, key_id, key
        self.status = ""

    def _start_response(self, line: str, headers, *args) -> None:
        self.status = line

    def post(self, path: str, body: dict) -> dict:
        import json  # noqa: PLC0415

        import signed_path  # noqa: PLC0415  (bench/signed_path.py: the in-process request harness)

        from protocol import strictjson  # noqa: PLC0415
        from protocol.signer import sign_request  # noqa: PLC0415

        raw = strictjson.dumps(body)
        headers = sign_request(method="POST", path=path, body=raw, key_id=self.key_id, private_key=self.key)
        result = self.handler(signed_path.environ(path, raw, headers), self._start_response)
        answer = b"".join(result)
        result.close()  # request_finished, as a WSGI server does
        if not self.status.startswith("200"):
            raise SystemExit(f"{path}: {self.status} {answer[:300]!r}")
        return json.loads(answer)


def _signed_child(pg_url: str, loops: int) -> None:
    import signed_path  # noqa: PLC0415  (bench/signed_path.py: the in-process request harness)

    os.environ["QINGLONG_DISPATCH_HOLD_SECONDS"] = "0"  # a run enqueued just now is claimable at once
    signed_path.configure(pg_url, os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    import claim_measure  # noqa: PLC0415  (bench/claim_measure.py: imports Django models)
    import heartbeat  # noqa: PLC0415  (bench/heartbeat.py: BenchWorker)
    from cryptography.hazmat.primitives.serialization import (  # noqa: PLC0415
        Encoding,
        NoEncryption,
        PrivateFormat,
    )
    from http_claims import _loop as claim_loop  # noqa: PLC0415  (bench-claim's HTTP loop)

    from protocol.signer import WorkerKey  # noqa: PLC0415
    from qinglong.handlers import WorkerAPIHandler  # noqa: PLC0415  (serve's handler of the worker API)
    from tests.helpers import enqueue, enrolled_worker, make_revision, register  # noqa: PLC0415

    claim_measure.wipe()  # each child starts from the same empty tables
    enrolled = enrolled_worker()
    session = register(enrolled)
    key = WorkerKey.from_pem(enrolled.key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    revision = make_revision()
    for _ in range(WARM_UP + 500):  # as many whatever the loops: the fixture cancels out
        enqueue(revision)
    worker = heartbeat.BenchWorker(
        client=_InProcessClient(WorkerAPIHandler(), enrolled.credential_id, key),
        session_id=str(session.session_id),
        generation=session.generation,
    )
    for _ in range(WARM_UP + loops):
        if not claim_loop(worker):
            raise SystemExit("a signed claim found no work")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg-url", required=True, help="a PostgreSQL database of your own (migrated, wiped)")
    parser.add_argument("--claim-loops", type=int, default=300)
    parser.add_argument("--signed-loops", type=int, default=300)
    parser.add_argument("--child", choices=["claim", "signed"], help=argparse.SUPPRESS)
    parser.add_argument("--loops", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "claim":
        _claim_child(args.pg_url, args.loops)
        return 0
    if args.child == "signed":
        _signed_child(args.pg_url, args.loops)
        return 0
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (make bench-instructions installs Debian's)")
    from pgdb import ensure_database  # noqa: PLC0415  (bench/pgdb.py)

    ensure_database(args.pg_url)
    subprocess.run(  # migrate once, outside the counted runs
        [sys.executable, str(ROOT / "manage.py"), "migrate", "--verbosity", "0"],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": args.pg_url},
        check=True,
    )
    claim_release = per_loop(args.pg_url, "claim", args.claim_loops)
    print(f"claim → release, one claimer in process: {claim_release:.3f}M instructions per loop", flush=True)
    signed = per_loop(args.pg_url, "signed", args.signed_loops)
    print(
        f"offer → starting → running → complete + next claim through Django in process, signing included: "
        f"{signed:.3f}M instructions per loop",
        flush=True,
    )
    print(f"claim_release_instructions={claim_release:.3f} signed_loop_instructions={signed:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
