"""A claim sends the spec templates of a bounded number of revisions, not every one the process
has seen (``actions.leases.claims.TEMPLATES_PER_CALL``).

``ql_lease_claim`` fills in the execution spec of the attempt it claims from a template the caller
passes. Each claim passed every usable template of the process's cache (up to 4,096 revisions,
each an RFC 8785 spec text): a long-lived control plane that had seen many revisions shipped all of
them with every claim. Now a call carries the most recently used ones; an attempt of an older
revision costs one more call (the function answers ``revision`` before writing anything) and
then its template is among the recent ones. What is claimed and the spec answered are unchanged.

PostgreSQL only: SQLite's Python path builds the spec itself.
"""

from __future__ import annotations

import uuid

import pytest

from actions.leases import claims
from leases.offers import spec_sha256
from runs.models import Run
from tests.helpers import enqueue, enrolled_worker, make_revision, register
from tests.leases.flows import claim_one, complete, start

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


@pytest.fixture
def calls(monkeypatch):
    """The templates sent with each ``ql_lease_claim`` call of this test (revision ids)."""
    monkeypatch.setattr(claims, "_templates", {})
    sent: list[list[uuid.UUID]] = []
    real = claims._known  # builds the parameters of each call: the templates among them, dumped

    def recording(scores, templates):
        sent.append(list(templates))
        return real(scores, templates)

    monkeypatch.setattr(claims, "_known", recording)
    return sent


def test_an_old_revision_is_claimed_with_one_more_call_and_each_call_sends_a_bounded_set(
    protocol_settings, calls
):
    protocol_settings(DISPATCH_HOLD_SECONDS=0)  # no claim ranking: the function answers alone
    session = register(enrolled_worker())
    old = make_revision()
    enqueue(old)
    complete(start(claim_one(session)))  # learns the class and old's template
    # Newer revisions used since (templates with the markers, as _spec_template keeps them).
    template = claims._templates[old.pk]
    for _ in range(claims.TEMPLATES_PER_CALL + 8):
        claims._templates[uuid.uuid4()] = template
    run = enqueue(old)
    calls.clear()

    held = claim_one(session)

    assert held.run_id == run.pk
    assert held.execution["runId"] == str(run.pk) and held.execution["revisionId"] == str(old.pk)
    assert held.execution["attemptId"] == str(held.attempt_id) and held.execution["attemptNumber"] == 1
    assert held.lease().spec_sha256 == spec_sha256(held.execution)
    assert len(calls) == 2, calls  # `revision`, then the claim with old's template
    assert old.pk not in calls[0] and old.pk in calls[1]
    assert all(len(sent) <= claims.TEMPLATES_PER_CALL for sent in calls)
    assert Run.objects.get(pk=run.pk).state == "dispatching"

    # Claimed, old is now among the most recent: the next claim of it is one call.
    complete(start(held))
    enqueue(old)
    calls.clear()
    claim_one(session)
    assert len(calls) == 1 and old.pk in calls[0]
