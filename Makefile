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
BUILD_REQUIRES = $(shell $(BIN)/python -c "import sys; t = __import__('tomllib' if sys.version_info >= (3, 11) else 'pip._vendor.tomli', fromlist=['loads']); print(' '.join(t.loads(open('pyproject.toml').read())['build-system']['requires']))")

.PHONY: run test golden lint bench profiles gpu-check clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet $(BUILD_REQUIRES)
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
	$(BIN)/python -m pytest -q

# Every golden schedule, the heavy ones too (tests/golden/cases.py: CP-SAT on the larger profiles).
golden: $(CORE)
	MEMPLAN_GOLDEN=all $(BIN)/python -m pytest -q tests/golden/test_golden.py

lint: $(CORE)
	$(BIN)/ruff check memplan tests benchmarks

bench: $(CORE)
	$(BIN)/python benchmarks/bench_rotor.py --lengths 10,50,100,200
	$(BIN)/python benchmarks/bench_rotor.py --bundled

profiles: $(CORE)
	$(BIN)/python benchmarks/make_profiles.py

# On a machine with an NVIDIA GPU: the measured-peak benchmark on CUDA and --estimate against
# the GPU's own profile (benchmarks/gpu_check.py; results in gpu-check/). Needs a CUDA build of
# torch: make gpu-check TORCH=torch
gpu-check: $(CORE)
	$(BIN)/python benchmarks/gpu_check.py --out gpu-check

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis build dist *.egg-info
