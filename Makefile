# ebbtide developer commands.  Each target installs what it needs into .venv first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: demo test unit lint typecheck bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@

demo: $(BIN)/.installed  ## a one-command tour on simulated GPUs
	$(BIN)/ebb demo

test: $(BIN)/.installed  ## the whole suite: unit, integration (Redis, PostgreSQL), end to end
	$(BIN)/pytest

unit: $(BIN)/.installed  ## the fast tier only
	$(BIN)/pytest tests/unit

lint: $(BIN)/.installed
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples

typecheck: $(BIN)/.installed
	$(BIN)/mypy

bench: $(BIN)/.installed  ## figures, not pass/fail
	$(BIN)/python benchmarks/evict_latency.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
