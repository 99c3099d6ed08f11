"""The headless agent (and the protocol package it shares) imports no Django (ADR-0012 §5)."""

import subprocess
import sys


def test_agent_imports_no_django():
    code = (
        "import sys, agent.cli, agent.runtime, agent.attempts, agent.calls, agent.claims, agent.heartbeat, "
        "agent.rotation, agent.session, agent.client, agent.executor, agent.capabilities, agent.state, "
        "protocol.capabilities, protocol.errors, protocol.messages, protocol.signing, protocol.strictjson, "
        "protocol.wire\n"
        "leaked = sorted(m for m in sys.modules\n"
        "                if m == 'django' or m.startswith(('django.', 'rest_framework')))\n"
        "assert not leaked, leaked\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_disabled_agent_starts_nothing(tmp_path):
    code = (
        "import os, sys, threading, socket\n"
        "os.environ['QINGLONG_WORKER_ENABLED'] = '0'\n"
        "opened = []\n"
        "real = socket.socket.connect\n"
        "socket.socket.connect = lambda self, *a: opened.append(a) or real(self, *a)\n"
        "from agent.cli import main\n"
        f"status = main(['--state-dir', {str(tmp_path)!r}, 'run'])\n"
        "assert status == 0, status\n"
        "assert threading.active_count() == 1, threading.enumerate()\n"
        "assert not opened, opened\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
