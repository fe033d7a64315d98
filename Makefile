# One command each: `make repro` installs everything and runs the default pipeline; `make test` installs
# everything and runs the test suite. Both work on a fresh machine with Python 3.11 and pip.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: torch setup setup-dev repro smoke test lint flow

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip

# torch is pinned in pyproject.toml to the 2.13.0 CPU wheel; an unpinned torch would pull a CUDA build.
# The pipeline needs the project alone; the test tools (`dev`: pytest, moto's S3 server, ruff, ...)
# are installed for `make test` only, since `make repro`'s install counts against its time limit.
# TORCH_INDEX: where to take torch's CPU wheel from first, on a machine whose pip sees only PyPI
# (there the pin resolves to the CUDA build): make repro TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=

# pip byte-compiles what it installs one file at a time; compileall does the same on every core after
# it (pip's own run skips a file that does not compile, such as torch's Python 3.12 test helpers, and
# so does this one: its status is ignored). Measured on 2 cores, a fresh venv: `pip install -e .`
# 184 s; with --no-compile 64 s, then compileall 70 s. The .pyc files matter: this project's machines
# set PYTHONDONTWRITEBYTECODE, so a package left uncompiled is compiled again by every stage's import.
# Packages' own test suites (`*/tests/`, 47 MB of the 324 MB of Python: pandas', scipy's, ...) are left
# out: nothing imports them (checked: every module the stages and the flow import has its .pyc). In
# one venv, three runs each: 82-94 s with them, 55-75 s without. This machine's timings are noisy:
# two fresh-clone `make setup` runs, one after the other, took 156 s (with) and 160 s (without).
PIP_INSTALL := $(BIN)/pip install --no-compile
SITE_PACKAGES = $(shell $(BIN)/python -c "import sysconfig; print(sysconfig.get_path('purelib'))")
COMPILE := $(BIN)/python -m compileall -q -j 0 -x /tests/

torch: $(BIN)/python
	$(if $(TORCH_INDEX),$(PIP_INSTALL) --index-url $(TORCH_INDEX) torch==2.13.0,@true)

setup: torch
	$(PIP_INSTALL) -e .
	@$(COMPILE) "$(SITE_PACKAGES)" > /dev/null || true

setup-dev: torch
	$(PIP_INSTALL) -e ".[dev]"
	@$(COMPILE) "$(SITE_PACKAGES)" > /dev/null || true

repro: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/dvc repro

# The whole pipeline at toy size (profiles/smoke.yaml) in a throwaway copy of the working tree, in a few
# minutes: checks that every stage runs, not results; artifacts/, reports/ and dvc.lock stay as they are.
# SMOKE_DIR: where the copy goes (default: a new temporary folder).
SMOKE_DIR ?=

smoke: setup
	$(BIN)/python scripts/smoke.py $(SMOKE_DIR)

flow: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python flows/pipeline.py

test: setup-dev
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/ruff check src stages flows tests benchmarks scripts
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/ruff format --check src stages flows tests benchmarks scripts
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/pytest
