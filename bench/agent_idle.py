"""Idle cost of the headless agent: resident memory and CPU while it heartbeats and polls.

Starts a throwaway control plane (``manage.py serve`` on a temporary SQLite file), enrolls a
worker, runs ``qinglong-worker run`` with nothing to do, lets it settle, then samples the agent
process with psutil for ``--seconds``. Budget: idle RSS under 40 MiB and idle CPU
under 0.5 % of one core. Last line, machine-readable:
``agent_idle_rss_mib=<n> agent_idle_cpu_percent=<n> agent_threads=<n>``.

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
            f"budget: RSS < 40 MiB {'met' if rss < 40 * 2**20 else 'MISSED'}, "
            f"CPU < 0.5 % {'met' if cpu_percent < 0.5 else 'MISSED'}"
        )
        print(
            f"agent_idle_rss_mib={rss / 2**20:.1f} agent_idle_cpu_percent={cpu_percent:.3f} "
            f"agent_threads={threads}"
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
