"""`make run`: the control plane plus one real local worker, executing four sample runs and one
scheduled sample.

Steps: migrate the SQLite default, create an operator login (printed), start the control plane
(``manage.py serve``: Granian + the in-process sweep loop), enroll a local worker with a fresh
single-use token, start ``qinglong-worker run`` as a separate process under a small supervisor
(restarted when it exits fenced, status 3 — kill it to watch generation 2 take over), create four
sample tasks through the operator API and enqueue one run of each, schedule a fifth task every
minute (``* * * * *``, UTC), then print each outcome as it lands and each scheduled fire.
``ONCE=1`` stops after the samples and the first scheduled fire (drain, offline, shutdown) and
exits 0 only if every sample ended as expected; otherwise it keeps serving the admin (and the
schedule keeps firing) until Ctrl-C.

With ``QINGLONG_LOG_FORMAT=json`` every line it prints is one JSON object: its own status lines,
the control plane's log (JSON already) and the agent's lines (plain text from a process that
imports no logging library beyond the standard one), which it relays wrapped as
``{"time", "level", "logger": "agent", "message"}``.

This script imports no Django: it drives the product the way an operator would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VAR = Path(os.environ.get("QINGLONG_VAR_DIR", ROOT / "var"))
PORT = int(os.environ.get("PORT", "8000"))
SERVER = f"http://127.0.0.1:{PORT}"
PY = sys.executable
ONCE = os.environ.get("ONCE", "") not in ("", "0")
JSON_LOGS = os.environ.get("QINGLONG_LOG_FORMAT", "plain") == "json"

SAMPLES = [
    # name, revision spec, expected (state, exit code)
    (
        "sample-shell",
        {"executor": "shell", "timeoutSeconds": 30, "command": 'echo "hello from $(uname -n)"; uname -sm'},
        ("succeeded", 0),
    ),
    (
        "sample-python",
        {
            "executor": "python",
            "timeoutSeconds": 30,
            "command": "import platform, sys\nprint('python', platform.python_version(), 'sum', "
            "sum(range(1000)))\nsys.exit(0)\n",
            "placement": {"required": {"runtimes": {"python": ">=3.8"}}},
        },
        ("succeeded", 0),
    ),
    (
        "sample-exit-3",
        {"executor": "shell", "timeoutSeconds": 30, "command": "echo 'about to fail' >&2; exit 3"},
        ("failed", 3),
    ),
    (
        "sample-timeout",
        {"executor": "shell", "timeoutSeconds": 2, "command": "echo sleeping; sleep 60"},
        ("timed_out", None),
    ),
]


SCHEDULED = (
    "sample-every-minute",
    {
        "executor": "shell",
        "timeoutSeconds": 30,
        "command": 'echo "scheduled run at $(date -u +%H:%M:%S) UTC"',
    },
    {"cron": "* * * * *", "timezone": "UTC", "overlap": "skip", "misfire": "run_once"},
)


def _json_line(logger: str, message: str, level: str = "INFO") -> str:
    now = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    return json.dumps({"time": now, "level": level, "logger": logger, "message": message})


#: The relay threads and the main thread print whole lines, one at a time (never interleaved).
_PRINT = threading.Lock()


def emit(line: str) -> None:
    with _PRINT:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def say(message: str) -> None:
    emit(_json_line("make-run", message) if JSON_LOGS else f"[make run] {message}")


def _relay(stream, logger: str) -> None:
    """Print a child's output line by line: JSON objects as they are, anything else wrapped."""
    for raw in stream:
        line = raw.rstrip("\n")
        if not line.strip():
            continue
        try:
            is_object = isinstance(json.loads(line), dict)
        except ValueError:
            is_object = False
        level = "WARNING" if " WARNING " in line else "ERROR" if " ERROR " in line else "INFO"
        emit(line if is_object else _json_line(logger, line, level))


def spawn(command: list[str], logger: str, **kwargs) -> subprocess.Popen:
    """``Popen`` whose output, in JSON mode, goes through :func:`_relay` (else straight through)."""
    if not JSON_LOGS:
        return subprocess.Popen(command, cwd=ROOT, **kwargs)
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs
    )
    threading.Thread(target=_relay, args=(process.stdout, logger), daemon=True).start()
    return process


def manage(*args: str, capture: bool = True) -> str:
    done = subprocess.run(
        [PY, str(ROOT / "manage.py"), *args], cwd=ROOT, check=True, text=True, capture_output=capture
    )
    return done.stdout.strip() if capture else ""


class Operator:
    """A tiny client for the operator API (staff token)."""

    def __init__(self, token: str) -> None:
        self.token = token

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        request = urllib.request.Request(
            SERVER + path,
            method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"Token {self.token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=15) as response:
                return response.status, json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    def text(self, path: str) -> tuple[int, str]:
        """GET a plain-text answer (the run log, docs/logs.md)."""
        request = urllib.request.Request(SERVER + path, headers={"Authorization": f"Token {self.token}"})
        try:
            with urllib.request.urlopen(request, timeout=15) as response:
                return response.status, response.read().decode("utf-8", errors="replace")
        except urllib.error.HTTPError as exc:
            return exc.code, ""


def wait_for_server(server: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the control plane exited with {server.returncode}")
        try:
            with urllib.request.urlopen(SERVER + "/admin/login/", timeout=2):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.3)
    raise SystemExit(f"the control plane did not answer on {SERVER} within {timeout}s")


class Supervisor:
    """Keeps one worker agent running, as systemd would with ``Restart=always`` and
    ``RestartPreventExitStatus=4``: whenever it exits — fenced (3), killed, or stopped cleanly by
    someone else — a fresh process starts and registers a new session; never after 4 (its
    credential was refused: re-enrolling is an operator's decision), and at most 5 times a minute.
    The agent runs in its own session, so a Ctrl-C in the terminal reaches only this launcher,
    which then stops it gracefully (SIGTERM: drain, then offline).
    """

    NEVER_RESTART = (4,)

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.process: subprocess.Popen | None = None
        self.stopping = threading.Event()
        self.final_status: int | None = None
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _spawn(self) -> subprocess.Popen:
        return spawn(
            [
                PY,
                "-m",
                "agent",
                "--state-dir",
                str(self.state_dir),
                "run",
                "--max-concurrent",
                "2",
                "--label",
                "zone=local",
                "--poll-max",
                "2",
                "--drain-timeout",
                "30",
            ],
            "agent",
            start_new_session=True,
        )

    def _loop(self) -> None:
        restarts: list[float] = []
        while not self.stopping.is_set():
            self.process = self._spawn()
            status = self.process.wait()
            if self.stopping.is_set():
                self.final_status = status
                return
            restarts = [t for t in restarts if t > time.monotonic() - 60] + [time.monotonic()]
            if status not in self.NEVER_RESTART and len(restarts) <= 5:
                say(f"worker exited with {status}; starting a fresh process (it registers a new session)")
                continue
            say(f"worker exited with {status}; not restarting")
            self.final_status = status
            return

    def stop(self, timeout: float = 60) -> int | None:
        self.stopping.set()
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        self.thread.join(timeout)
        return (
            self.final_status
            if self.final_status is not None
            else (self.process.returncode if self.process else None)
        )


def ensure_task(operator: Operator, name: str, spec: dict) -> None:
    status, body = operator.call("POST", "/api/v1/ops/tasks", {"name": name, **spec})
    if status == 201:
        return
    if status == 400 and body.get("field") == "name":  # exists from an earlier run: add a revision
        status, body = operator.call("POST", f"/api/v1/ops/tasks/{name}/revisions", spec)
        if status == 201:
            return
    raise SystemExit(f"could not create task {name}: {status} {body}")


def ensure_schedule(operator: Operator) -> dict:
    """The scheduled sample's schedule: the one an earlier `make run` created, or a new one."""
    name, spec, schedule = SCHEDULED
    ensure_task(operator, name, spec)
    status, existing = operator.call("GET", f"/api/v1/ops/schedules?task={name}")
    if status == 200 and existing:
        return existing[0]
    status, body = operator.call("POST", "/api/v1/ops/schedules", {"task": name, **schedule})
    if status != 201:
        raise SystemExit(f"could not schedule {name}: {status} {body}")
    return body


class FireWatcher:
    """Prints each new fire of the scheduled sample (its outcome, and its run once it ends)."""

    def __init__(self, operator: Operator, schedule_id: str) -> None:
        self.operator = operator
        self.path = f"/api/v1/ops/schedules/{schedule_id}"
        self.reported: set[str] = set()
        _, body = operator.call("GET", self.path)
        self.known = {fire["fireAt"] for fire in body.get("recentFires", [])}
        self.succeeded = 0

    def poll(self) -> None:
        status, body = self.operator.call("GET", self.path)
        if status != 200:
            return
        for fire in reversed(body["recentFires"]):
            key = fire["fireAt"]
            if key in self.known or key in self.reported:
                continue
            if fire["runId"] is None:
                self.reported.add(key)
                say(f"schedule {SCHEDULED[0]}: fire {key} {fire['outcome']} (x{fire['fires']})")
                continue
            status, run = self.operator.call("GET", f"/api/v1/ops/runs/{fire['runId']}")
            if status != 200 or run["state"] not in TERMINAL:
                continue
            self.reported.add(key)
            self.succeeded += run["state"] == "succeeded"
            tail = ((run["attempts"] or [{}])[-1].get("stdoutTail") or "").strip().splitlines()
            say(
                f"{'ok ' if run['state'] == 'succeeded' else 'BAD'} {SCHEDULED[0]}: fire {key} -> run "
                f"{run['id']} {run['state']}" + (f" — {tail[-1][:80]}" if tail else "")
            )


def main() -> int:
    VAR.mkdir(parents=True, exist_ok=True)
    say("migrating the SQLite database in var/")
    manage("migrate", "--noinput")
    login = dict(part.split("=", 1) for part in manage("create_operator", "admin").split())
    say(f"admin login: {SERVER}/admin/  username={login['username']}  password={login['password']}")
    say(f"operator API token: {login['token']}")
    # Its own session: a terminal Ctrl-C must not kill the control plane before the worker has
    # drained and gone offline through it.
    server = spawn(
        [PY, str(ROOT / "manage.py"), "serve", "--port", str(PORT)], "control-plane", start_new_session=True
    )
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with SIGINT ignored
    supervisor = None
    ok = False
    try:
        wait_for_server(server)
        token = manage("enroll_worker", "local-worker", "--token-only")
        state_dir = VAR / "worker"
        enroll = spawn(
            [
                PY,
                "-m",
                "agent",
                "--state-dir",
                str(state_dir),
                "enroll",
                "--server",
                SERVER,
                "--token",
                token,
                "--worker",
                "local-worker",
            ],
            "agent",
        )
        if enroll.wait() != 0:
            raise SystemExit(f"enrolling the local worker failed with status {enroll.returncode}")
        supervisor = Supervisor(state_dir)
        supervisor.start()
        operator = Operator(login["token"])
        runs = {}
        for name, spec, expected in SAMPLES:
            ensure_task(operator, name, spec)
            status, run = operator.call("POST", "/api/v1/ops/runs", {"task": name})
            if status != 201:
                raise SystemExit(f"could not enqueue {name}: {status} {run}")
            runs[run["id"]] = (name, expected)
            say(f"queued {name}: run {run['id']}")
        schedule = ensure_schedule(operator)
        say(
            f"scheduled {SCHEDULED[0]}: cron {schedule['cron']!r} in {schedule['timezone']}, "
            f"next fires {', '.join(schedule['nextFireTimes'][:3])}"
        )
        fires = FireWatcher(operator, schedule["id"])
        ok = watch(operator, runs, supervisor)
        deadline = time.monotonic() + 90  # the next minute, plus a sweep interval and the run itself
        while ONCE and not fires.succeeded and time.monotonic() < deadline:
            fires.poll()
            time.sleep(1)
        if ONCE and not fires.succeeded:
            say(f"BAD {SCHEDULED[0]}: no scheduled run succeeded within 90 s")
            ok = False
        if not ONCE:
            say(f"serving the admin at {SERVER}/admin/ — Ctrl-C to stop (drain, offline, shutdown)")
            while server.poll() is None:
                fires.poll()
                time.sleep(1)
            say(f"the control plane exited with {server.returncode}")
            ok = False
    except KeyboardInterrupt:
        say("interrupted")
        ok = ok and not ONCE
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the drain short
        if supervisor is not None:
            say("stopping the worker (drain, then offline)")
            status = supervisor.stop()
            if status == 0:
                say("worker drained and went offline cleanly")
            else:
                say(f"worker shutdown failed with status {status}")
                ok = False
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:
            server.kill()
    return 0 if ok else 1


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


TERMINAL = {"succeeded", "failed", "cancelled", "timed_out"}


def watch(
    operator: Operator,
    runs: dict[str, tuple[str, tuple[str, int | None]]],
    supervisor: Supervisor,
    timeout: float = 120,
) -> bool:
    pending = dict(runs)
    ok = True
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        if supervisor.final_status is not None:
            say(
                f"BAD the worker stopped (status {supervisor.final_status}) "
                f"with {len(pending)} sample(s) pending"
            )
            return False
        for run_id, (name, (state, exit_code)) in list(pending.items()):
            status, run = operator.call("GET", f"/api/v1/ops/runs/{run_id}")
            if status != 200 or run["state"] not in TERMINAL:
                continue
            del pending[run_id]
            attempt = run["attempts"][-1] if run["attempts"] else {}
            as_expected = run["state"] == state and (exit_code is None or run["exitCode"] == exit_code)
            ok &= as_expected
            tail = (attempt.get("stdoutTail") or attempt.get("stderrTail") or "").strip().splitlines()
            say(
                f"{'ok ' if as_expected else 'BAD'} {name}: {run['state']} exit={run['exitCode']} "
                f"on {attempt.get('workerName')} (attempt {attempt.get('number')})"
                + (f" — {tail[-1][:80]}" if tail else "")
            )
            # The job's own output lines, as the control plane stored them (its live log).
            status, text = operator.text(f"/api/v1/ops/runs/{run_id}/log")
            for line in text.splitlines()[:20] if status == 200 else []:
                say(f"    {name} | {line[:120]}")
            say(f"    {name}: {SERVER}/admin/runs/run/{run_id}/change/")
        time.sleep(0.3)
    for run_id, (name, _) in pending.items():
        say(f"BAD {name}: run {run_id} did not finish within {timeout}s")
        ok = False
    return ok


if __name__ == "__main__":
    sys.exit(main())
