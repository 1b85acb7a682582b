# memplan: `make run` and `make test` work on a fresh clone (they create .venv and install).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# torch 2.13.0 is the CPU build (a local wheel here, a small download elsewhere); the torch extra
# accepts any torch >= 2.1. The hf extra adds Hugging Face transformers (tests/test_hf.py).
# timm and torchvision are not installed: torchvision's PyPI wheels are built for torch's CUDA
# build and do not load beside the CPU build (timm needs torchvision); their tests skip.
TORCH ?= torch==2.13.0

.PHONY: run test lint bench profiles clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e ".[dev,plot,torch,hf]"
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/memplan info resnet50
	$(BIN)/memplan solve resnet50 --algo rotor --mem 1GB
	$(BIN)/memplan compare resnet50 --algos store-all,periodic,revolve,rotor --mem 0.6GB:1.7GB:12

test: $(STAMP)
	$(BIN)/ruff check memplan tests benchmarks
	$(BIN)/ruff format --check memplan tests benchmarks
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check memplan tests benchmarks

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_rotor.py --algos rotor,revolve,periodic
	$(BIN)/python benchmarks/bench_rotor.py --bundled --algos rotor,revolve,periodic

profiles: $(STAMP)
	$(BIN)/python benchmarks/make_profiles.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis build dist *.egg-info
