# Two commands do everything on a fresh machine (see README.md):
#   make book   - build the static site into _build/html
#   make test   - run every check CI runs
# Both create .venv and install the pinned requirements first when needed.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
# The environment is (re)installed when requirements.txt or pyproject.toml change in
# content: a checkout that only gives them a new file time reinstalls nothing.
STAMP := $(VENV)/.installed-$(shell cat requirements.txt pyproject.toml | cksum | cut -d' ' -f1)
# JupyterLab opens a chapter's .md as a notebook on a double-click (this venv only).
LAB_SETTINGS := $(VENV)/share/jupyter/lab/settings/overrides.json
MATHJAX := book/_vendor/site/_vendor/mathjax/tex-chtml.js
NB ?=
# The kernels nbval starts must not use the Agg backend, nor warn about frozen modules.
export PYDEVD_DISABLE_FILE_VALIDATION := 1
unexport MPLBACKEND

.PHONY: help venv setup book test portability package workbook lint unit notebooks check-notebooks nbval site-build browser bench lab clean

help:
	@echo "make book        build the site into _build/html (sets up .venv first)"
	@echo "make test        run every test: lint, unit, notebooks, nbval, strict build, browser"
	@echo "make portability unit tests and nbval again on simulated older CPUs (CI runs it too)"
	@echo "make notebooks   regenerate book/notebooks/*.ipynb from book/chapters/*.md (NB=name for one)"
	@echo "make workbook    write the exercises without solutions to workbook/ (REFRESH=1 rewrites)"
	@echo "make lab         open the book in JupyterLab"
	@echo "make package     pip install . into an empty venv and import mha (CI runs it too)"

# PyPI's Linux wheel of torch brings several GB of CUDA libraries. With
# TORCH_INDEX=https://download.pytorch.org/whl/cpu the CPU-only build of the pinned
# version is installed first, and the pin accepts it (2.13.0+cpu is 2.13.0).
TORCH_INDEX ?=
TORCH_PIN := $(shell grep '^torch==' requirements.txt)

$(STAMP):
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(if $(TORCH_INDEX),$(PY) -m pip install --quiet '$(TORCH_PIN)' --index-url $(TORCH_INDEX))
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	rm -f $(VENV)/.installed*
	touch $(STAMP)

# What running and writing chapters needs: the Python environment only.
venv: $(STAMP)

# MathJax comes from the npm registry at set-up time and is served by the site itself:
# the one bundle the pages load (TeX in, HTML out) and what its menu loads on demand
# (accessibility and speech, other renderers, TeX extensions), not the other bundles.
# axe-core, from the same manifest, is for the browser tests only.
MATHJAX_PARTS := tex-chtml.js input output a11y sre ui
$(MATHJAX): book/_vendor/package.json book/_vendor/package-lock.json
	cd book/_vendor && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error
	rm -rf book/_vendor/site && mkdir -p book/_vendor/site/_vendor/mathjax
	cd book/_vendor/node_modules/mathjax/es5 && cp -r $(MATHJAX_PARTS) ../../../site/_vendor/mathjax/
	touch $(MATHJAX)

# What building the site needs besides: MathJax.
setup: venv $(MATHJAX)

book: setup site-build
	@echo "site: _build/html/index.html"

# Strict build: any warning (broken reference, missing figure, ...) fails it.
site-build: setup
	rm -rf _build/html _build/.doctrees
	$(BIN)/jupyter-book build . --builder html --all -W -n --keep-going

lint: venv
	$(BIN)/ruff check mha tests tools book/notebooks book/_ext

# Two workers (this machine has two cores). nbval needs each notebook whole on one
# worker (loadfile); the unit tests balance better when an idle worker steals work
# (a module fixture may then be built once per worker).
XDIST := -n 2 --dist loadfile

# `make portability` runs the same stage on simulated CPUs without the tooling tests
# (UNIT_IGNORE) and without coverage (COV).
UNIT_IGNORE ?= tests/test_site.py
COV ?= --cov=mha --cov-report=term --cov-fail-under=95
unit: venv
	$(PY) -m pytest tests $(addprefix --ignore=,$(UNIT_IGNORE)) -m "not browser" \
		-n 2 --dist worksteal -p no:nbval -p no:playwright -p no:base_url -p no:anyio $(COV)

check-notebooks: venv
	$(PY) -m tools.nbtools check

# Plugins a stage has no use for are not loaded: each costs up to a second of start-up
# in every process (the controller and each worker). Alone, nbval takes two workers;
# `make test` runs it in one process beside the unit tests, which keep both cores busy.
NBVAL_XDIST ?= $(XDIST)
nbval: venv
	$(PY) -m pytest --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg \
		-p no:hypothesispytest -p no:pytest_cov -p no:playwright -p no:base_url -p no:anyio \
		$(NBVAL_XDIST) book/notebooks

# Every browser test is in tests/test_site.py (collecting the others would import them).
browser: venv
	$(PY) -m pytest tests/test_site.py -m browser \
		-p no:nbval -p no:hypothesispytest -p no:pytest_cov -p no:xdist -p no:anyio

# Three stages side by side, so that both cores stay busy to the end: the site build
# and the browser tests (which wait on the browser more than they compute), nbval
# (one notebook at a time), and the unit tests on two workers. Each stage's time is
# printed at the end.
test: setup
	$(PY) -m tools.stages \
		"lint=$(MAKE) --no-print-directory lint" \
		"site+browser=$(MAKE) --no-print-directory site-build browser &" \
		"nbval=$(MAKE) --no-print-directory nbval NBVAL_XDIST='-p no:xdist' &" \
		"unit=$(MAKE) --no-print-directory unit"
	@echo "make test: every check passed"

# Neither the unit tests nor the stored outputs may depend on the CPU: both again, as
# if on two other CPUs.
portability: venv
	$(PY) -m tools.simulated_cpu

notebooks: venv
	$(PY) -m tools.nbtools regen $(NB)

# One notebook per chapter, solutions removed, stubs checked by mha.exercises. A file
# that exists is the learner's work and is kept unless REFRESH=1 (then backed up).
workbook: venv
	$(PY) -m tools.workbook $(if $(REFRESH),--refresh) $(NB)

$(LAB_SETTINGS):
	mkdir -p $(dir $@)
	printf '%s\n' '{"@jupyterlab/docmanager-extension:plugin": {"defaultViewers":' \
		'  {"markdown": "Jupytext Notebook", "myst": "Jupytext Notebook"}}}' > $@

# Jupyter refuses to run as root (containers) unless told it may.
lab: venv $(LAB_SETTINGS)
	$(BIN)/jupyter lab $(if $(filter 0,$(shell id -u)),--allow-root) .

# The package on its own: `pip install .` into an empty venv (its declared dependencies
# only, the CPU-only torch with TORCH_INDEX) must give an mha whose layers import.
PACKAGE_VENV := _build/package-venv
package:
	rm -rf $(PACKAGE_VENV) && $(PYTHON) -m venv $(PACKAGE_VENV)
	$(if $(TORCH_INDEX),$(PACKAGE_VENV)/bin/pip install --quiet '$(TORCH_PIN)' --index-url $(TORCH_INDEX))
	$(PACKAGE_VENV)/bin/pip install --quiet .
	cd $(PACKAGE_VENV) && bin/python -c "import mha, mha.modules, mha.transformer, mha.draw, \
		mha.translator; print('pip install . imports:', mha.__file__)"
	rm -rf $(PACKAGE_VENV)

bench: venv
	$(PY) -m mha.bench

clean:
	rm -rf _build book/_vendor/site book/_vendor/node_modules
