# One entry point for set-up, tests and running. Everything installs into .venv.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv constraints test check docs-check lint format bench-qoe clean run vllm vllm033 mypy-vllm system-deps bench-gateway webui sdk-web release-check

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# The server and, next to it, the client distribution (sdk_python/, tokenpace-client), at
# the versions the tests passed with: constraints.txt, `make constraints` after a change.
# setuptools warns about every editable install (a banner per package, even with
# --quiet); the warning is about this very layout, so it is silenced here.
$(STAMP): $(BIN)/python pyproject.toml sdk_python/pyproject.toml constraints.txt
	PYTHONWARNINGS="ignore:Editable installation" \
		$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]' -e './sdk_python[openai]'
	touch $(STAMP)

venv: $(STAMP)

# Rewrite constraints.txt from .venv (everything but the project's own editable packages
# and pip; setuptools included, which the release builds use): after changing a
# dependency, `make venv constraints`, run the tests, commit both.
constraints: venv
	{ echo "# pip constraints: the versions \`make venv\` installs (\`make constraints\` writes it)"; \
	  $(BIN)/pip freeze --exclude-editable --all | grep -v '^pip=='; } > constraints.txt

# What mypy checks (configuration: pyproject.toml, [tool.mypy]); add a package here once
# it passes.
MYPY_PATHS := qos gateway sdk_python/tokenpace_client

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy $(MYPY_PATHS)

format: venv
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# vLLM's CPU build in its own .venv-vllm plus the offline models the vLLM tests and
# bench use (.models/tiny-llama, .models/small-llama); idempotent, scripts/setup-vllm.sh.
vllm:
	PYTHON=$(PYTHON) scripts/setup-vllm.sh

# vLLM 0.33's scheduler code (its GPU wheel with a CPU torch, no model can run) in its own
# .venv-vllm033, for the plugin's scheduler cases and step-overhead bench on 0.33 until a
# CPU build of 0.33 exists; idempotent, scripts/setup-vllm033.sh (under 7 minutes, 2.7 GB).
vllm033:
	PYTHON=$(PYTHON) scripts/setup-vllm033.sh

# The vLLM plugin checked against vLLM's own types: `make lint` runs before vLLM is
# installed and sees it as untyped (pyproject.toml); this run sees the real thing.
mypy-vllm: venv vllm vllm033
	$(BIN)/mypy --python-executable .venv-vllm/bin/python --follow-imports=silent \
		--cache-dir .mypy_cache/vllm qos/vllm
	$(BIN)/mypy --python-executable .venv-vllm033/bin/python --follow-imports=silent \
		--cache-dir .mypy_cache/vllm033 qos/vllm

# System packages the tests use (redis-server, chromium and espeak-ng, from Debian); a no-op
# when present. Node.js >= 20 must be there already (scripts/check-node.sh says so).
system-deps:
	scripts/install-system-deps.sh

# The web SDK (sdk_web/) and the gateway's web pages (webui/: /demo and /dashboard, built
# with the SDK and uPlot into webui/dist, which the gateway serves). `npm ci` installs
# each lock file's exact versions; the stamps keep both from being redone every time.
NPM ?= npm
NPM_CI := $(NPM) ci --no-audit --no-fund --loglevel=error
sdk_web/node_modules/.installed: sdk_web/package.json sdk_web/package-lock.json
	scripts/check-node.sh
	cd sdk_web && $(NPM_CI)
	touch $@

webui/node_modules/.installed: webui/package.json webui/package-lock.json
	scripts/check-node.sh
	cd webui && $(NPM_CI)
	touch $@

sdk-web: sdk_web/node_modules/.installed
	cd sdk_web && $(NPM) run build

WEBUI_SOURCES := $(wildcard webui/src/* sdk_web/src/*.ts) webui/build.mjs
webui/.built: webui/node_modules/.installed $(WEBUI_SOURCES)
	cd webui && $(NPM) run build
	touch $@

webui: webui/.built

# The release artefacts, built from a clean tree: both Python distributions (`python -m
# build`: tokenpace, sdk_python's tokenpace-client) and the web SDK (`npm pack`), each
# installed into a fresh virtualenv or scratch npm project and imported (about 1.5 min).
release-check: venv sdk_web/node_modules/.installed
	scripts/check-release.sh

# The docs name only files, folders and sections that exist (scripts/docs_check.py).
docs-check:
	$(PYTHON) scripts/docs_check.py

# While developing, under 3 minutes: lint, docs-check and the tests that need nothing
# but .venv (the policies, the simulator, the client's pacing, the gateway's
# configuration and request checks); no vLLM, Redis, browser or release builds.
CHECK_TESTS := tests/qos --ignore=tests/qos/vllm sdk_python/tests tests/docs/test_docs_check.py \
	tests/gateway/config tests/gateway/request tests/gateway/test_architecture.py
check: venv lint docs-check
	$(BIN)/pytest -q $(CHECK_TESTS)

# Everything CI runs (about 30 minutes on 2 cores): system packages (sudo apt-get),
# vLLM's CPU build with torch, vLLM 0.33's scheduler code (.venv-vllm033), the npm
# packages; then lint, docs-check, the Python tests, the web SDK's unit tests, the pages
# in Chromium (webui/test/), the release artefacts.
test: venv lint docs-check vllm vllm033 mypy-vllm system-deps sdk-web webui
	$(BIN)/pytest -q
	cd sdk_web && $(NPM) test
	cd webui && $(NPM) test
	$(MAKE) release-check

bench-qoe: venv
	$(BIN)/tokenpace bench qoe --out results/qoe

# What the gateway costs: direct vs tokenpace vs the LiteLLM proxy, in one run (a few
# minutes; docs/benchmarks.md, "Gateway cost"). LiteLLM lives in its own .venv-litellm.
LITELLM_VENV := .venv-litellm
$(LITELLM_VENV)/bin/litellm:
	$(PYTHON) -m venv $(LITELLM_VENV)
	$(LITELLM_VENV)/bin/pip install --quiet --upgrade pip
	$(LITELLM_VENV)/bin/pip install --quiet 'litellm[proxy]==1.106.2'

bench-gateway: venv $(LITELLM_VENV)/bin/litellm
	$(BIN)/python bench/gateway_load.py --litellm $(LITELLM_VENV)/bin/litellm --out results/gateway_load

# The gateway on its embedded SIMULATED engine (no model runs), with its pages /demo and
# /dashboard; `make run PORT=9000`.
run: HOST = 127.0.0.1
run: PORT = 8000
run: venv webui
	$(BIN)/tokenpace serve --host $(HOST) --port $(PORT)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache webui/dist webui/.built webui/test-artifacts
