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
	@$(BIN)/python -c "import temporalio, fastapi, kubernetes, cel" 
	@touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest

test: lint typecheck unit

demo: $(STAMP)
	$(BIN)/osac-workers demo

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
