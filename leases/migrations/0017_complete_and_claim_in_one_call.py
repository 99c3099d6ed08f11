"""PostgreSQL function for a completion that carries the next claim: both in one transaction.

``ql_lease_complete_and_claim`` calls ``ql_lease_complete`` and, only when that completed the
lease, ``ql_lease_claim`` with the same worker and session, and answers both functions' answers
as ``{"complete": …, "claim": …}`` (no ``claim`` when the completion did not complete: the
caller then takes the two-call road, docs/leases.md "The next claim"). One round trip and one
commit instead of two: the claim runs after the completion's writes in the same transaction, so
it counts the capacity the attempt freed, and the worker row stays locked from the one to the
other. A claim answer other than ``claimed`` wrote nothing; the caller answers it as the claim
of the two-call road would, after the completion's commit. An error in either part (``QL409``,
a lock timeout) rolls both back, and the caller takes the two-call road. SQLite has no such
function.
"""

from django.db import migrations

COMPLETE_AND_CLAIM = r"""
CREATE OR REPLACE FUNCTION ql_lease_complete_and_claim(
    p_worker uuid, p_session uuid, p_generation bigint, p_attempt uuid, p_lease_generation integer,
    p_digest text, p_revision uuid, p_number integer,
    p_sequence integer, p_outcome text, p_exit_code integer, p_sha256 text, p_stdout text, p_stderr text,
    p_run_from text[], p_run_states text[], p_error_classes text[], p_waits interval[], p_run_data jsonb,
    p_offer_ids uuid[], p_digests text[], p_lease_ids uuid[], p_known text[], p_allowed text[],
    p_scores integer[], p_rev_ids uuid[], p_rev_templates text[], p_start text, p_dispatch interval,
    p_hold interval, p_max_classes integer, p_max_pages integer, p_first_page integer, p_page integer,
    p_run_marker text, p_attempt_marker text, p_number_marker text
) RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
    done jsonb;
BEGIN
    done := ql_lease_complete(
        p_worker, p_session, p_generation, p_attempt, p_lease_generation, p_digest, p_revision, p_number,
        p_sequence, p_outcome, p_exit_code, p_sha256, p_stdout, p_stderr,
        p_run_from, p_run_states, p_error_classes, p_waits, p_run_data);
    IF done ->> 'status' <> 'completed' THEN
        RETURN jsonb_build_object('complete', done);
    END IF;
    RETURN jsonb_build_object('complete', done, 'claim', ql_lease_claim(
        p_worker, p_session, p_generation, p_offer_ids, p_digests, p_lease_ids, p_known, p_allowed,
        p_scores, p_rev_ids, p_rev_templates, p_start, p_dispatch, p_hold, p_max_classes, p_max_pages,
        p_first_page, p_page, p_run_marker, p_attempt_marker, p_number_marker));
END
$fn$;
"""

DROP = """
DROP FUNCTION IF EXISTS ql_lease_complete_and_claim(uuid, uuid, bigint, uuid, integer, text, uuid, integer,
    integer, text, integer, text, text, text, text[], text[], text[], interval[], jsonb,
    uuid[], text[], uuid[], text[], text[], integer[], uuid[], text[], text, interval, interval, integer,
    integer, integer, integer, text, text, text);
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(COMPLETE_AND_CLAIM)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [("leases", "0016_session_read_by_its_key")]

    operations = [migrations.RunPython(create, drop, elidable=False)]
