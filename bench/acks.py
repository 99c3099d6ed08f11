"""The worker loop's lease calls on PostgreSQL, one at a time: statements, wall, Python CPU and
backend CPU per call of the starting ACK, the running ACK and the completion.

    .venv/bin/python bench/acks.py --pg-url postgres://postgres@127.0.0.1:5432/qinglong_acks_bench [--orm]

One worker (one process, one connection) runs ``--loops`` (200) loops of claim → starting →
running → complete (succeeded, a one-line stdout tail) at the write-path boundary (each call one
transaction; HTTP and signature checks are not included), after one warm-up loop in which the
process learns what it caches (the session's capabilities, the placement class, the revision's
spec template and policy). The statements of each call are those of the first measured loop,
captured (BEGIN/COMMIT not counted); the timings are of the other loops, uncaptured. Backend CPU
is the connection's PostgreSQL backend, from ``/proc`` (the server on this machine). The load
average is printed first: compare runs made in the same minute. The benchmark database is wiped
(every QingLong table truncated). The last line is machine-readable.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from claim import setup_django  # noqa: E402 - bench/claim.py, after the path above
from pgdb import ensure_database  # noqa: E402

CALLS = ("claim", "starting", "running", "complete")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pg-url", default="postgres://postgres@127.0.0.1:5432/qinglong_acks_bench")
    parser.add_argument("--loops", type=int, default=200)
    parser.add_argument(
        "--orm",
        action="store_true",
        help="switch the ACK and completion functions off: the ORM paths, for a before/after in one minute",
    )
    args = parser.parse_args()
    if not args.pg_url.startswith(("postgres://", "postgresql://")):
        raise SystemExit("the ACK benchmark runs on PostgreSQL only")
    ensure_database(args.pg_url)
    setup_django(args.pg_url)
    # These import Django models: only after django.setup().
    import claim_measure  # noqa: PLC0415
    from django.core.management import call_command  # noqa: PLC0415
    from django.db import connection  # noqa: PLC0415
    from django.test.utils import CaptureQueriesContext  # noqa: PLC0415
    from logs_measure import backend_cpu  # noqa: PLC0415

    from actions.leases.activation import lease_running, lease_starting  # noqa: PLC0415
    from actions.leases.claims import OfferRequest, lease_claim  # noqa: PLC0415
    from actions.leases.completion import Completion, lease_complete  # noqa: PLC0415
    from protocol.ids import uuid7  # noqa: PLC0415

    if args.orm:  # the write paths then answer every call from their Python (ORM) path
        from actions.leases import activation, completion  # noqa: PLC0415

        activation._ack_in_database = lambda *_: None  # type: ignore[assignment]
        completion._complete_in_database = lambda *_: None  # type: ignore[assignment]

    load = os.getloadavg()
    print(f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} ({os.cpu_count()} cores)")
    call_command("migrate", verbosity=0)
    [worker] = claim_measure.reset_and_load(args.loops + 2, 1)
    fence = {"worker_id": worker.worker_id, "session_id": worker.session_id, "generation": worker.generation}

    def loop() -> list:
        """One claim → starting → running → complete; the thunk of each call, run in order."""
        token, offer_id = secrets.token_urlsafe(32), uuid7()
        held: dict = {}

        def claim():
            [offer] = lease_claim(**fence, offers=[OfferRequest(offer_id, token)])
            held.update(
                attempt_id=offer.lease.attempt_id,
                lease_generation=offer.lease.lease_generation,
                lease_token=token,
            )

        def starting():
            lease_starting(**fence, **held, offer_id=offer_id, lease_version=0)

        def running():
            lease_running(
                **fence,
                **held,
                offer_id=offer_id,
                lease_version=0,
                pid=4242,
                pgid=4242,
                executor_handle="bench",
            )

        def complete():
            lease_complete(
                **fence,
                **held,
                completion=Completion(sequence=1, outcome="succeeded", exit_code=0, stdout_tail="ok\n"),
            )

        return [claim, starting, running, complete]

    for call in loop():  # warm-up: what the process learns once
        call()
    statements: dict[str, list[str]] = {}
    for name, call in zip(CALLS, loop(), strict=True):
        with CaptureQueriesContext(connection) as captured:
            call()
        statements[name] = [
            q["sql"] for q in captured.captured_queries if q["sql"] not in ("BEGIN", "COMMIT")
        ]
    backend = backend_cpu()
    wall = dict.fromkeys(CALLS, 0.0)
    cpu = dict.fromkeys(CALLS, 0.0)
    server = dict.fromkeys(CALLS, 0.0)
    measured = args.loops - 1
    for _ in range(measured):
        for name, call in zip(CALLS, loop(), strict=True):
            started, started_cpu, started_backend = time.perf_counter(), time.process_time(), backend()
            call()
            wall[name] += time.perf_counter() - started
            cpu[name] += time.process_time() - started_cpu
            ended_backend = backend()
            if started_backend is not None and ended_backend is not None:
                server[name] += ended_backend - started_backend
    path = "ORM paths" if args.orm else "database functions"
    print(f"{measured} loops ({path}); per call: statements, wall ms, Python CPU ms, backend CPU ms")
    for name in CALLS:
        print(
            f"  {name:9} {len(statements[name]):3}  {wall[name] / measured * 1000:7.2f}"
            f"  {cpu[name] / measured * 1000:7.2f}  {server[name] / measured * 1000:7.2f}"
        )
        for sql in statements[name]:
            print(f"      {sql[:90]}")
    load = os.getloadavg()
    print(f"load average at end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(
        " ".join(
            f"{name}_statements={len(statements[name])} {name}_wall_ms={wall[name] / measured * 1000:.2f} "
            f"{name}_cpu_ms={cpu[name] / measured * 1000:.2f}"
            for name in CALLS[1:]
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
