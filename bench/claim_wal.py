"""WAL of the claim loop on PostgreSQL: bytes per claim → release loop, by relation and record type.

    .venv/bin/python bench/claim_wal.py --pg-url postgres://postgres@127.0.0.1:5432/qinglong_wal_bench

What it measures (docs/performance.md, "Claim and release"), independently of the machine's load:

* one claimer (the fixtures and the loop body of bench/claim.py: ``claim_measure.reset_and_load``,
  ``claim_once`` → ``release``) runs ``--loops`` claim → release loops over a backlog of
  ``--backlog`` pending runs, after a few warm-up loops;
* the WAL written between the two LSNs around those loops, read back with ``pg_walinspect``
  (``pg_get_wal_records_info``; the extension is created in the benchmark database, which needs a
  superuser). The server is shared, so only this database's records count: those with a block of
  this database, and the commit records of the transactions that wrote them. Each record goes to
  the relation of its first block (``pg_filenode_relation``), commits to ``(commit)``;
* per relation and per record type: records and bytes per loop (``record_length``, which
  includes full-page images), the full-page-image share, and which of the two calls wrote it (a
  transaction that inserts a lease is a claim, any other one a release);
* full-page images appear only in a window that holds a checkpoint's redo point (a page's first
  change after one writes the whole page): on a server that checkpoints every few minutes most
  500-loop windows show none, so run it a few times to see that share;
* the SQL statements per loop the client sends (Django's query log) and the heap updates per table
  and how many were HOT (``pg_stat_user_tables`` before and after).

The benchmark database is wiped (every QingLong table truncated): point it at a database that holds
nothing you want. The last line is machine-readable.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter, defaultdict
from pathlib import Path
from urllib.parse import urlsplit

from claim import setup_django  # bench/claim.py
from pgdb import dbname, ensure_database  # bench/pgdb.py

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TABLES = (
    "leases_rundispatchlease",
    "audit_event",
    "runs_runattempt",
    "runs_run",
    "workers_worker",
    "workers_workersession",
)


def _table_stats(cursor) -> dict[str, tuple[int, int, int]]:
    """(inserts, updates, HOT updates) per table of :data:`TABLES`, as the statistics have them."""
    cursor.execute("SELECT pg_stat_clear_snapshot()")
    cursor.execute(
        "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
        "WHERE relname = ANY (%s)",
        [list(TABLES)],
    )
    return {name: (ins, upd, hot) for name, ins, upd, hot in cursor.fetchall()}


#: This database's WAL records between two LSNs, grouped: those with a block in it (the first block
#: names the relation), and the commit records of their transactions (relation NULL). A transaction
#: that inserts a lease row is a claim, any other one a release. Grouped on the server: a window
#: of the shared server's WAL can hold millions of other databases' records.
OUR_RECORDS = r"""
WITH r AS (
    SELECT xid::text::bigint AS xid, resource_manager AS rm, record_type AS rt,
           record_length AS len, fpi_length AS fpi,
           regexp_match(block_ref, 'rel (\d+)/(\d+)/(\d+)') AS blk
      FROM pg_get_wal_records_info(%(start)s, %(end)s)
), ours AS (
    SELECT xid, rm, rt, len, fpi, blk[1]::oid AS spc, blk[3]::oid AS node
      FROM r WHERE blk[2]::oid = %(database)s
), claims AS (
    SELECT DISTINCT xid FROM ours
     WHERE node = pg_relation_filenode('leases_rundispatchlease') AND rm = 'Heap' AND rt LIKE 'INSERT%%'
), found AS (
    SELECT * FROM ours
    UNION ALL
    SELECT xid, rm, rt, len, fpi, NULL, NULL FROM r
     WHERE rm = 'Transaction' AND xid IN (SELECT xid FROM ours WHERE xid <> 0)
)
SELECT CASE WHEN xid IN (SELECT xid FROM claims) THEN 'claim' ELSE 'release' END, rm, rt,
       coalesce(pg_filenode_relation(CASE WHEN spc = 1663 THEN 0 ELSE spc END, node)::regclass::text,
                '(commit)'),
       count(*), sum(len), sum(fpi), count(DISTINCT xid)
  FROM found GROUP BY 1, 2, 3, 4
"""  # 1663: pg_default, which pg_filenode_relation wants as 0 (the database's default)


def _print_table(title: str, rows: dict[str, Counter], loops: int) -> None:
    print(f"  {title:<44} rec/loop  B/loop  claim  release  FPI B/loop")
    for key, c in sorted(rows.items(), key=lambda item: -item[1]["bytes"]):
        if c["bytes"] >= loops / 2:  # at least 0.5 B per loop
            per = {name: c[name] / loops for name in ("records", "bytes", "claim", "release", "fpi")}
            print(
                f"  {key:<44} {per['records']:8.2f} {per['bytes']:7.0f} {per['claim']:6.0f} "
                f"{per['release']:8.0f} {per['fpi']:11.0f}"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--pg-url", required=True, help="benchmark database (wiped), e.g. postgres://…/qinglong_wal_bench"
    )
    parser.add_argument("--loops", type=int, default=500, help="claim → release loops measured")
    parser.add_argument("--backlog", type=int, default=1_000, help="pending runs")
    parser.add_argument("--warmup", type=int, default=20, help="loops before the measurement")
    args = parser.parse_args()
    if not args.pg_url.startswith(("postgres://", "postgresql://")):
        raise SystemExit("the WAL measurement runs on PostgreSQL only")

    ensure_database(args.pg_url)
    setup_django(args.pg_url)
    import claim_measure  # noqa: PLC0415  (it imports Django models: only after django.setup())
    from django.core.management import call_command  # noqa: PLC0415
    from django.db import connection  # noqa: PLC0415
    from django.test.utils import CaptureQueriesContext  # noqa: PLC0415

    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        cursor.execute("SELECT oid FROM pg_database WHERE datname = current_database()")
        database = cursor.fetchone()[0]
    print(
        f"claim loop WAL on {urlsplit(args.pg_url).hostname}/{dbname(args.pg_url)}: "
        f"{args.loops} claim → release loops, one claimer, {args.backlog:,} pending runs"
    )
    (claimer,) = claim_measure.reset_and_load(args.backlog, 1)

    def loop() -> None:
        claimed = claim_measure.claim_once(claimer)
        if claimed is None:
            raise SystemExit("a claim found nothing: the backlog must stay pending")
        claim_measure.release(claimer, *claimed)

    for _ in range(args.warmup):
        loop()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
    with connection.cursor() as cursor:
        before = _table_stats(cursor)
        cursor.execute("SELECT pg_current_wal_insert_lsn()")
        start = cursor.fetchone()[0]
    with CaptureQueriesContext(connection) as queries:
        for _ in range(args.loops):
            loop()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_flush_lsn(), pg_current_wal_flush_lsn() - %s::pg_lsn", [start])
        end, server_bytes = cursor.fetchone()
        cursor.execute("SELECT pg_stat_force_next_flush()")
    with connection.cursor() as cursor:
        after = _table_stats(cursor)
        cursor.execute(OUR_RECORDS, {"start": start, "end": end, "database": database})
        groups = cursor.fetchall()

    by_relation: dict[str, Counter] = defaultdict(Counter)
    by_type: dict[str, Counter] = defaultdict(Counter)
    for call, rmgr, rtype, relation, records, length, fpi, _ in groups:
        for key, bucket in ((relation, by_relation), (f"{rmgr}/{rtype}", by_type)):
            bucket[key]["records"] += records
            bucket[key]["bytes"] += length
            bucket[key]["fpi"] += fpi
            bucket[key][call] += length
    k = args.loops
    total = sum(c["bytes"] for c in by_relation.values())
    fpi = sum(c["fpi"] for c in by_relation.values())
    count = sum(c["records"] for c in by_relation.values())
    claim_bytes = sum(c["claim"] for c in by_relation.values())
    statements = len(queries.captured_queries) / k
    transactions = sum(group[-1] for group in groups if group[3] == "(commit)")
    print(f"WAL per loop, this database's records ({transactions} transactions for {k} loops):")
    _print_table("relation", by_relation, k)
    _print_table("record type", by_type, k)
    print(
        f"  total {total / k:.0f} B/loop (claim {claim_bytes / k:.0f}, "
        f"release {(total - claim_bytes) / k:.0f}) in {count / k:.1f} records; "
        f"full-page images {fpi / total:.1%} of it, {(total - fpi) / k:.0f} B/loop without them; "
        f"the server wrote {server_bytes / k:.0f} B/loop in all (every database, page headers and alignment)"
    )
    print(f"  {statements:g} SQL statements per loop (claim and release, as the client sends them)")
    print("heap updates per loop (pg_stat_user_tables), HOT share:")
    for name in TABLES:
        ins, upd, hot = (now - then for now, then in zip(after[name], before[name], strict=True))
        if ins or upd:
            share = f"{hot / upd:.0%}" if upd else "—"
            print(
                f"  {name:<26} inserts {ins / k:5.2f}  updates {upd / k:5.2f}  HOT {hot / k:5.2f} ({share})"
            )
    print(
        f"wal_bytes_per_loop={total / k:.0f} wal_bytes_per_loop_no_fpi={(total - fpi) / k:.0f} "
        f"wal_records_per_loop={count / k:.1f} fpi_share={fpi / total:.3f} statements_per_loop={statements:g}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
