"""Drop the pattern index Django adds beside the replay nonce's primary key (PostgreSQL).

Django gives a ``CharField`` primary key a second B-tree with ``varchar_pattern_ops`` for
``LIKE 'prefix%'`` lookups. The nonce store never searches by prefix: it inserts a key (the replay
check: insert or fail on the primary key) and prunes by ``expires_at``. Yet every signed request
of the standalone profile wrote an entry into that index too (docs/performance.md, "What the
heartbeat's WAL figure leaves out"). As in 0007, only the index goes, by its name; SQLite has no
such index. A later ``AlterField`` of ``key`` would have Django create it again.
"""

from django.db import migrations

INDEX = "workers_replaynonce_key_edc137e6_like"
DROP = f'DROP INDEX IF EXISTS "{INDEX}"'
RECREATE = f'CREATE INDEX IF NOT EXISTS "{INDEX}" ON "workers_replaynonce" ("key" varchar_pattern_ops)'


def _on_postgresql(sql: str):
    def run(apps, schema_editor) -> None:
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("workers", "0007_session_worker_index_covered_by_unique"),
    ]

    operations = [migrations.RunPython(_on_postgresql(DROP), _on_postgresql(RECREATE))]
