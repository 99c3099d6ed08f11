"""What a claim sends ``ql_lease_claim`` about what its process knows (``actions.leases.claims``).

The five arrays of placement classes, scores and recent templates are dumped once per state of
that knowledge (``core.db.bound``), and the offer's lease is built as a loaded row
(``leases.models.lease_loaded``). That the right values reach the function is shown by every
PostgreSQL claim test (classes learnt between calls, templates rotating:
tests/leases/test_claim_templates_per_call.py); here, the two stores stay bounded and keep their
newest states, and a loaded lease is the lease the constructor builds.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from actions.leases import claims
from leases.models import LeaseState, RunDispatchLease, lease_loaded


def test_the_dumped_states_are_bounded_and_the_newest_are_kept(monkeypatch):
    monkeypatch.setattr(claims, "_bound_scores", {})
    monkeypatch.setattr(claims, "_bound_templates", {})
    monkeypatch.setattr(claims, "_BOUND_SCORES_LIMIT", 8)
    monkeypatch.setattr(claims, "_BOUND_TEMPLATES_LIMIT", 4)
    revisions = [uuid.uuid4() for _ in range(10)]
    for n in range(20):
        scores = {f"class-{n}": n, f"other-{n}": None}
        templates = {revisions[n % 10]: f"template {n % 10}"}
        first = claims._known(scores, templates)
        assert claims._known(dict(scores), dict(templates)) == first  # the same state: the same dumps
        assert len(first) == 5
    assert len(claims._bound_scores) == 8 and len(claims._bound_templates) == 4
    assert (("class-19", 19), ("other-19", None)) in claims._bound_scores
    assert frozenset({revisions[9]}) in claims._bound_templates
    assert (("class-0", 0), ("other-0", None)) not in claims._bound_scores


def test_the_order_of_recent_use_is_not_a_new_state(monkeypatch):
    monkeypatch.setattr(claims, "_bound_templates", {})
    a, b = uuid.uuid4(), uuid.uuid4()
    claims._known({}, {a: "ta", b: "tb"})
    claims._known({}, {b: "tb", a: "ta"})
    assert len(claims._bound_templates) == 1


def test_a_loaded_lease_is_the_lease_the_constructor_builds():
    now = datetime.now(UTC)
    values = {
        "id": uuid.uuid4(),
        "attempt_id": uuid.uuid4(),
        "run_id": uuid.uuid4(),
        "worker_id": uuid.uuid4(),
        "session_id": uuid.uuid4(),
        "session_generation": 3,
        "lease_generation": 2,
        "offer_id": uuid.uuid4(),
        "token_digest": "d" * 64,
        "version": 0,
        "state": LeaseState.LEASED,
        "expires_at": now,
        "spec_sha256": "s" * 64,
        "claimed_at": now,
    }
    loaded, built = lease_loaded(values), RunDispatchLease(**values)
    built._state.adding = False
    assert {k: v for k, v in vars(loaded).items() if k != "_state"} == {
        k: v for k, v in vars(built).items() if k != "_state"
    }
    assert loaded == built and not loaded._state.adding


def test_a_loaded_lease_refuses_a_key_that_names_no_field():
    with pytest.raises(TypeError, match="attempt"):
        lease_loaded({"id": uuid.uuid4(), "attempt": uuid.uuid4()})
