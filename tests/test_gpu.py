"""memplan.gpu: the bundled GPU catalog (every number sourced) and --gpu-spec files.

Nothing here needs torch: the catalog, the spec files and the CLI's checks of --estimate and
--gpu-spec all run before any model is built.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from memplan.cli.app import app
from memplan.cli.profile import GPU_NAMES
from memplan.errors import InputError
from memplan.gpu import (
    CATALOG_PATH,
    GpuSpec,
    gpu_catalog,
    gpu_from_dict,
    load_gpu,
    load_gpu_file,
    unsourced_fields,
)

runner = CliRunner()
GiB = 2**30
REQUIRED = ("v100", "v100-32gb", "a100", "a100-80gb", "h100", "l4", "rtx4090")


@pytest.fixture(autouse=True)
def _no_debug_env(monkeypatch):
    monkeypatch.delenv("MEMPLAN_DEBUG", raising=False)


def _spec_dict(key: str = "a100") -> dict:
    return gpu_catalog()[key].to_dict()


def _write(tmp_path: Path, data: object, name: str = "my.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


# --------------------------------------------------------------------------- the catalog


def test_catalog_has_the_required_gpus():
    catalog = gpu_catalog()
    assert set(REQUIRED) <= set(catalog)
    assert all(isinstance(spec, GpuSpec) for spec in catalog.values())
    # --help lists the same names
    assert [name.strip() for name in GPU_NAMES.split(",")] == list(catalog)


@pytest.mark.parametrize("key", REQUIRED)
def test_every_number_has_a_source(key):
    spec = gpu_catalog()[key]
    assert unsourced_fields(spec) == []
    for source in spec.sources:
        assert source.document.strip()
        # a figure from a document is quoted; an assumption says so
        assert source.published or source.note, source
        if source.published is None:
            assert "assumption" in source.document or source.note


@pytest.mark.parametrize("key", REQUIRED)
def test_numbers_are_plausible(key):
    spec = gpu_catalog()[key]
    peaks = spec.peak_flops
    assert 8 * GiB <= spec.memory <= 192 * GiB
    assert 1e11 <= spec.hbm_bandwidth <= 1e13
    assert 5e9 <= spec.host_bandwidth < spec.hbm_bandwidth
    assert 1e13 <= peaks.float32 <= 1e14
    for rate in (peaks.tf32, peaks.float16, peaks.bfloat16):
        assert rate is None or peaks.float32 <= rate <= 1.2e15  # dense, not sparsity figures
    if peaks.tf32 is not None and peaks.float16 is not None:
        assert peaks.tf32 <= peaks.float16
    assert 0 < spec.launch_cost < 1e-4


def test_published_figures():
    c = gpu_catalog()
    assert c["a100"].memory == 40 * GiB and c["a100-80gb"].memory == 80 * GiB
    assert c["a100"].hbm_bandwidth == 1555e9 and c["a100-80gb"].hbm_bandwidth == 2039e9
    assert c["a100"].peak_flops.tf32 == 156e12 and c["a100"].peak_flops.bfloat16 == 312e12
    assert c["v100"].memory == 16 * GiB and c["v100-32gb"].memory == 32 * GiB
    assert c["v100"].peak_flops.tf32 is None and c["v100"].peak_flops.bfloat16 is None
    assert c["v100"].peak_flops.float16 == 125e12
    assert c["h100"].hbm_bandwidth == 3.35e12 and c["h100"].peak_flops.float16 == 989.5e12
    assert c["l4"].peak_flops.float16 == 121e12 and c["l4"].hbm_bandwidth == 300e9
    assert c["rtx4090"].peak_flops.bfloat16 == 165.2e12
    # host links: PCIe 3 < PCIe 4 < PCIe 5
    assert c["v100"].host_bandwidth < c["a100"].host_bandwidth < c["h100"].host_bandwidth


def test_catalog_file_is_package_data():
    assert CATALOG_PATH.is_file()
    assert CATALOG_PATH.parent.name == "data" and CATALOG_PATH.parent.parent.name == "memplan"


def test_load_gpu_by_name_and_by_path(tmp_path):
    assert load_gpu("a100") == load_gpu("A100") == gpu_catalog()["a100"]
    path = _write(tmp_path, _spec_dict("h100"))
    assert load_gpu(str(path)) == gpu_catalog()["h100"]
    assert load_gpu(path) == load_gpu_file(path) == gpu_catalog()["h100"]


def test_unknown_gpu_lists_the_catalog():
    with pytest.raises(InputError) as err:
        load_gpu("nosuchgpu")
    message = str(err.value)
    assert "nosuchgpu" in message and "\n" not in message
    for key in REQUIRED:
        assert key in message


def test_import_does_not_load_torch():
    code = "import sys, memplan.gpu as g; g.gpu_catalog(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --------------------------------------------------------------------------- spec files


def test_a_minimal_spec_of_ones_own(tmp_path):
    data = {
        "name": "My GPU",
        "memory": 24 * GiB,
        "hbm_bandwidth": "1.0e12",  # strings with exponents are accepted (YAML 1.1 reads 1e12 so)
        "host_bandwidth": 2.5e10,
        "peak_flops": {"float32": 5e13, "float16": 2e14},
        "efficiency": {"tensor_core": 0.5, "cuda_core": 0.8, "memory": 0.8},
        "launch_cost": 4e-6,
    }
    spec = load_gpu_file(_write(tmp_path, data))
    assert spec.hbm_bandwidth == 1e12 and spec.peak_flops.tf32 is None
    assert spec.sources == [] and len(unsourced_fields(spec)) == 9


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda d: d["peak_flops"].update(float32=-1), "peak_flops.float32"),
        (lambda d: d["efficiency"].update(memory=1.5), "efficiency.memory"),
        (lambda d: d.pop("hbm_bandwidth"), "hbm_bandwidth"),
        (lambda d: d.update(memory="lots"), "memory"),
        (lambda d: d.update(bogus=1), "bogus"),
        (lambda d: d["sources"][0].update(fields=["peak_flops.fp8"]), "sources"),
        (lambda d: d.update(launch_cost=float("inf")), "launch_cost"),
    ],
)
def test_bad_spec_file_names_the_file_and_field(tmp_path, change, field):
    data = _spec_dict()
    change(data)
    path = _write(tmp_path, data)
    with pytest.raises(InputError) as err:
        load_gpu_file(path)
    message = str(err.value)
    assert message.startswith(f"{path}: ") and field in message and "\n" not in message


def test_bad_spec_documents(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        load_gpu_file(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n", encoding="utf-8")
    with pytest.raises(InputError, match="malformed"):
        load_gpu_file(bad)
    with pytest.raises(InputError, match="expected a mapping"):
        gpu_from_dict([1, 2], "list.yaml")


def test_spec_round_trips():
    for spec in gpu_catalog().values():
        assert gpu_from_dict(yaml.safe_load(yaml.safe_dump(spec.to_dict()))) == spec


# --------------------------------------------------------------------------- CLI checks


def _error_line(result) -> str:
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("memplan: error: "), lines
    assert result.stdout == ""
    return lines[0]


def test_cli_unknown_gpu_exits_2_listing_the_catalog():
    line = _error_line(runner.invoke(app, ["profile", "resnet18", "--estimate", "nosuchgpu"]))
    assert "--estimate" in line and "nosuchgpu" in line
    for key in REQUIRED:
        assert key in line


def test_cli_bad_gpu_spec_exits_2_naming_the_field(tmp_path):
    data = _spec_dict()
    data["peak_flops"]["float16"] = 0
    path = _write(tmp_path, data)
    line = _error_line(runner.invoke(app, ["profile", "resnet18", "--gpu-spec", str(path)]))
    assert "--gpu-spec" in line and str(path) in line and "peak_flops.float16" in line
    missing = tmp_path / "gpu.yaml"
    line = _error_line(runner.invoke(app, ["profile", "resnet18", "--gpu-spec", str(missing)]))
    assert "--gpu-spec" in line and "no such file" in line


def test_cli_estimate_option_conflicts(tmp_path):
    path = _write(tmp_path, _spec_dict())
    both = ["profile", "resnet18", "--estimate", "a100", "--gpu-spec", str(path)]
    assert "not both" in _error_line(runner.invoke(app, both))
    repeats = ["profile", "resnet18", "--estimate", "a100", "--repeats", "3"]
    assert "--repeats" in _error_line(runner.invoke(app, repeats))
