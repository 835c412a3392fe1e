# Two commands on a fresh machine (README "Quick start"):
#   make demo   install into .venv, make the example traces, ingest them and report
#   make test   install into .venv with the test extras and run the test suite (all of it, as CI: .ci/run)
#   make test-fast   the same less the tests marked slow (pytest -m "not slow"): under 3 minutes on
#               2 idle cores, the loop to run while you work; make test and CI still run everything
#   make docs   the docs site into site/ (warnings are errors); make docs-images retakes its screenshots
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch first, pinned: a CPU build is installed locally; an unpinned torch pulls GBs of CUDA wheels.
TORCH := torch==2.13.0

.PHONY: demo test test-fast docs docs-images venv clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed-demo: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e ".[collectors]"
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e ".[test]"
	touch $@

demo: $(VENV)/.installed-demo
	PYTHON=$(abspath $(BIN)/python) bash examples/make_demo.sh ddp
	rm -f examples/out/demo.duckdb
	$(BIN)/traceq ingest examples/out/demo-ddp --db examples/out/demo.duckdb
	$(BIN)/traceq report --metric exposed_comm --db examples/out/demo.duckdb

test: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q

test-fast: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q -m "not slow"

docs: $(VENV)/.installed-test
	$(BIN)/mkdocs build --strict

docs-images: $(VENV)/.installed-demo
	$(BIN)/python docs/make_images.py

clean:
	rm -rf $(VENV) examples/out build dist *.egg-info site
