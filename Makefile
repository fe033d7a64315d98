# One command each: `make repro` installs everything and runs the default pipeline; `make test` installs
# everything and runs the test suite. Both work on a fresh machine with Python 3.11 and pip.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup repro test lint flow

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip

# torch is pinned in pyproject.toml to the 2.13.0 CPU wheel; an unpinned torch would pull a CUDA build.
setup: $(BIN)/python
	$(BIN)/pip install -e ".[dev]"

repro: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/dvc repro

flow: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python flows/pipeline.py

test: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/ruff check src stages flows tests benchmarks
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/pytest
