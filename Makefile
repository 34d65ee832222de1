# anarchon: `make demo` for a first look, `make test` for the whole suite, `make bench` for figures.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test lint typecheck services install install-test bench clean

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
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests

typecheck: install-test
	$(BIN)/mypy

## Everything CI runs: install, services, lint, types, the whole suite.
test: install-test services lint typecheck
	$(BIN)/pytest

clean:
	rm -rf $(VENV) build dist src/*.egg-info .mypy_cache .ruff_cache .pytest_cache
