# One entry point for a fresh machine: `make test` creates .venv, installs raysize with
# its test extra, then runs every check (ruff lint, ruff format, mypy, pytest).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test lint typecheck unit bench bench-ray clean install demo

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy workflows activities worker sandbox

unit: $(STAMP)
	$(BIN)/pytest

test: lint typecheck unit

bench: $(STAMP)
	$(BIN)/python -m bench.plan_bench

# Ours against Ray 2.60's autoscaler v2 scheduler (slow: Ray takes minutes at 2,000 pods)
bench-ray: $(STAMP)
	$(BIN)/python -m bench.ray_compare

# The whole product on this machine (Temporal dev server, sandbox with real Ray, worker);
# pass options with DEMO_ARGS, e.g. make demo DEMO_ARGS="--scenario timeout"
demo: $(STAMP)
	$(BIN)/raysize demo $(DEMO_ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
