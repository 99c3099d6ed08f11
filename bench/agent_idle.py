"""Idle cost of the headless agent: resident memory and CPU while it heartbeats and polls.

Starts a throwaway control plane (``manage.py serve`` on a temporary SQLite file), enrolls a
worker, runs ``qinglong-worker run`` with nothing to do, lets it settle, then samples the agent
process with psutil for ``--seconds``. Budget: idle RSS at most 30 MiB and idle CPU at most
0.2 % of one core (issue 13; docs/performance.md). It also starts an agent with no worker profile
(``QINGLONG_WORKER_ENABLED=0``) and reports its threads and sockets, which must both stay at
their minimum (one thread, no socket). Last line, machine-readable:
``idle_rss_mib=<n> idle_cpu_percent=<n> agent_threads=<n> disabled_threads=<n> disabled_sockets=<n>``.

    make bench-agent            # or: .venv/bin/python bench/agent_idle.py --seconds 30
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent


def disabled_agent(worker: list[str]) -> tuple[int, int]:
    """Threads and sockets of ``run`` with the worker profile disabled, once it has settled."""
    process = subprocess.Popen(
        [*worker, "run"],
        cwd=ROOT,
        env={**os.environ, "QINGLONG_WORKER_ENABLED": "0"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(2.0)
        if process.poll() is not None:  # a disabled agent may also just exit: nothing runs at all
            return 0, 0
        sampled = psutil.Process(process.pid)
        return sampled.num_threads(), len(sampled.net_connections(kind="all"))
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.wait(30)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=30.0, help="sampling window")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds to wait before sampling")
    parser.add_argument("--port", type=int, default=8790)
    args = parser.parse_args()

    var = Path(tempfile.mkdtemp(prefix="ql-bench-agent-"))
    env = {**os.environ, "QINGLONG_VAR_DIR": str(var), "DATABASE_URL": f"sqlite:///{var / 'bench.sqlite3'}"}
    env.pop("QINGLONG_PROFILE", None)
    manage = [sys.executable, str(ROOT / "manage.py")]
    subprocess.run([*manage, "migrate", "-v0"], env=env, check=True, cwd=ROOT)
    server = subprocess.Popen(
        [*manage, "serve", "--port", str(args.port)],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    agent = None
    try:
        url = f"http://127.0.0.1:{args.port}"
        for _ in range(100):
            try:
                urllib.request.urlopen(url + "/admin/login/", timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        token = subprocess.run(
            [*manage, "enroll_worker", "bench-idle", "--token-only"],
            env=env,
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        state = var / "agent"
        worker = [sys.executable, "-m", "agent", "--state-dir", str(state)]
        subprocess.run(
            [*worker, "enroll", "--server", url, "--token", token], check=True, cwd=ROOT, capture_output=True
        )
        agent = subprocess.Popen(
            [*worker, "run", "--poll-max", "5"],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(args.settle)
        process = psutil.Process(agent.pid)
        cpu_before = process.cpu_times()
        started = time.monotonic()
        peak_rss = 0
        while time.monotonic() - started < args.seconds:
            peak_rss = max(peak_rss, process.memory_info().rss)
            time.sleep(0.5)
        elapsed = time.monotonic() - started
        cpu_after = process.cpu_times()
        rss = process.memory_info().rss
        threads = process.num_threads()
        used = (cpu_after.user - cpu_before.user) + (cpu_after.system - cpu_before.system)
        cpu_percent = 100.0 * used / elapsed
        print(
            f"agent idle for {elapsed:.1f}s: RSS {rss / 2**20:.1f} MiB (peak {peak_rss / 2**20:.1f} MiB), "
            f"CPU {used * 1000:.0f} ms = {cpu_percent:.3f} % of one core, {threads} threads"
        )
        print(
            f"budget: RSS ≤ 30 MiB {'met' if rss <= 30 * 2**20 else 'MISSED'}, "
            f"CPU ≤ 0.2 % {'met' if cpu_percent <= 0.2 else 'MISSED'}"
        )
        disabled_threads, disabled_sockets = disabled_agent(worker)
        print(
            f"disabled agent (QINGLONG_WORKER_ENABLED=0): {disabled_threads} thread(s), "
            f"{disabled_sockets} socket(s)"
        )
        print(
            f"idle_rss_mib={rss / 2**20:.1f} idle_cpu_percent={cpu_percent:.3f} agent_threads={threads} "
            f"disabled_threads={disabled_threads} disabled_sockets={disabled_sockets}"
        )
        return 0
    finally:
        if agent is not None and agent.poll() is None:
            agent.send_signal(signal.SIGTERM)
            agent.wait(30)
        server.send_signal(signal.SIGTERM)
        server.wait(15)


if __name__ == "__main__":
    sys.exit(main())
