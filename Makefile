# One command runs what CI runs: `make check` (lint, format check, mypy --strict, tests).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# What running needs (`make run`), and that plus the dev tools (`make install`, test, lint).
RUN_STAMP := $(VENV)/.runtime-stamp
STAMP := $(VENV)/.installed-stamp
# `make run HOST=0.0.0.0 PORT=9000`; unset: serve's own defaults (127.0.0.1:8080, or
# EVENTGATE_HOST / EVENTGATE_PORT).
HOST ?=
PORT ?=

.PHONY: install run test lint typecheck check bench image-check fake-claude screenshots clean

$(RUN_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	touch $(RUN_STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP) $(RUN_STAMP)

install: $(STAMP)

run: $(RUN_STAMP)  ## the gateway on embedded defaults (memory:// Redis, SQLite, built-in config)
	$(BIN)/eventgate serve$(if $(HOST), --host $(HOST))$(if $(PORT), --port $(PORT))

test: $(STAMP)
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check app eventgate_dev tests bench alembic/env.py
	$(BIN)/ruff format --check app eventgate_dev tests bench alembic/env.py

typecheck: $(STAMP)
	$(BIN)/mypy

check: lint typecheck test

image-check: $(STAMP)  ## build the image without a registry and check what it does (root, Debian)
	bash deploy/image-check.sh

bench: $(STAMP)
	$(BIN)/python -m bench.run_all

fake-claude: $(RUN_STAMP)  ## a fake Messages API on :8787 for trying the gateway without a key
	$(BIN)/python -m eventgate_dev.fake_anthropic --port 8787

screenshots: $(STAMP)  ## the console's pages in headless Chromium, into docs/console/*.png
	$(BIN)/python -m tests.console.screenshots

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache eventgate.db*
