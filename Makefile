# The two commands a newcomer needs: `make run` and `make test` (see README.md).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
PG_URL ?= postgres://postgres@127.0.0.1:5432/qinglong
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: chromium valgrind run test test-sqlite test-postgres bench-heartbeat bench-claim bench-agent bench-serving bench-logs bench-dispatch bench-instructions chaos lint clean

$(VENV)/.base: requirements/base.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -r requirements/base.txt
	$(PIP) install --no-deps -e .
	touch $@

$(VENV)/.dev: $(VENV)/.base requirements/dev.txt | chromium
	$(PIP) install -r requirements/dev.txt
	touch $@

## chromium: Debian's browser for the browser tests (tests/browser/); Playwright never downloads one
CHROMIUM ?= /usr/bin/chromium
chromium:
	@test -x $(CHROMIUM) || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium; }

## run: control plane + a real local worker running four sample jobs (ONCE=1: exit after them)
run: $(VENV)/.base
	$(PY) scripts/launch.py

## test: the whole suite on SQLite, then on PostgreSQL ($(PG_URL))
test: $(VENV)/.dev chromium
	$(PY) scripts/run_tests.py --pg-url $(PG_URL) $(ARGS)

test-sqlite: $(VENV)/.dev
	$(PY) scripts/run_tests.py --only sqlite $(ARGS)

test-postgres: $(VENV)/.dev
	$(PY) scripts/run_tests.py --only postgres --pg-url $(PG_URL) $(ARGS)

## bench-agent: idle RSS and CPU of the headless agent (budget: ≤ 30 MiB, ≤ 0.2 % of a core)
bench-agent: $(VENV)/.dev
	$(PY) bench/agent_idle.py $(ARGS)

## bench-claim: claims/s, p50/p99 claim latency (1/4/16 claimers, 1k/100k backlog), signed-HTTP claim+complete
## loops (16 workers) and pgbench, all in one run
## on PostgreSQL; wipes the QingLong tables of $(BENCH_PG_URL) (created if missing)
BENCH_PG_URL ?= postgres://postgres@127.0.0.1:5432/qinglong_bench
bench-claim: $(VENV)/.dev
	$(PY) bench/claim.py --pg-url $(BENCH_PG_URL) $(ARGS)

## bench-instructions: instructions per claim -> release loop and per signed claim loop (in process), counted
## by valgrind's callgrind: the same count whatever else the machine does, for changes of a few per cent
## that the timed benchmarks cannot tell from their noise; wipes the QingLong tables of $(BENCH_INSTR_PG_URL)
BENCH_INSTR_PG_URL ?= postgres://postgres@127.0.0.1:5432/qinglong_instructions_bench
bench-instructions: $(VENV)/.dev valgrind
	$(PY) bench/instructions.py --pg-url $(BENCH_INSTR_PG_URL) $(ARGS)

## valgrind: Debian's, for bench-instructions
valgrind:
	@command -v valgrind >/dev/null || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y valgrind; }

## bench-logs: log throughput per worker (MiB/s), one append's statements and CPU, and claims/s with 16 jobs
## logging vs none (alternating windows of one run, with the CPU the loggers take), in-process and
## over signed HTTP (manage.py serve: the server CPU per chunk), on PostgreSQL; wipes the
## QingLong tables of $(BENCH_LOGS_PG_URL) (created if missing); ARGS="--port N" picks the port
BENCH_LOGS_PG_URL ?= postgres://postgres@127.0.0.1:5432/qinglong_logs_bench
bench-logs: $(VENV)/.dev
	$(PY) bench/logs.py --pg-url $(BENCH_LOGS_PG_URL) $(ARGS)

## lint: style (ruff check, ruff format --check), the layer contracts (import-linter), types (mypy)
lint: $(VENV)/.dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) var .pytest_cache .hypothesis

## bench-heartbeat: heartbeats/s over signed HTTP next to pgbench, WAL bytes per unchanged heartbeat vs a naive update
## (migrates the PostgreSQL database at BENCH_PG_URL, the benchmarks' own database)
bench-heartbeat: $(VENV)/.dev
	$(PY) bench/heartbeat.py --pg-url $(BENCH_PG_URL) $(ARGS)

## bench-serving: the serving stack measured: signed heartbeats/s and 300 slow clients against waitress,
## uvicorn, hypercorn and granian (docs/deploy.md); a fresh SQLite database in a temporary directory
bench-serving: $(VENV)/.dev
	$(PY) bench/serving.py $(ARGS)

## bench-dispatch: enqueue->starting and cancel->stopped latency, idle requests per worker, long polling
## next to short polling (real agents), then 1,000 simulated idle workers holding waiting claims
## (docs/deploy.md); a fresh SQLite database in a temporary directory (ARGS="--pg-url URL" for PostgreSQL)
bench-dispatch: $(VENV)/.dev
	$(PY) bench/dispatch.py $(ARGS)

## chaos: replica kill, Redis stop, PostgreSQL restart and a worker partition against a private cluster
## (its own PostgreSQL and Redis on ports 17200-17299), real agents and simulated workers; invariants
## checked in the database; last line: runs= lost= double_executions= http_5xx= html_500=
chaos: $(VENV)/.dev
	$(PY) bench/chaos.py $(ARGS)
