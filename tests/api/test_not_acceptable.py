"""An ``Accept`` header that admits no JSON answer is refused as ``not_acceptable`` (406) naming
the header, on the worker and the operator API alike, before anything else is judged."""

from __future__ import annotations

import pytest

from protocol import wire

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("accept", ["text/html", "", "application/xml; q=1"])
@pytest.mark.parametrize(("method", "path"), [("POST", wire.CLAIM), ("GET", "/api/v1/ops/runs")])
def test_an_accept_header_without_json_is_refused_by_name(client, method, path, accept):
    answer = client.generic(method, path, b"", content_type="application/json", headers={"Accept": accept})
    assert answer.status_code == 406, answer.content
    assert answer["Content-Type"] == "application/json"
    assert answer.json() == {
        "code": "not_acceptable",
        "message": answer.json()["message"],
        "field": "Accept",
    }
