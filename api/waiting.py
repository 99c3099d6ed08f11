"""Where waiting claims wait: one hub per server process (docs/leases.md, "Waiting claims").

A waiting claim (``api.leases.waiting``) registers a :class:`Waiter` here and sleeps on an
``asyncio.Event`` — a coroutine and a socket, no thread and no database connection. The hub
wakes it when the database says something changed (``core.wakeups``):

* on PostgreSQL, one dedicated ``LISTEN qinglong_wake`` connection per process (psycopg 3
  ``AsyncConnection.notifies()``) hears every replica's commits;
* on SQLite (one standalone process) the committing thread hands the payload over in-process.

A ``c:<placement class>`` wake-up wakes *one* waiter per group of identical capabilities that
the class admits (the match is computed once per pair and cached), not the whole fleet: the one
the claim ranking puts first (``placement.ranking``: in a group every worker has the same score,
so most free slots — the offers it holds — then the lowest worker id). Waking any other would
make it defer a fresh run to the better-ranked waiter, which nobody woke, for the dispatch hold.
A waiter that claimed all it asked for passes the wake-up on to the next of its group, since
more work may be waiting. A ``w:<worker>`` wake-up wakes every waiter of that worker (its fence,
capacity or cancellations changed). Missed wake-ups are harmless: every
``CLAIM_WAIT_RECHECK_SECONDS`` the hub probes the queue for classes with claimable work (one
index scan per process, not one per waiter) and wakes waiters for them as if notified; and every
wait claims at its start. ``shutdown()`` ends every wait at once — called when ``manage.py
serve`` is stopping (its stop file appears), since Granian waits for open requests to end.

A held wait is its worker's heartbeat: every half heartbeat interval the hub extends the session
leases of all its waiters to a full TTL (once less than TTL − that tick is left), a statement per
500 (``sessions_keep_alive``), so an idle worker sends
only its waits (docs/sessions.md, "Waiting claims keep the session alive").

The hub's own work (the LISTEN connection, the slow re-check) runs on one event loop in one
thread per process. Sync work (the claim service, keep-alives, probes) runs in one bounded thread pool
(:data:`EXECUTOR`, ``QINGLONG_MAX_ACTIVE_REQUESTS`` threads), each call returning its database
connection to Django's rules (``close_old_connections``) before the thread is reused.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import psycopg
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection, connections

from actions.sessions.heartbeat import sessions_keep_alive
from core import wakeups
from core.conf import SERVE_STOP_FILE_VARIABLE, protocol
from core.db import db_now
from core.dependencies import dependency_error
from core.errors import DomainError
from placement.selectors import claimable_placement_classes, placement_admits

log = logging.getLogger("qinglong.waiting")

T = TypeVar("T")

#: The threads that run the synchronous protocol services for waiting requests, per process.
EXECUTOR = ThreadPoolExecutor(
    max_workers=max(1, int(settings.QINGLONG_SERVER["MAX_ACTIVE_REQUESTS"])), thread_name_prefix="waiting"
)

#: How often the hub looks for that file, seconds.
STOP_POLL_SECONDS = 0.2

#: Seconds without any waiting request after which the hub's thread ends (restarted on demand).
IDLE_STOP_SECONDS = 10.0
#: Seconds after the LISTEN connection opened when the hub's waiters look once more: a release or
#: completion that found no listener just before this connection opened sends no wake-up
#: (``core.wakeups``), and may have committed after the look the opening gave them.
LISTEN_SETTLE_SECONDS = 1.0
#: Seconds between two attempts to (re)open the LISTEN connection after it failed.
LISTEN_RETRY_SECONDS = 1.0
#: Waiting claims one session may hold in a process at once; a newer one supersedes the oldest,
#: which answers at once (``ended: superseded``): a worker cannot pile up held requests.
MAX_WAITS_PER_SESSION = 2
#: Wake-up reasons that end a wait whatever woke it before.
FINAL_REASONS = frozenset({"shutdown", "superseded"})


def _closing(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    try:
        return fn(*args, **kwargs)
    finally:
        close_old_connections()  # the thread is shared: hand the connection back to Django's rules


async def run_sync(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a synchronous service in :data:`EXECUTOR` (never on the event loop, never thread-sensitive)."""
    HUB.used = True  # the pool thread keeps its database connection: released by HUB.release()
    return await sync_to_async(_closing, thread_sensitive=False, executor=EXECUTOR)(fn, *args, **kwargs)


def _close_pool_connections(deadline_seconds: float = 20.0) -> None:
    """Have every thread of :data:`EXECUTOR` close its own database connections (Django's are per
    thread). One task per thread, held at a barrier until all have started; a thread still busy
    with a call when a round starts (a wait's check that outlived the shutdown) breaks that round's
    barrier after 5 s, so rounds repeat until every live thread has closed, or ``deadline_seconds``
    have passed."""
    closed: set[int] = set()
    deadline = time.monotonic() + deadline_seconds

    def close(barrier: threading.Barrier) -> None:
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            pass
        connections.close_all()
        closed.add(threading.get_ident())

    while time.monotonic() < deadline:
        live = {thread.ident for thread in list(EXECUTOR._threads)}  # the executor has no public view
        if live <= closed:  # none left open (or the pool never started a thread)
            return
        barrier = threading.Barrier(len(live), timeout=5)
        for future in [EXECUTOR.submit(close, barrier) for _ in live]:
            future.result()


class Waiter:
    """One waiting request: the worker it speaks for, whether it wants work, its capabilities.

    Created on the request's event loop; :meth:`wake` may be called from any thread."""

    __slots__ = (
        "capabilities",
        "capabilities_sha256",
        "event",
        "free",
        "loop",
        "pending",
        "reason",
        "session",
        "since",
        "superseded",
        "wants_work",
        "worker_id",
    )

    def __init__(
        self, worker_id: str, *, wants_work: bool, session: tuple[uuid.UUID, int], free: int = 0
    ) -> None:
        self.worker_id = worker_id
        #: the offers the request holds: its worker's free slots, for the claim ranking's order
        self.free = free
        #: (session id, generation) the request is fenced by: kept alive while it waits
        self.session = session
        self.wants_work = wants_work
        self.capabilities_sha256 = ""
        self.capabilities = ""
        self.loop = asyncio.get_running_loop()
        self.event = asyncio.Event()
        self.reason = ""
        self.pending = False
        self.since = time.monotonic()
        #: A newer wait of the same session took its place (see :meth:`WakeHub.add`).
        self.superseded = False

    def wake(self, reason: str) -> None:
        if self.pending and reason not in FINAL_REASONS:
            return
        self.pending = True
        try:
            self.loop.call_soon_threadsafe(self._set, reason)
        except RuntimeError:  # its loop is closed: the request is gone
            pass

    def _set(self, reason: str) -> None:
        if not self.reason or reason in FINAL_REASONS:
            self.reason = reason
        self.event.set()

    async def sleep(self, seconds: float) -> str:
        """Wait until woken or ``seconds`` pass; returns the reason (``timeout`` if none) and re-arms."""
        try:
            await asyncio.wait_for(self.event.wait(), timeout=max(0.0, seconds))
        except TimeoutError:
            return "timeout"
        reason, self.reason = self.reason, ""
        self.event.clear()
        self.pending = False
        return reason


class WakeHub:
    """The process's waiters and their wake-ups (see the module docstring).

    The LISTEN connection and the slow re-check run on the hub's own event loop, in one thread
    per process, started with the first waiter; waiters live on their requests' loops."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._main_task: asyncio.Task | None = None
        self.by_worker: dict[str, set[Waiter]] = {}
        #: capabilities digest → waiters wanting work, oldest first
        self.groups: dict[str, OrderedDict[Waiter, None]] = {}
        self._verdicts: dict[tuple[str, str], bool] = {}
        self.closing = False
        #: Counts ``c:`` wake-ups: a waiter not yet in its group when one came looks again at once.
        self.work_seq = 0
        #: Whether any request waited here or ran a service in the pool since the last
        #: :meth:`release` (tests clean up after it: a refused wait leaves a pool connection too).
        self.used = False
        #: Set once wake-ups are heard (PostgreSQL: the LISTEN connection is open).
        self.listening = threading.Event()

    # --- lifecycle ---------------------------------------------------------------------------

    def _start_locked(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="wake-hub", daemon=True)
            self._thread.start()

    def _stop_if_idle(self) -> bool:
        """End the hub's thread when no request waits (it starts again with the next waiter)."""
        with self._lock:
            if self.by_worker:
                return False
            self._thread = None
            self.listening.clear()
            return True

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except asyncio.CancelledError:
            pass

    def release(self) -> None:
        """Stop the hub's thread now and close the database connections of the pool's threads
        (tests end this way; a server process just exits). Waiting requests answer ``shutdown``."""
        self.shutdown()
        with self._lock:
            thread, loop, main = self._thread, self._loop, self._main_task
            self._thread = None
        if thread is not None and loop is not None and main is not None:
            loop.call_soon_threadsafe(main.cancel)
            thread.join(10)
        self.listening.clear()
        self.closing = False
        self.used = False
        _close_pool_connections()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._main_task = asyncio.current_task()
        if connection.vendor == "postgresql":
            listen = asyncio.create_task(self._listen())
        else:
            wakeups.subscribe(self.dispatch)
            self.listening.set()
            listen = None
        keep_alive = asyncio.create_task(self._keep_alive())
        stopping = asyncio.create_task(self._watch_stop())
        try:
            await self._recheck()
        finally:
            keep_alive.cancel()
            stopping.cancel()
            if listen is not None:
                listen.cancel()
            wakeups.unsubscribe(self.dispatch)

    def shutdown(self) -> None:
        """End every wait now (server shutdown): each answers ``shutdown`` and its worker asks again."""
        self.closing = True
        for waiter in self._all():
            waiter.wake("shutdown")

    # --- waiters -----------------------------------------------------------------------------

    def _all(self) -> list[Waiter]:
        with self._lock:
            return [waiter for waiters in self.by_worker.values() for waiter in waiters]

    def add(self, waiter: Waiter) -> None:
        """Register a waiting request. A session holds at most :data:`MAX_WAITS_PER_SESSION`
        waits here: the oldest beyond that is woken ``superseded`` (it answers at once)."""
        with self._lock:
            waiters = self.by_worker.setdefault(waiter.worker_id, set())
            same = sorted(
                (
                    other
                    for other in waiters
                    if other.session[0] == waiter.session[0] and not other.superseded
                ),
                key=lambda other: other.since,
            )
            superseded = same[: max(0, len(same) + 1 - MAX_WAITS_PER_SESSION)]
            for other in superseded:
                other.superseded = True
            waiters.add(waiter)
            self.used = True
            self._start_locked()
        for other in superseded:
            other.wake("superseded")
        if self.closing:
            waiter.wake("shutdown")

    def want_work(self, waiter: Waiter, capabilities_sha256: str, capabilities: str) -> None:
        """Put a waiter that asked for offers into its capabilities group (wakes for matching work)."""
        waiter.capabilities_sha256, waiter.capabilities = capabilities_sha256, capabilities
        with self._lock:
            self.groups.setdefault(capabilities_sha256, OrderedDict())[waiter] = None

    def remove(self, waiter: Waiter) -> None:
        with self._lock:
            waiters = self.by_worker.get(waiter.worker_id)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self.by_worker[waiter.worker_id]
            group = self.groups.get(waiter.capabilities_sha256)
            if group is not None:
                group.pop(waiter, None)
                if not group:
                    del self.groups[waiter.capabilities_sha256]

    def pass_on(self, waiter: Waiter) -> None:
        """The waiter claimed all it asked for: wake the next of its group (more may be waiting)."""
        self._wake_group(waiter.capabilities_sha256, exclude=waiter)

    @property
    def count(self) -> int:
        with self._lock:
            return sum(len(waiters) for waiters in self.by_worker.values())

    # --- wake-ups ----------------------------------------------------------------------------

    def dispatch(self, payload: str) -> None:
        """Handle one wake-up payload (``core.wakeups``); any thread."""
        if payload.startswith(wakeups.WORKER_PREFIX):
            with self._lock:
                waiters = list(self.by_worker.get(payload.removeprefix(wakeups.WORKER_PREFIX), ()))
            for waiter in waiters:
                waiter.wake("worker")
        elif payload.startswith(wakeups.WORK_PREFIX):
            self.work_ready(payload.removeprefix(wakeups.WORK_PREFIX))

    def work_ready(self, placement_sha256: str) -> None:
        """Wake one waiter of every capabilities group this placement class admits; any thread."""
        with self._lock:
            self.work_seq += 1
            groups = list(self.groups)
        for capabilities_sha256 in groups:
            verdict = self._verdicts.get((capabilities_sha256, placement_sha256))
            if verdict is True:
                self._wake_group(capabilities_sha256)
            elif verdict is None and self._loop is not None:
                asyncio.run_coroutine_threadsafe(
                    self._decide_and_wake(capabilities_sha256, placement_sha256), self._loop
                )

    def _wake_group(self, capabilities_sha256: str, exclude: Waiter | None = None) -> None:
        """Wake the group's waiter the claim ranking puts first (see the module doc)."""
        with self._lock:
            group = list(self.groups.get(capabilities_sha256, ()))
        ready = [waiter for waiter in group if waiter is not exclude and not waiter.pending]
        if ready:
            min(ready, key=lambda waiter: (-waiter.free, waiter.worker_id)).wake("work")

    async def _decide_and_wake(self, capabilities_sha256: str, placement_sha256: str) -> None:
        with self._lock:
            group = self.groups.get(capabilities_sha256)
            capabilities = next(iter(group)).capabilities if group else None
        if capabilities is None:
            return
        try:
            verdict = await run_sync(
                placement_admits,
                capabilities_sha256=capabilities_sha256,
                capabilities=capabilities,
                placement_sha256=placement_sha256,
            )
        except Exception:
            log.exception("placement match for a wake-up failed; waking anyway")
            verdict = True
        else:
            self._verdicts[(capabilities_sha256, placement_sha256)] = verdict
        if verdict:
            self._wake_group(capabilities_sha256)

    async def _recheck(self) -> None:
        """The slow timer: wake waiters for classes that hold claimable work (missed wake-ups).
        Returns (ending the hub's thread) once no request has waited for a whole interval."""
        idle_since: float | None = None
        while True:
            await asyncio.sleep(protocol().claim_wait_recheck_seconds)
            with self._lock:
                waiting, wanting = bool(self.by_worker), bool(self.groups)
            if not waiting:
                now = time.monotonic()
                if idle_since is not None and now - idle_since >= IDLE_STOP_SECONDS and self._stop_if_idle():
                    return
                idle_since = idle_since or now
                continue
            idle_since = None
            if not wanting:
                continue
            try:
                classes = await run_sync(lambda: claimable_placement_classes(now=db_now()))
            except DatabaseError as exc:  # an outage: the next interval tries again
                log.warning("waiting claims: the queue probe failed: %s", exc)
                continue
            except Exception:
                log.exception("waiting claims: the queue probe failed")
                continue
            for placement_sha256 in classes:
                self.work_ready(placement_sha256)

    async def _watch_stop(self) -> None:
        """``manage.py serve`` is stopping (its stop file appeared): end every wait now, so that
        Granian, which waits for open requests, can stop at once."""
        path = os.environ.get(SERVE_STOP_FILE_VARIABLE)
        if not path:
            return
        while not os.path.exists(path):
            await asyncio.sleep(STOP_POLL_SECONDS)
        self.shutdown()

    async def _keep_alive(self) -> None:
        """Every half heartbeat interval, keep the sessions of the held waits alive."""
        while True:
            tick = protocol().heartbeat_interval_seconds / 2
            await asyncio.sleep(tick)
            sessions = sorted({waiter.session for waiter in self._all()})
            if not sessions:
                continue
            try:
                await run_sync(sessions_keep_alive, sessions=sessions, tick=tick)
            except DomainError as exc:  # storage_busy, lock_timeout: the next tick tries again
                log.warning("waiting claims: keep-alive not written this tick: %s", exc.code)
            except Exception as exc:
                # An outage of a dependency is one warning per state change (core.dependencies),
                # not a traceback per tick; anything else is a bug and keeps its traceback.
                if dependency_error(exc) is None:
                    log.exception("waiting claims: keeping the waiting sessions alive failed")

    def _wake_all(self) -> None:
        for waiter in self._all():
            waiter.wake("worker")

    async def _listen(self) -> None:
        """PostgreSQL: hold one LISTEN connection and dispatch its notifications until cancelled."""
        params = connection.get_connection_params()
        for key in ("cursor_factory", "context", "prepare_threshold", "server_side_binding"):
            params.pop(key, None)
        params["application_name"] = wakeups.LISTENER_APPLICATION  # what writers look for
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(**params, autocommit=True)
                async with conn:
                    await conn.execute(f"LISTEN {wakeups.CHANNEL}")
                    self.listening.set()
                    # Whatever was committed while no connection listened: look again now, and
                    # once more when writes that found no listener have committed.
                    self._wake_all()
                    asyncio.get_running_loop().call_later(LISTEN_SETTLE_SECONDS, self._wake_all)
                    async for notify in conn.notifies():
                        self.dispatch(notify.payload)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.listening.clear()
                log.warning("waiting claims: LISTEN connection lost (%s); reopening", exc)
                await asyncio.sleep(LISTEN_RETRY_SECONDS)


#: This process's hub.
HUB = WakeHub()
