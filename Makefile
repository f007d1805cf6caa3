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
	$(BIN)/ruff check src tests benchmarks examples deploy
	$(BIN)/ruff format --check src tests benchmarks examples deploy

typecheck: $(BIN)/.installed
	$(BIN)/mypy

bench: $(BIN)/.installed  ## figures, not pass/fail
	$(BIN)/python benchmarks/evict_latency.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

# Wheels of ebbtide and its runtime dependencies (CPython 3.12, Linux x86_64) for
# benchmarks/gpu_check.py on a GPU machine without a package index; there:
#   python3 -m pip install --no-index --find-links .gpu-wheels ebbtide
GPU_WHEELS ?= .gpu-wheels
.PHONY: gpu-check-wheels
gpu-check-wheels: $(BIN)/.installed
	rm -rf $(GPU_WHEELS)
	$(BIN)/pip wheel --quiet --no-deps --wheel-dir $(GPU_WHEELS) .
	$(BIN)/pip download --quiet --only-binary=:all: --implementation cp --python-version 3.12 \
		--platform manylinux2014_x86_64 --dest $(GPU_WHEELS) $(GPU_WHEELS)/ebbtide-*.whl
	@echo "$(GPU_WHEELS): $$(ls $(GPU_WHEELS) | wc -l) wheels, $$(du -sh $(GPU_WHEELS) | cut -f1)"
