"""Server CPU per signed worker request, load-independently: ms of CPU and the profile's top
entries for heartbeats and for claims that find nothing, through Django's whole stack in process,
and two figures that bound what a leaner request path could save:

* ``floor``: an unsigned request for a worker path that names no endpoint (the WSGI handler, the
  middleware, URL resolution and the JSON 404), which every request pays whatever its view does;
* ``core``: what no claim path can leave out, called directly on a signed request object — the
  request object, signature authentication with its nonce and rate-limit round trip
  (``api.auth``), the strict JSON parse, the session-owner lookup of the principal binding and
  ``lease_claim`` itself — without DRF's request, negotiation, serializers or renderer.

A signed claim's CPU less ``floor`` and ``core`` is what DRF's dispatch, the serializers, the
rendering, the access log of a real answer and the connection health check cost together.

Usage::

    .venv/bin/python bench/signed_path.py --pg-url postgres://postgres@127.0.0.1:5432/qinglong_signed \\
        [--redis-url redis://127.0.0.1:6379/0] [--requests 500] [--top 30]

The database is migrated (use one of your own). The profile is cluster-control (Redis for nonces,
rate limits and cached credentials), the worker rate limit lifted, the session lease an hour (so
every heartbeat here is an unchanged one that writes nothing). A worker is enrolled and
registers a session through the services (``tests.helpers``); then every request is signed in
advance (fresh nonce each, PyNaCl: ``protocol.signer``) so that only the server's work is timed,
and handed to serve's handler of the worker API (``qinglong.handlers.WorkerAPIHandler``: Django's
``WSGIHandler`` with the middleware less the console's) as a WSGI environ: the middleware, URL
resolution, the ``request_started``/``request_finished`` signals (the connection health check of
``CONN_HEALTH_CHECKS`` included), DRF, the view, the write path, the renderer. One database
connection is kept throughout (``CONN_MAX_AGE`` is raised so it never expires mid-run): connection
setup is not measured. Production (``manage.py serve``, Granian over ASGI) adds the ASGI adapter
and a thread hop per request, which this does not measure.

For each kind (``heartbeat``, ``claim``, ``floor``, ``core``): 50 warm-up requests, then three
rounds of ``--requests`` requests timed with ``time.process_time`` (ms of CPU per request in this
process, the least of the three: Redis and PostgreSQL do their part elsewhere), then as many
again under ``cProfile`` (timed by CPU) for the top entries by cumulative and by own time. Every
answer must be 200 (the floor's 404). Last line::

    heartbeat_cpu_ms=<n> claim_cpu_ms=<n> floor_cpu_ms=<n> core_cpu_ms=<n>
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time
import uuid
from pathlib import Path

import django

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pgdb import ensure_database  # noqa: E402  (bench/pgdb.py)

#: A worker API path that names no endpoint: the floor's request (answered 404 in JSON).
FLOOR_PATH = "/api/v1/worker/no-such-endpoint"


def configure(pg_url: str, redis_url: str) -> None:
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "qinglong.settings",
            "QINGLONG_PROFILE": "cluster-control",
            "DATABASE_URL": pg_url,
            "REDIS_URL": redis_url,
            "DJANGO_SECRET_KEY": os.environ.get("DJANGO_SECRET_KEY", "bench-signed-path"),
            "QINGLONG_RATE_WORKER": "1000000/m",
            "QINGLONG_DB_CONN_MAX_AGE": "86400",  # keep one connection: setup is not measured
            # Claims do not keep the session alive, and a loaded machine makes the run long.
            "QINGLONG_SESSION_LEASE_SECONDS": "3600",
        }
    )
    ensure_database(pg_url)
    django.setup()
    from django.core.management import call_command  # noqa: PLC0415  (after django.setup())

    call_command("migrate", verbosity=0)


def environ(path: str, raw: bytes, headers: dict[str, str]) -> dict:
    env = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": path,
        "QUERY_STRING": "",
        "SCRIPT_NAME": "",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(raw)),
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "8000",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1",
        "HTTP_HOST": "127.0.0.1",
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(raw),
        "wsgi.errors": sys.stderr,
    }
    for name, value in headers.items():
        env["HTTP_" + name.upper().replace("-", "_")] = value
    return env


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pg-url", required=True)
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    configure(args.pg_url, args.redis_url)

    import secrets  # noqa: PLC0415

    from django.core.handlers.wsgi import WSGIRequest  # noqa: PLC0415

    from actions.leases.claims import OfferRequest, lease_claim  # noqa: PLC0415
    from api.auth import WorkerSignatureAuthentication  # noqa: PLC0415
    from api.leases.views import ClaimView  # noqa: PLC0415
    from protocol import strictjson, wire  # noqa: PLC0415
    from protocol.ids import uuid7  # noqa: PLC0415
    from protocol.signer import WorkerKey, sign_request  # noqa: PLC0415
    from qinglong.handlers import WorkerAPIHandler  # noqa: PLC0415  (serve's handler of the worker API)
    from tests.helpers import enrolled_worker, register  # noqa: PLC0415
    from workers.principals import session_owner  # noqa: PLC0415

    worker = enrolled_worker()
    session = register(worker)
    # The same seed as the worker's cryptography key, signed with PyNaCl (byte-equal headers).
    from cryptography.hazmat.primitives.serialization import (  # noqa: PLC0415
        Encoding,
        NoEncryption,
        PrivateFormat,
    )

    key = WorkerKey.from_pem(worker.key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    handler = WorkerAPIHandler()

    def bodies(kind: str, count: int) -> list[tuple[str, bytes, dict[str, str]]]:
        fence = {"sessionId": str(session.session_id), "generation": session.generation}
        out = []
        for _ in range(count):
            if kind == "floor":  # no endpoint, no signature: what every request pays regardless
                out.append((FLOOR_PATH, b"{}", {}))
                continue
            if kind == "heartbeat":  # "core" signs the claim's bodies
                path = wire.SESSION_HEARTBEAT
                body = {**fence, "expectedVersion": session.version, "availableSlots": 2}
            else:
                path = wire.CLAIM
                body = {
                    **fence,
                    "offers": [{"offerId": str(uuid7()), "leaseToken": secrets.token_urlsafe(32)}],
                }
            raw = strictjson.dumps(body)
            headers = sign_request(
                method="POST", path=path, body=raw, key_id=worker.credential_id, private_key=key
            )
            out.append((path, raw, headers))
        return out

    statuses: list[str] = []

    def start_response(status: str, headers, *args) -> None:
        statuses[:] = [status]

    authentication, claim_view = WorkerSignatureAuthentication(), ClaimView()

    def core(requests: list[tuple[str, bytes, dict[str, str]]]) -> None:
        for path, raw, headers in requests:
            request = WSGIRequest(environ(path, raw, headers))
            principal, _ = authentication._authenticate(request, claim_view)
            data = strictjson.loads(request.body, max_depth=claim_view.max_json_depth)
            if session_owner(data["sessionId"]) != str(principal.worker_id):
                raise SystemExit(f"{path}: the session's owner is not the signing worker")
            lease_claim(
                worker_id=principal.worker_id,
                session_id=uuid.UUID(data["sessionId"]),
                generation=data["generation"],
                offers=[OfferRequest(uuid.UUID(o["offerId"]), o["leaseToken"]) for o in data["offers"]],
            )

    def send(requests: list[tuple[str, bytes, dict[str, str]]]) -> None:
        for path, raw, headers in requests:
            result = handler(environ(path, raw, headers), start_response)
            body = b"".join(result)
            result.close()  # request_finished, as a WSGI server does
            if not statuses[0].startswith("404" if path == FLOOR_PATH else "200"):
                raise SystemExit(f"{path}: {statuses[0]} {body[:300]!r}")

    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}", file=sys.stderr)
    summary = []
    for kind in ("heartbeat", "claim", "floor", "core"):
        call = core if kind == "core" else send
        call(bodies(kind, 50))
        rounds = []
        for _ in range(3):  # the machine is shared: the least disturbed of three rounds
            timed = bodies(kind, args.requests)
            started = time.process_time()
            call(timed)
            rounds.append((time.process_time() - started) / args.requests * 1000)
        cpu_ms = min(rounds)
        profiled = bodies(kind, args.requests)
        profile = cProfile.Profile(time.process_time)  # CPU, not wall: waits on the servers are not ours
        profile.enable()
        call(profiled)
        profile.disable()
        out = io.StringIO()
        stats = pstats.Stats(profile, stream=out)
        stats.sort_stats("cumulative").print_stats(args.top)
        stats.sort_stats("tottime").print_stats(args.top // 2)
        spread = " ".join(f"{r:.2f}" for r in rounds)
        print(f"\n=== {kind}: {cpu_ms:.2f} ms CPU per request (N={args.requests}, rounds {spread}) ===")
        print(out.getvalue())
        summary.append(f"{kind}_cpu_ms={cpu_ms:.2f}")
    print(f"load average {os.getloadavg()[0]:.2f}")
    print(" ".join(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
