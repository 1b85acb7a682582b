"""GPU descriptions for estimated profiles (``memplan profile --estimate GPU | --gpu-spec FILE``).

A :class:`GpuSpec` holds what the roofline estimate of :mod:`memplan.torch.estimate.roofline` needs: the
memory, the HBM and host-link bandwidths, the dense peak FLOP/s per data type, the fraction of
those peaks that kernels achieve, and a fixed cost per kernel. The bundled catalog
(``memplan/data/gpus.yaml``) cites, for every number, the document it comes from
(docs/estimation.md).

This module does not import torch.

>>> from memplan.gpu import load_gpu
>>> gpu = load_gpu("a100")
>>> gpu.name, gpu.memory
('NVIDIA A100-SXM4-40GB', 42949672960)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from memplan.documents.io import read_document, validation_message
from memplan.errors import InputError, did_you_mean

__all__ = [
    "CATALOG_FORMAT",
    "CATALOG_PATH",
    "Efficiency",
    "GpuSpec",
    "PeakFlops",
    "Source",
    "gpu_catalog",
    "gpu_from_dict",
    "load_gpu",
    "load_gpu_file",
    "unsourced_fields",
]

CATALOG_FORMAT = "memplan-gpus/1"
CATALOG_PATH = Path(__file__).resolve().parent / "data" / "gpus.yaml"
"""The bundled catalog: ``format: memplan-gpus/1`` and ``gpus: {key: GpuSpec, ...}``."""

_SPEC_SUFFIXES = (".yaml", ".yml", ".json")

Rate = Annotated[float, Field(gt=0, le=1e18, allow_inf_nan=False)]
Fraction = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


class PeakFlops(_Strict):
    """Dense peak FLOP/s (one multiply-add = 2 FLOPs), without structured sparsity.

    ``float32`` is the CUDA-core (non-tensor) rate; ``tf32``, ``float16`` and ``bfloat16`` are
    tensor-core rates (FP32 accumulation for the 16-bit types). A type the GPU has no tensor
    cores for is left out (null): the estimate then uses ``float32`` at the CUDA-core efficiency.
    """

    float32: Rate
    tf32: Rate | None = None
    float16: Rate | None = None
    bfloat16: Rate | None = None


class Efficiency(_Strict):
    """Fractions (0, 1] of the peaks that kernels achieve."""

    tensor_core: Fraction = Field(description="matmul/conv/attention on tensor cores")
    cuda_core: Fraction = Field(description="matmul/conv/attention on CUDA cores (plain FP32)")
    memory: Fraction = Field(description="memory-bound kernels, of hbm_bandwidth")


class Source(_Strict):
    """Where numbers come from: the fields (dotted paths) and the document, or an assumption."""

    fields: list[str] = Field(min_length=1)
    document: str = Field(min_length=1)
    published: str | None = Field(default=None, description="the figures as the document states")
    note: str | None = None


class GpuSpec(_Strict):
    """One GPU. Sizes in bytes, rates in bytes/s and FLOP/s, times in seconds.

    Attributes
    ----------
    name : str
        The device name (as ``torch.cuda.get_device_name`` reports it), written to the profile's
        ``device.name``.
    memory : int
        Nominal memory capacity in bytes (``device.memory`` of the profile).
    hbm_bandwidth : float
        Peak device-memory bandwidth, bytes/s.
    host_bandwidth : float
        Usable host link bandwidth for offloading, one direction, bytes/s (the profile's
        ``bandwidth``).
    peak_flops : PeakFlops
        Dense peak FLOP/s per data type.
    efficiency : Efficiency
        Achieved fractions of the peaks.
    launch_cost : float
        Fixed cost added to every kernel, seconds.
    sources : list of Source
        Where each number comes from.
    """

    name: str = Field(min_length=1)
    description: str | None = None
    memory: Annotated[int, Field(gt=0, le=2**50)]
    hbm_bandwidth: Rate
    host_bandwidth: Rate
    peak_flops: PeakFlops
    efficiency: Efficiency
    launch_cost: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
    sources: list[Source] = Field(default_factory=list)

    @model_validator(mode="after")
    def _sources_name_fields(self) -> GpuSpec:
        known = set(_numeric_fields(self, include_none=True))
        for index, source in enumerate(self.sources):
            for field in source.fields:
                if field not in known:
                    raise ValueError(
                        f"sources[{index}].fields: {field!r} is not a numeric field "
                        f"(expected one of: {', '.join(sorted(known))})"
                    )
        return self

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict without null fields (what a profile's ``measured.estimate`` records)."""
        return self.model_dump(mode="json", exclude_none=True)


_TEXT_FIELDS = ("name", "description", "sources")


def _numeric_fields(spec: BaseModel, prefix: str = "", *, include_none: bool) -> list[str]:
    """Dotted paths of the numeric fields of a spec (``peak_flops.tf32``), in order."""
    paths = []
    for name in type(spec).model_fields:
        if name in _TEXT_FIELDS:
            continue
        value = getattr(spec, name)
        path = f"{prefix}{name}"
        if isinstance(value, BaseModel):
            paths += _numeric_fields(value, f"{path}.", include_none=include_none)
        elif value is not None or include_none:
            paths.append(path)
    return paths


def unsourced_fields(spec: GpuSpec) -> list[str]:
    """The numeric fields (set, not null) that no entry of ``spec.sources`` names."""
    cited = {field for source in spec.sources for field in source.fields}
    return [path for path in _numeric_fields(spec, include_none=False) if path not in cited]


def gpu_from_dict(data: Any, source: str = "<gpu spec>") -> GpuSpec:
    """Validate a parsed document as a :class:`GpuSpec`.

    Raises
    ------
    InputError
        One line naming ``source`` and the field, e.g.
        ``my.yaml: peak_flops.float32: Input should be greater than 0, got -1``.
    """
    if not isinstance(data, Mapping):
        raise InputError(f"{source}: expected a mapping with the fields of a GPU spec (name, ...)")
    try:
        return GpuSpec.model_validate(data)
    except ValidationError as exc:
        raise InputError(validation_message(source, exc)) from None


def load_gpu_file(path: str | os.PathLike[str]) -> GpuSpec:
    """Read one GPU spec from a YAML or JSON file (the fields of :class:`GpuSpec`)."""
    data, name = read_document(Path(path))
    return gpu_from_dict(data, name)


@lru_cache(maxsize=1)
def _catalog() -> dict[str, GpuSpec]:
    data, name = read_document(CATALOG_PATH)
    source = str(name)
    if not isinstance(data, Mapping) or data.get("format") != CATALOG_FORMAT:
        raise InputError(f"{source}: format: expected {CATALOG_FORMAT!r}")
    gpus = data.get("gpus")
    if not isinstance(gpus, Mapping) or not gpus:
        raise InputError(f"{source}: gpus: expected a mapping of GPU specs")
    catalog = {}
    for key, entry in gpus.items():
        spec = gpu_from_dict(entry, f"{source}: gpus.{key}")
        missing = unsourced_fields(spec)
        if missing:
            raise InputError(f"{source}: gpus.{key}.sources: no source for {', '.join(missing)}")
        catalog[str(key)] = spec
    return catalog


def gpu_catalog() -> dict[str, GpuSpec]:
    """The bundled GPUs by key (``a100``, ``h100``...), every number with its source."""
    return dict(_catalog())


def _catalog_list() -> str:
    return ", ".join(gpu_catalog())


def load_gpu(name_or_path: str | os.PathLike[str]) -> GpuSpec:
    """A GPU of the catalog by key (case-insensitive), or a spec file by path.

    Parameters
    ----------
    name_or_path : str or path
        ``a100``, ``h100``... (see :func:`gpu_catalog`) or a YAML/JSON file holding one spec.

    Raises
    ------
    InputError
        An unknown name (the message lists the catalog) or a bad file (file and field named).
    """
    text = str(name_or_path)
    catalog = gpu_catalog()
    if not isinstance(name_or_path, os.PathLike) and text.strip().lower() in catalog:
        return catalog[text.strip().lower()]
    path = Path(text)
    if path.exists() or os.sep in text or text.lower().endswith(_SPEC_SUFFIXES):
        return load_gpu_file(path)
    raise InputError(
        f"--estimate {text!r}: unknown GPU{did_you_mean(text.strip(), catalog)}; the catalog "
        f"has: {_catalog_list()} (or describe yours with --gpu-spec FILE)"
    )
