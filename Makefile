# memplan: `make run` and `make test` work on a fresh clone (they create .venv and install).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# torch 2.13.0 is the CPU build (a local wheel here, a small download elsewhere); the torch extra
# accepts any torch >= 2.1. The hf extra adds Hugging Face transformers (tests/torch/test_hf.py).
# timm and torchvision are not installed: torchvision's PyPI wheels are built for torch's CUDA
# build and do not load beside the CPU build (timm needs torchvision); their tests skip.
TORCH ?= torch==2.13.0
# The compiled core (memplan._core, C++ in src/) is built by `pip install -e .` with the build
# requirements of pyproject.toml, installed into the venv so that `make test` can rebuild it in
# place (scikit-build-core keeps its build directory in build/: only the edited files recompile).
CORE := $(VENV)/.core
CORE_SOURCES := CMakeLists.txt $(wildcard src/*.cpp src/*.hpp)
# Read at recipe time (the venv's python does not exist when make parses this file on a fresh clone).
BUILD_REQUIRES_PY := import shlex, tomllib; print(' '.join(map(shlex.quote, tomllib.load(open('pyproject.toml', 'rb'))['build-system']['requires'])))

# The test environment is pinned: requirements/test.txt holds the version of everything .venv
# installs (every extra, transitively, pip and the build backend too), applied as pip constraints
# (pyproject.toml keeps the ranges users get). `make lock` rewrites it after a change of
# pyproject.toml, keeping the other pins; `make lock-upgrade` moves every pin to the newest
# release. Both resolve with uv (pinned here) for CPython 3.11 on x86_64 Linux, torch's CPU build
# taken from TORCH_WHEELS (the CUDA build would bring the nvidia-* packages: refused).
LOCK := requirements/test.txt
UV := uv==0.13.8
TORCH_WHEELS ?= /opt/wheels
TOOLS := .venv-tools
LOCKED ?= 1
# `make test` leaves the tests marked slow (tests/conftest.py) to `make test-all`.
PYTEST_ARGS ?=

.PHONY: run test test-all test-kernels test-latest lock lock-upgrade golden lint typecheck bench profiles gpu-check clean

$(STAMP): export PIP_CONSTRAINT := $(if $(filter 1,$(LOCKED)),$(abspath $(LOCK)))
$(STAMP): pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet $$($(BIN)/python -c "$(BUILD_REQUIRES_PY)")
	$(BIN)/pip install --quiet --no-build-isolation -e ".[dev,plot,torch,hf]"
	touch $(STAMP)

# An edited C++ source (or CMakeLists.txt) rebuilds the core before the tests run.
$(CORE): $(STAMP) $(CORE_SOURCES)
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e .
	$(BIN)/python -c "import memplan.core as c; print('memplan:', c.build_line())"
	touch $(CORE)

run: $(CORE)
	$(BIN)/memplan info resnet50
	$(BIN)/memplan solve resnet50 --algo rotor --mem 1GB
	$(BIN)/memplan compare resnet50 --algos store-all,periodic,revolve,rotor --mem 0.6GB:1.7GB:12

test: $(CORE)
	$(BIN)/ruff check memplan tests benchmarks
	$(BIN)/ruff format --check memplan tests benchmarks
	$(BIN)/mypy
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# Everything, the slow end-to-end tests too (full-size models, README commands that profile,
# every golden case, the long hypothesis runs).
test-all: $(CORE)
	$(BIN)/python -m pytest -q --run-slow $(PYTEST_ARGS)

# The torch tests on other CPU kernels than the machine's best (the generic ATen kernels, oneDNN
# held to SSE4.1: other workspaces, other temporaries) and one thread: their expectations must
# not come from what this CPU measures. .ci/run runs it after `make test`.
test-kernels: $(CORE)
	ATEN_CPU_CAPABILITY=default DNNL_MAX_CPU_ISA=SSE41 OMP_NUM_THREADS=$(or $(THREADS),1) \
		$(BIN)/python -m pytest -q -m torch -p no:randomly $(PYTEST_ARGS)

# The default suite against the newest releases that pyproject.toml allows (no lock; torch stays
# $(TORCH)), in a venv of its own: what a user installing memplan today gets.
test-latest:
	$(PYTHON) -m venv $(VENV)-latest
	$(VENV)-latest/bin/pip install --quiet --upgrade pip
	$(VENV)-latest/bin/pip install --quiet "$(TORCH)"
	$(VENV)-latest/bin/pip install --quiet --upgrade --upgrade-strategy eager -e ".[dev,plot,torch,hf]"
	$(VENV)-latest/bin/pip list --format freeze
	$(VENV)-latest/bin/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

lock:
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/pip install --quiet "$(UV)"
	$(PYTHON) -c 'import tomllib; print("\n".join(["pip", "$(TORCH)", *tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]]))' > $(TOOLS)/pip-torch-build-backend.in
	@if [ -f $(LOCK) ]; then sed -i -E '/^torch==/d' $(LOCK); fi  # pinned again below: kept, uv would take PyPI's CUDA build of that version over the local +cpu wheel
	$(TOOLS)/bin/uv pip compile --quiet pyproject.toml $(TOOLS)/pip-torch-build-backend.in --all-extras $(LOCK_ARGS) \
		--python-version 3.11 --python-platform x86_64-manylinux_2_28 --find-links $(TORCH_WHEELS) \
		--annotation-style line --custom-compile-command "make lock" -o $(LOCK)
	sed -i -E 's/^(torch==[^+ ]+)\+cpu/\1/' $(LOCK)  # the same pin on a machine without the local wheel
	@if grep -iqE '^(nvidia-|triton)' $(LOCK); then echo "$(LOCK): torch's CUDA build was resolved (no CPU wheel in TORCH_WHEELS=$(TORCH_WHEELS))" >&2; exit 1; fi

lock-upgrade:
	$(MAKE) lock LOCK_ARGS=--upgrade

# Every golden schedule, the heavy ones too (tests/golden/cases.py: CP-SAT on the larger profiles).
golden: $(CORE)
	$(BIN)/python -m pytest -q --run-slow tests/golden

lint: $(CORE)
	$(BIN)/ruff check memplan tests benchmarks

# mypy --strict on memplan/ except the torch modules pyproject.toml's [tool.mypy] excludes; also a step of
# `make test`.
typecheck: $(CORE)
	$(BIN)/mypy

bench: $(CORE)
	$(BIN)/python benchmarks/bench_rotor.py --lengths 10,50,100,200
	$(BIN)/python benchmarks/bench_rotor.py --bundled

profiles: $(CORE)
	$(BIN)/python benchmarks/make_profiles.py

# On a machine with an NVIDIA GPU: the measured-peak benchmark on CUDA and --estimate against
# the GPU's own profile (benchmarks/gpu_check.py; results in gpu-check/). Needs a CUDA build of
# torch, past the lock's CPU build: make gpu-check TORCH=torch LOCKED=0
gpu-check: $(CORE)
	$(BIN)/python benchmarks/gpu_check.py --out gpu-check

clean:
	rm -rf $(VENV) $(VENV)-latest $(TOOLS) .pytest_cache .ruff_cache .mypy_cache .hypothesis build dist *.egg-info
