# The README's two commands: `make demo` and `make test`. Both create .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

# torch's CPU build (183 MiB) from PyTorch's CPU index first: from PyPI alone, torch==2.13.0 is the CUDA
# build and its NVIDIA libraries (`pip install --dry-run --report`: 111 packages, 2,807 MiB, against 92
# packages, 386 MiB). Where that index is unreachable pip goes on with the configured ones (no retries:
# each of torch's dependencies would wait out five).
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu

$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q --retries 0 --timeout 30 --extra-index-url $(TORCH_INDEX) 'torch==2.13.0'
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

.PHONY: install demo test test-fast lint image image-smoke
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

# The container (deploy/Dockerfile) built and smoke-tested with buildah: needs root and a few minutes, so not
# part of `make test`. See deploy/image.sh for the base image and where torch's CPU wheel comes from.
image:
	bash deploy/image.sh

image-smoke:
	bash deploy/smoke.sh
