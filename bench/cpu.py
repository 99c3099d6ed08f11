"""Who spent the machine's CPU during a benchmark window, read from ``/proc`` (Linux).

The signed-HTTP benchmarks (bench/http_claims.py, bench/logs_http.py) run the server, PostgreSQL
and their clients on one machine; a throughput figure alone cannot say which of them the cores
went to. These readings can: the CPU seconds of a process tree (``manage.py serve`` and its
Granian workers), of the PostgreSQL backends connected to the bench database, of the postmaster's
ended children, and of the whole machine. Take a reading at each boundary of a window and
subtract (:func:`spent`). Imported once ``django.setup()`` has run (the backends are found through
Django's connection).
"""

from __future__ import annotations

import os

from django.db import DatabaseError, connection

_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float | None:
    """CPU seconds (user + system, all threads) of process ``pid`` so far; None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICKS


def descendants(root: int) -> list[int]:
    """``root`` and every process below it (from the parent pids in ``/proc/*/stat``)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def backend_pids() -> list[int]:
    """The PostgreSQL backends connected to this database, this connection's own excepted."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return [row[0] for row in cursor.fetchall()]


def postmaster_pid() -> int | None:
    """The PostgreSQL server's main process (``postmaster.pid`` in its data directory), when this
    session may read the setting and the file; else None."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SHOW data_directory")
            directory = cursor.fetchone()[0]
        with open(os.path.join(directory, "postmaster.pid")) as pid_file:
            return int(pid_file.readline())
    except (OSError, ValueError, DatabaseError):  # not a superuser, another host, another layout
        return None


def reaped_cpu(pid: int | None) -> float:
    """CPU seconds of the ended children ``pid`` has waited for (cutime + cstime): for the
    postmaster, every backend that ended so far, of any database."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[13]) + int(fields[14])) / _TICKS


def cpu_by_pid(pids: list[int]) -> dict[int, float]:
    """CPU seconds so far of each of ``pids`` still alive."""
    return {pid: cpu for pid in pids if (cpu := process_cpu(pid)) is not None}


def spent(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds between two readings (a process first seen in ``after`` counts from 0)."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far (``/proc/stat``, all cores)."""
    with open("/proc/stat") as stat:
        values = [int(v) for v in stat.readline().split()[1:]]
    idle = values[3] + values[4]  # idle, iowait
    return (sum(values) - idle) / _TICKS, sum(values) / _TICKS
