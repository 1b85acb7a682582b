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

.PHONY: run test golden lint bench profiles gpu-check clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e ".[dev,plot,torch,hf,fast]"
	$(BIN)/python -m memplan.native || echo "memplan: native kernels unavailable (see above): their numpy code will be used"
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/memplan info resnet50
	$(BIN)/memplan solve resnet50 --algo rotor --mem 1GB
	$(BIN)/memplan compare resnet50 --algos store-all,periodic,revolve,rotor --mem 0.6GB:1.7GB:12

test: $(STAMP)
	$(BIN)/ruff check memplan tests benchmarks
	$(BIN)/ruff format --check memplan tests benchmarks
	$(BIN)/python -m memplan.native > /dev/null || true  # rebuilt here if a kernel's source changed
	$(BIN)/python -m pytest -q

# Every golden schedule, the heavy ones too (tests/golden/cases.py: CP-SAT on the larger profiles).
golden: $(STAMP)
	MEMPLAN_GOLDEN=all $(BIN)/python -m pytest -q tests/golden/test_golden.py

lint: $(STAMP)
	$(BIN)/ruff check memplan tests benchmarks

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_rotor.py --lengths 10,50,100,200
	$(BIN)/python benchmarks/bench_rotor.py --bundled

profiles: $(STAMP)
	$(BIN)/python benchmarks/make_profiles.py

# On a machine with an NVIDIA GPU: the measured-peak benchmark on CUDA and --estimate against
# the GPU's own profile (benchmarks/gpu_check.py; results in gpu-check/). Needs a CUDA build of
# torch: make gpu-check TORCH=torch
gpu-check: $(STAMP)
	$(BIN)/python benchmarks/gpu_check.py --out gpu-check

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis build dist *.egg-info
