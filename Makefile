# The README's two commands: `make demo` and `make test`. Both create .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

.PHONY: install demo test test-fast lint
install: $(BIN)/.installed

demo: $(BIN)/.installed
	$(BIN)/evident demo

lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python tools/check_sizes.py

test: lint
	$(BIN)/pytest

# The inner loop: everything but the modules marked slow (well under a minute on 2 cores).
test-fast: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/pytest -m "not slow" -x
