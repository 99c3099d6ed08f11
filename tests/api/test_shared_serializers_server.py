"""Review of issue 13 point 3: the shared serializer instances (``api.base.validated`` and
``represented``) under the real server's threads. Several workers send heartbeats at once, valid
ones and ones refused for a field only that request names; every answer must be the one its own
request deserves — never another request's body, session or error."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest

from protocol import strictjson, wire
from tests.agent.processes import ControlPlane
from tests.helpers import enrolled_worker, heartbeat, register, signed_headers

WORKERS, ROUNDS = 4, 30


def _post(url: str, path: str, raw: bytes, headers: dict[str, str]) -> tuple[int, dict]:
    request = urllib.request.Request(
        url + path, data=raw, method="POST", headers={**headers, "Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


@pytest.mark.django_db(transaction=True)
def test_concurrent_valid_and_refused_bodies_never_mix_through_the_server(tmp_path):
    pairs = [(worker, register(worker)) for worker in (enrolled_worker() for _ in range(WORKERS))]
    plane = ControlPlane(tmp_path, QINGLONG_RATE_WORKER="100000/m")
    plane.start()
    wrong: list[str] = []
    go = threading.Barrier(WORKERS)

    def one_worker(index: int) -> None:
        worker, session = pairs[index]
        go.wait()
        for round_ in range(ROUNDS):
            kind = round_ % 3
            if kind == 0:  # valid and unchanged: 200 with this worker's own session
                body = heartbeat(session)
            elif kind == 1:  # an unknown key only this request carries
                body = {**heartbeat(session), f"x{index}r{round_}": 1}
            else:  # a wrong type in a field, with a value only this request carries
                body = heartbeat(session, availableSlots=f"s{index}r{round_}")
            raw = strictjson.dumps(body)
            status, answer = _post(
                plane.url, wire.SESSION_HEARTBEAT, raw, signed_headers(worker, wire.SESSION_HEARTBEAT, raw)
            )
            if kind == 0:
                ok = status == 200 and answer.get("sessionId") == str(session.session_id)
            elif kind == 1:
                ok = (status, answer.get("code"), answer.get("field")) == (
                    400,
                    "validation_failed",
                    f"x{index}r{round_}",
                )
            else:
                ok = (status, answer.get("code"), answer.get("field")) == (
                    400,
                    "validation_failed",
                    "availableSlots",
                )
            if not ok:
                wrong.append(f"worker {index} round {round_}: {status} {answer}")

    threads = [threading.Thread(target=one_worker, args=(index,)) for index in range(WORKERS)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    finally:
        plane.stop()
    assert not wrong, "\n".join(wrong[:10])
