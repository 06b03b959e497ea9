# One entry point for a fresh machine: `make test` creates .venv, installs raysize with
# its test extra, then runs every check (ruff lint, ruff format, mypy, pytest).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test lint typecheck unit suite suite-serial bench bench-ray clean install demo control-plane conformance-1.33 browser chart-docs docs

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# The real test world, built from published Go modules into ~/.cache/raysize (keyed by
# version: only the first run on a machine builds, ~10 min on 2 cores): kube-apiserver,
# kube-scheduler and kube-controller-manager (one module: sandbox/go/kubernetes-<version>),
# etcd, the KubeRay operator and its CRDs, Karpenter v1.15 with its kwok provider and CRDs
# (sandbox/go/karpenter: its module asks for Go 1.26.9, fetched by `go` for that part if the
# local one is older); and for the deploy/ tests helm v3.22.0 and the Prometheus Operator's
# CRDs (downloaded as a Go module). Needs Go 1.26+ and openssl.
KUBERNETES_VERSION ?= v1.36.3
control-plane:
	bash scripts/build_control_plane.sh $(KUBERNETES_VERSION)

# deploy/helm/raysize/README.md from its README.md.gotmpl and values.yaml's `# --` comments,
# with the helm-docs control-plane builds (tests/deploy/test_helm_docs.py fails when stale)
chart-docs: control-plane
	cd deploy/helm/raysize && "$$(sed -n 's/^helm_docs=//p' "$${XDG_CACHE_HOME:-$$HOME/.cache}/raysize/control-plane/env-$(KUBERNETES_VERSION)")" \
	  --chart-search-root . --skip-version-footer --log-level warning

# Debian's Chromium, for the test that looks at the Temporal UI in a headless browser
# (tests/orchestration/test_temporal_ui.py); installed once per machine, as root or with sudo
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }
	@chromium --version

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-logo
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# The user guide (mkdocs.yml, docs/) on http://127.0.0.1:8000, rebuilt as you edit;
# `make lint` builds it with --strict into build/site (git-ignored)
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

typecheck: $(STAMP)
	$(BIN)/mypy raysize bench

# every test, every tier (tests/conftest.py): what CI runs. Three parts at once (the real
# control plane; the embedded world's e2e tests and real Ray; the rest), then each tier's
# time: scripts/run_suite.py. `make suite-serial` runs one pytest, as before
suite: $(STAMP) control-plane browser
	$(BIN)/python scripts/run_suite.py

suite-serial: $(STAMP) control-plane browser
	$(BIN)/pytest

# the unit tier alone: pure code and offline parsing, no server (seconds)
unit: $(STAMP)
	$(BIN)/pytest -m unit

test: lint typecheck suite

# The API conformance suite against the first Kubernetes with pods/resize (README lists
# the results); `make test` runs it against $(KUBERNETES_VERSION) and the sandbox.
conformance-1.33: $(STAMP)
	bash scripts/build_control_plane.sh v1.33.13
	RAYSIZE_TEST_KUBERNETES_VERSION=v1.33.13 RAYSIZE_TEST_WORLDS=real \
	  $(BIN)/pytest tests/sandbox/test_conformance.py tests/sandbox/test_conformance_kubelet.py

bench: $(STAMP)
	$(BIN)/python -m bench.plan_bench

# Ours against Ray 2.60's autoscaler v2 scheduler (slow: Ray takes minutes at 2,000 pods)
bench-ray: $(STAMP)
	$(BIN)/python -m bench.ray_compare

# The whole product on this machine (Temporal dev server, sandbox with real Ray, worker);
# pass options with DEMO_ARGS, e.g. make demo DEMO_ARGS="--scenario timeout"
demo: $(STAMP)
	$(BIN)/raysize demo $(DEMO_ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
