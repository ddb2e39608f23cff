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

.PHONY: help venv setup book translations test checks durations portability package workbook lint unit notebooks check-notebooks nbval site-build browser bench lab clean

help:
	@echo "make book        build the site into _build/html (sets up .venv first)"
	@echo "make translations update the catalogs of the other editions after an English change"
	@echo "make test        run every test: lint, unit, notebooks, nbval, strict build, browser"
	@echo "make portability unit tests and nbval again on simulated older CPUs (CI runs it too)"
	@echo "make notebooks   regenerate book/notebooks/*.ipynb from book/chapters/*.md (NB=name for one)"
	@echo "make workbook    write the exercises without solutions to workbook/ (REFRESH=1 rewrites)"
	@echo "make chapter-check NB=NN_slug  check one chapter in under a minute (SITE=1: its page too)"
	@echo "make chapter NAME=NN_slug TITLE=\"...\"  lay out a new chapter with every piece the tests ask for"
	@echo "make lab         open the book in JupyterLab"
	@echo "make package     pip install . into an empty venv and import mha (CI runs it too)"

# PyPI's Linux wheel of torch brings several GB of CUDA libraries. With
# TORCH_INDEX=https://download.pytorch.org/whl/cpu the CPU-only build of the pinned
# version is installed first, and the pin accepts it (2.13.0+cpu is 2.13.0).
TORCH_INDEX ?=
TORCH_PIN := $(shell grep '^torch==' requirements.txt)

# pip writes the bytecode of every module it installs: Python does not write it later
# where PYTHONDONTWRITEBYTECODE is set (as on this course's machines), and every process
# would compile every module it imports again.
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
# ONNX Runtime Web (same manifest) for the live translator's page: its WebAssembly-only
# script, the module that starts the WebAssembly and the one build 1.31 ships for the
# CPU (threaded, run on one thread), not the 18-30 MB variants for WebGPU and others.
ORT_PARTS := ort.wasm.min.js ort-wasm-simd-threaded.mjs ort-wasm-simd-threaded.wasm
$(MATHJAX): book/_vendor/package.json book/_vendor/package-lock.json
	cd book/_vendor && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error
	rm -rf book/_vendor/site && mkdir -p book/_vendor/site/_vendor/mathjax
	cd book/_vendor/node_modules/mathjax/es5 && cp -r $(MATHJAX_PARTS) ../../../site/_vendor/mathjax/
	mkdir -p book/_vendor/site/_vendor/onnxruntime-web
	cd book/_vendor/node_modules/onnxruntime-web && cp $(addprefix dist/,$(ORT_PARTS)) \
		../../site/_vendor/onnxruntime-web/
	$(MAKE) --no-print-directory fonts
	touch $(MATHJAX)

# The live translator's model (book/notebooks/93_translator_live), served by the site:
# the shipped checkpoint exported to ONNX by tools/onnx_export.py at set-up (the same
# bytes on every run), never committed.
TRANSLATOR_ONNX := book/_vendor/model/_vendor/translator/translator.json
$(TRANSLATOR_ONNX): $(STAMP) tools/onnx_export.py mha/translator/checkpoints/translator.npz
	rm -rf book/_vendor/model
	$(PY) -m tools.onnx_export $(dir $(TRANSLATOR_ONNX))

# The CJK web font (Noto Sans SC, from the same manifest), served by the site itself to
# both editions: the regular and bold weights, each cut by Fontsource into about a
# hundred slices by Unicode range, so that a page downloads only the slices holding the
# glyphs it shows. Only the WOFF2 files are published (every browser the book supports
# reads them), and the stylesheets no longer name the WOFF fallbacks. After the build,
# `tools.editions fonts` cuts every slice to the characters the site shows (7.5 MB of
# slices become about 1.5 MB).
FONT_DIR := book/_vendor/site/_vendor/fonts/noto-sans-sc
FONT_WEIGHTS := 400 700
.PHONY: fonts
fonts:
	rm -rf $(FONT_DIR) && mkdir -p $(FONT_DIR)/files
	for w in $(FONT_WEIGHTS); do \
		sed -E "s/, url\([^)]*\.woff\) format\('woff'\)//" \
			book/_vendor/node_modules/@fontsource/noto-sans-sc/$$w.css > $(FONT_DIR)/$$w.css; \
		cp book/_vendor/node_modules/@fontsource/noto-sans-sc/files/noto-sans-sc-*-$$w-normal.woff2 \
			$(FONT_DIR)/files/; \
	done

# What building the site needs besides: MathJax, ONNX Runtime Web and the model.
setup: venv $(MATHJAX) $(TRANSLATOR_ONNX)

book: setup site-build
	@echo "site: _build/html/index.html (English), _build/html/zh_CN/index.html (中文)"

# Strict build: any warning (broken reference, missing figure, ...) fails it. The
# English edition first, then every other edition from the same notebooks through its
# gettext catalogs (locales/), into _build/html/<lang>/, sharing the English edition's
# unchanged files (see tools/editions.py).
EDITIONS := zh_CN
site-build: setup
	rm -rf _build/html _build/.doctrees
	$(BIN)/jupyter-book build . --builder html --all -W -n --keep-going
	for lang in $(EDITIONS); do $(PY) -m tools.editions build $$lang; done
	$(PY) -m tools.editions fonts

# After an English change: extract the messages again, merge them into every
# edition's catalogs (new messages empty, changed ones fuzzy, removed ones obsolete),
# and list, per page, what needs translating. tests/test_translations.py fails until
# the pages declared translated (locales/<lang>/TRANSLATED) are translated again.
translations: venv
	$(PY) -m tools.editions gettext
	for lang in $(EDITIONS); do $(PY) -m tools.editions update $$lang; done

lint: venv
	$(BIN)/ruff check mha tests tools book/notebooks book/_ext

# One pytest worker per core (this machine has two). tests/scheduling.py hands each
# worker the costliest work unit that can start: a notebook's cells stay together (one
# kernel), and so do a page's browser tests (one visit) and a module's tests.
WORKERS ?= 2
XDIST := -n $(WORKERS) --book-schedule
# What each pytest command prints besides: its slowest tests.
DURATIONS := --durations=15 --durations-min=1

# `make portability` runs the same stage on simulated CPUs without the tooling tests
# (UNIT_IGNORE) and without coverage (COV).
UNIT_IGNORE ?= tests/test_site.py tests/test_site_build.py
COV ?= --cov=mha --cov-report=term --cov-fail-under=95
unit: venv
	$(PY) -m pytest tests $(addprefix --ignore=,$(UNIT_IGNORE)) -m "not browser" \
		$(XDIST) $(DURATIONS) -p no:nbval -p no:playwright -p no:base_url -p no:anyio $(COV)

check-notebooks: venv
	$(PY) -m tools.nbtools check

# Plugins a stage has no use for are not loaded: each costs up to a second of start-up
# in every process (the controller and each worker).
NBVAL := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg
NBVAL_XDIST ?= $(XDIST)
nbval: venv
	$(PY) -m pytest $(NBVAL) $(DURATIONS) \
		-p no:hypothesispytest -p no:pytest_cov -p no:playwright -p no:base_url -p no:anyio \
		$(NBVAL_XDIST) book/notebooks

# Every browser test is in tests/test_site.py (collecting the others would import them).
browser: venv
	$(PY) -m pytest tests/test_site.py -m browser $(DURATIONS) \
		-p no:nbval -p no:hypothesispytest -p no:pytest_cov -p no:xdist -p no:anyio

# Lint, then every other check in one pytest session with one worker per core: the unit
# tests, nbval over every notebook, each chapter's workbook run, the site build (first,
# and no page is opened before it ends) and the browser tests (tests/scheduling.py).
# It prints the slowest tests, and the tests, wall and CPU time of each kind of check;
# tools/stages.py prints each stage's wall and CPU time.
test: setup
	$(PY) -m tools.stages \
		"lint=$(MAKE) --no-print-directory lint" \
		"checks=$(MAKE) --no-print-directory checks"
	@echo "make test: every check passed"

CHECK_IGNORE ?=
checks: setup
	$(PY) -m pytest tests book/notebooks $(addprefix --ignore=,$(CHECK_IGNORE)) $(NBVAL) \
		$(XDIST) $(DURATIONS) -p no:anyio $(COV)

# tests/durations.json: what each work unit took in the last `make test` (the scheduler
# starts the costliest first). Run after `make test` when the book has changed a lot.
# The units the last run measured replace their old times; the others are kept (a run
# of a few tests once replaced the whole file with one unit).
durations:
	$(PY) -c 'import json, pathlib; f = pathlib.Path("tests/durations.json"); \
		times = {**json.loads(f.read_text()), **json.loads(pathlib.Path("_build/durations.json").read_text())}; \
		f.write_text(json.dumps(dict(sorted(times.items())), indent=1) + "\n")'

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
# only, the CPU-only torch with TORCH_INDEX) must give an mha whose layers import. Its
# one import compiles what it needs: no bytecode is written for every file installed
# (half the step's time, torch alone has thousands of modules).
PACKAGE_VENV := _build/package-venv
package:
	rm -rf $(PACKAGE_VENV) && $(PYTHON) -m venv $(PACKAGE_VENV)
	$(if $(TORCH_INDEX),$(PACKAGE_VENV)/bin/pip install --quiet --no-compile '$(TORCH_PIN)' --index-url $(TORCH_INDEX))
	$(PACKAGE_VENV)/bin/pip install --quiet --no-compile .
	cd $(PACKAGE_VENV) && bin/python -c "import mha, mha.modules, mha.transformer, mha.draw, \
		mha.translator; print('pip install . imports:', mha.__file__)"
	rm -rf $(PACKAGE_VENV)

bench: venv
	$(PY) -m mha.bench

# --- An author's loop (README, "Writing a chapter") ------------------------------------
# One chapter checked in under a minute, two lanes side by side: its notebook regenerated
# into _build/chapter-check/ and compared with the stored one as nbval compares, and the
# tests that concern it (pytest --chapter NB: its pairs, reading rules, prose numbers,
# checkers, workbook and catalog, and the cheap checks of the whole book's plumbing).
# SITE=1 also builds the site and runs the browser tests of its page in both editions.
.PHONY: chapter-check chapter
chapter-check: venv $(if $(SITE),$(MATHJAX) $(TRANSLATOR_ONNX))
	$(if $(NB),,$(error chapter-check needs NB=NN_slug))
	$(PY) -m tools.chapter check $(NB) $(if $(SITE),--site)

# A new chapter with every piece the tests ask for, from tools/chapter_template/: its
# source, _toc.yml entry, executed notebook, prose-number list, two checkers owned by it
# and its Chinese catalog. Its placeholders say SCAFFOLD; a test fails until none is left.
chapter: venv
	$(if $(and $(NAME),$(TITLE)),,$(error chapter needs NAME=NN_slug TITLE="..."))
	$(PY) -m tools.chapter new $(NAME) --title "$(TITLE)" $(if $(TITLE_ZH),--title-zh "$(TITLE_ZH)")

clean:
	rm -rf _build book/_vendor/site book/_vendor/model book/_vendor/node_modules
