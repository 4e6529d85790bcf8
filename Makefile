# Two commands: `make lab` (open the course) and `make test` (run everything CI runs).
# Both create .venv on first use and reinstall only when pyproject.toml changes.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The CPU build of torch this suite is tested with. On Linux, plain PyPI serves a CUDA build of several
# GB; add an index that serves CPU wheels with TORCH_PIP_ARGS if you want to avoid it (see README).
TORCH_SPEC ?= torch==2.13.0
TORCH_PIP_ARGS ?=
LAB_PORT ?= 8888
# The unit tests run on this many pytest-xdist workers (each starts its own warm pools: about 1.5 GB), and the
# browser test too (each worker its own JupyterLab and chromium: about 1.5 GB).
TEST_WORKERS ?= 2
# The nbval run saves its one execution of each notebook (notebooks/conftest.py); the website is built from them.
EXECUTED_DIR := artifacts/executed
SITE_DIR := artifacts/site
NBVAL := $(BIN)/python -m pytest --nbval --nbval-current-env --nbval-cell-timeout=300 -p no:cacheprovider
# The main notebooks run under nbval alone, their timing claims asserted. Then the browser test, which keeps about
# one core of two busy, runs beside the exercises, the solutions and the nbgrader source notebooks (graded
# answers, no timings) and the website's build and check (scripts/side_by_side.py).
MAIN_NOTEBOOKS := $(wildcard notebooks/[0-9]*.ipynb)

.PHONY: lab test lint bench site binder-check busy-check bursty-check install clean assignments grade

install: $(STAMP)

$(STAMP): pyproject.toml binder/overrides.json
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[test,browser,site]"
	mkdir -p $(VENV)/share/jupyter/lab/settings  # JupyterLab's defaults: no news prompt (binder/postBuild does the same)
	cp binder/overrides.json $(VENV)/share/jupyter/lab/settings/overrides.json
	touch $(STAMP)

lab: $(STAMP)
	$(BIN)/jupyter lab --ServerApp.ip=127.0.0.1 --ServerApp.port=$(LAB_PORT) --ServerApp.root_dir=. \
		--LabApp.default_url=/lab/tree/notebooks/00_start_here.ipynb \
		$(if $(filter 0,$(shell id -u)),--allow-root,)

test: $(STAMP)
	$(BIN)/python -m ruff check .
	$(BIN)/python -m pytest tests --ignore=tests/browser --ignore=tests/static_site -n $(TEST_WORKERS)
	$(BIN)/python scripts/course_counts.py --check
	rm -rf $(EXECUTED_DIR) $(SITE_DIR)
	SHARDLIB_EXECUTED_DIR=$(EXECUTED_DIR) SHARDLIB_STRICT_CLAIMS=1 $(NBVAL) $(MAIN_NOTEBOOKS) --durations=10
	SHARDLIB_EXECUTED_DIR=$(EXECUTED_DIR) SHARDLIB_SITE_DIR=$(SITE_DIR) $(BIN)/python scripts/side_by_side.py \
		"$(BIN)/python -m pytest tests/browser -n $(TEST_WORKERS) -rs --durations=0" \
		"SHARDLIB_STRICT_CLAIMS=1 $(NBVAL) notebooks/exercises solutions course/source tests/static_site -rs --durations=5"

# For instructors (nbgrader): release every exercise as an assignment into course/release/, and grade what
# students handed in under course/submitted/<student>/<assignment>/ (feedback in course/feedback/, course/grades.csv).
assignments: $(STAMP)
	$(BIN)/python scripts/course.py release

grade: $(STAMP)
	$(BIN)/python scripts/course.py grade

lint: $(STAMP)
	$(BIN)/python -m ruff check .

binder-check: $(STAMP)
	$(BIN)/python scripts/binder_check.py

busy-check: $(STAMP)
	$(BIN)/python scripts/busy_check.py

bursty-check: $(STAMP)
	$(BIN)/python scripts/busy_check.py --bursty

site: $(STAMP)
	$(BIN)/python scripts/build_site.py --out site

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_runtime.py
	$(BIN)/python benchmarks/bench_tensor_parallel.py
	$(BIN)/python benchmarks/bench_costs.py
	$(BIN)/python benchmarks/bench_pipeline.py
	$(BIN)/python benchmarks/bench_experts.py
	$(BIN)/python benchmarks/bench_serving.py
	$(BIN)/python benchmarks/bench_data_parallel.py
	$(BIN)/python benchmarks/bench_context_parallel.py
	$(BIN)/python benchmarks/bench_training.py
	$(BIN)/python benchmarks/bench_planners.py

clean:
	rm -rf $(VENV) .pytest_cache
