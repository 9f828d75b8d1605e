# omnirl — the two commands a new machine needs: `make demo` and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_OUT ?= runs/demo

.PHONY: install test lint demo demo-nft bench chart e2e crd clean

install: $(STAMP)

# Debian packages: redis-server (the TransferQueue in local mode and in tests) and DejaVu fonts
# (the built-in OCR task renders its training images with them).
$(STAMP): pyproject.toml
	@if ! command -v redis-server >/dev/null || [ ! -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ]; then \
	  echo "installing redis-server and DejaVu fonts (apt-get)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server fonts-dejavu-core fonts-dejavu-extra >/dev/null; \
	fi
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first and pinned: the CPU build on disk; nothing after this may pull another torch.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	@$(BIN)/python -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	@touch $(STAMP)

lint: install
	$(BIN)/ruff check services operator tests e2e benchmarks
	$(BIN)/lint-imports

test: install lint
	$(BIN)/pytest -q

demo: install
	$(BIN)/omnirl run examples/ocr-nft.yaml --out $(DEMO_OUT)

demo-flowgrpo: install
	$(BIN)/omnirl run examples/ocr-flowgrpo.yaml --out runs/demo-flowgrpo

crd: install
	$(BIN)/omnirl crd > crds/rljob.yaml

bench: install
	$(BIN)/python -m benchmarks.run

chart: install
	$(BIN)/pytest -q tests/test_chart.py

e2e: install
	$(BIN)/pytest -q e2e

clean:
	rm -rf $(VENV) runs build *.egg-info
