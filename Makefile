# The README's two commands. Both create .venv when it is missing and install what is needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.shipyard-installed

.PHONY: quickstart test setup lint clean

quickstart: setup
	$(BIN)/shipyard quickstart

test: setup lint
	$(BIN)/pytest

setup: $(STAMP)

# torch is pinned on its own line first: on CPU machines pip takes the local CPU build of 2.13.0,
# on GPU machines the same pin gives the CUDA build; nothing later may pull another torch.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[train,finetune,nvidia,plot,postgres,s3,cluster,dev]'
	touch $@

lint: setup
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
