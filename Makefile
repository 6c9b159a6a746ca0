# The README's two commands. Both create .venv when it is missing and install what is needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.shipyard-installed

.PHONY: quickstart test setup browser lint clean ui-vendor

quickstart: setup bytecode
	$(BIN)/shipyard quickstart

# Two workers: most tests wait on the processes they start (agents, training, servers).
TEST_WORKERS ?= 2
test: setup browser services lint bytecode
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup
	$(BIN)/pytest -m serial

# The tests start thousands of Python processes (the CLI, agents, training ranks). Where the
# environment sets PYTHONDONTWRITEBYTECODE none would save its compiled modules, and each would
# compile the package's sources again (0.1-0.2 s of CPU a process); compiled once here, all read them.
.PHONY: bytecode
bytecode: setup
	$(BIN)/python -m compileall -q src tests > /dev/null

setup: $(STAMP)

# torch is pinned on its own line first: on CPU machines pip takes the local CPU build of 2.13.0,
# on GPU machines the same pin gives the CUDA build; nothing later may pull another torch.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[train,finetune,nvidia,plot,postgres,s3,cluster,gavel,dev]'
	touch $@

# The dashboard's browser tests: Debian's Chromium (driven by Playwright, no browser download) and
# axe-core for the accessibility checks. Where Chromium cannot be installed (no apt, no root) the
# tests say so and skip; the stamp waits for a machine where it can.
AXE_VERSION := 4.14.1
BROWSER_STAMP := $(VENV)/.browser-ready
browser: $(BROWSER_STAMP)

$(BROWSER_STAMP): $(STAMP)
	command -v chromium >/dev/null || (DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium \
	  || (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium)) >/dev/null \
	  || echo "Chromium could not be installed: the dashboard's browser tests will skip"
	test -f $(VENV)/axe.min.js || (cd $(VENV) && npm pack --silent axe-core@$(AXE_VERSION) >/dev/null \
	  && tar xzf axe-core-$(AXE_VERSION).tgz package/axe.min.js && mv package/axe.min.js axe.min.js \
	  && rm -rf package axe-core-$(AXE_VERSION).tgz) || echo "axe-core could not be fetched"
	if command -v chromium >/dev/null && test -f $(VENV)/axe.min.js; then touch $@; fi

# Redis, the state store of the cluster test whose head restarts under a running job (Debian's
# redis-server; the test starts its own on a free port). Where it cannot be installed, that test
# says so and skips.
.PHONY: services
services:
	command -v redis-server >/dev/null || (DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
	  redis-server >/dev/null) || echo "redis-server could not be installed: the head-restart test will skip"
	command -v slurmctld >/dev/null || (DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
	  slurm-wlm >/dev/null) || echo "slurm-wlm could not be installed: the Slurm tests will skip"

# Refresh the dashboard's third-party files (committed: the package works with no network).
UI_VENDOR := src/shipyard/api/ui/static/vendor
ui-vendor:
	rm -rf .ui-vendor && mkdir .ui-vendor && cd .ui-vendor && npm pack --silent htmx.org@2.0.11 \
	  uplot@1.6.32 swagger-ui-dist@5.35.0 >/dev/null && for f in *.tgz; do tar xzf $$f; \
	  mv package $${f%.tgz}; done
	cp .ui-vendor/htmx.org-2.0.11/dist/htmx.min.js .ui-vendor/uplot-1.6.32/dist/uPlot.iife.min.js \
	  .ui-vendor/uplot-1.6.32/dist/uPlot.min.css .ui-vendor/swagger-ui-dist-5.35.0/swagger-ui-bundle.js \
	  .ui-vendor/swagger-ui-dist-5.35.0/swagger-ui.css $(UI_VENDOR)/
	rm -rf .ui-vendor

lint: setup
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
