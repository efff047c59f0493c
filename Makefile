# One command runs what CI runs: `make check` (lint, format check, mypy --strict, tests).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: install run test lint typecheck check bench image-check fake-claude screenshots clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)  ## the gateway on embedded defaults (memory:// Redis, SQLite, built-in config)
	$(BIN)/eventgate serve

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

fake-claude: $(STAMP)  ## a fake Messages API on :8787 for trying the gateway without a key
	$(BIN)/python -m eventgate_dev.fake_anthropic --port 8787

screenshots: $(STAMP)  ## the console's pages in headless Chromium, into docs/console/*.png
	$(BIN)/python -m tests.console.screenshots

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache eventgate.db*
