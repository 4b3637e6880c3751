# The two commands: `make demo` and `make test`. Both create the virtualenv when it is missing.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test lint typecheck unit venv clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Re-install only when the project metadata changes; pip's notices about local indexes are noise.
$(STAMP): pyproject.toml | $(BIN)/python
	@$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test]' 2>&1 \
		| grep -v -e "^WARNING: Location" || true
	@$(BIN)/python -c "import temporalio, fastapi, kubernetes, cel, xdist"
	@touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# Two test processes (one dev server each), a file at a time per process: most tests wait on the
# server and the twins rather than use a core, so two halve the suite's time on the 2-core machine.
TEST_PROCESSES ?= 2
unit: $(STAMP)
	$(BIN)/pytest -n $(TEST_PROCESSES) --dist loadfile

test: lint typecheck unit

# dev up (Temporal dev server, lab twins, worker, controller; state in .osac-dev), the scripted
# ClusterOrder scenario, a summary, then dev down unless DEMO_KEEP=1. Exits non-zero if a step failed.
demo: $(STAMP)
	$(BIN)/osac-workers demo

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache

# Benchmark (bench/README.md): `make bench-quick` N=100 (5 to 8 minutes), `make bench` N=500 (about 13 minutes).
.PHONY: bench bench-quick
bench: $(STAMP)
	$(BIN)/python -m bench.run --full

bench-quick: $(STAMP)
	$(BIN)/python -m bench.run --quick

# Chaos harness (issue #8): `make chaos SEEDS=10` runs the 50-worker scenario once per seed.
SEEDS ?= 1
.PHONY: chaos
chaos: $(STAMP)
	$(BIN)/python -m bench.chaos --seeds $(SEEDS)
