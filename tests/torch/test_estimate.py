"""memplan.torch.estimate.roofline: operator counts (FLOPs, bytes, kernels), the roofline, estimated profiles.

FLOP counts are checked against hand-computed values (a multiply-add counts 2 FLOPs):

* ``Conv2d(Cin, Cout, k)``: forward ``2 N Cout Hout Wout Cin k k``; its backward computes the
  input gradient and the weight gradient, each as many FLOPs as the forward (2x in all). For a
  first layer, whose input does not require grad, the counter reports the weight gradient only
  (1x the forward). The bias gradient (a reduction) counts no FLOPs.
* ``Linear(in, out)`` on ``B`` rows: forward ``2 B in out``; backward the same two products.
* Scaled dot-product attention: forward ``QK^T`` plus ``AV``, ``2 B H S S D`` each; the backward,
  with torch's FLOP formula, recomputes ``QK^T`` and computes ``dP``, ``dV``, ``dQ``, ``dK``: five
  products, 2.5x the forward. Causal masking is not discounted.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import yaml  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

import memplan  # noqa: E402
from memplan.api import describe  # noqa: E402
from memplan.cli.app import app  # noqa: E402
from memplan.gpu import GpuSpec, gpu_catalog  # noqa: E402
from memplan.profile import Profile, load_profile, save_profile  # noqa: E402
from memplan.torch.estimate.roofline import (  # noqa: E402
    OpCounter,
    OpRecord,
    Tf32,
    count_ops,
    estimate_phase,
    op_time,
    tf32_flags,
)
from memplan.torch.profiler.model import profile_model  # noqa: E402

pytestmark = pytest.mark.torch

F32 = 4
CHAIN_ALGOS = ("store-all", "periodic", "revolve", "rotor")


def _count(forward, grad_inputs=()):
    """Forward and backward records of ``forward()`` (backward with a gradient of ones)."""
    counter = OpCounter()
    with counter.counting("forward"):
        out = forward()
    grad = torch.ones_like(out)
    with counter.counting("backward"):
        out.backward(grad)
    return counter.ops["forward"], counter.ops.get("backward", [])


def _flops(ops) -> int:
    return sum(op.flops for op in ops)


# --------------------------------------------------------------------------- FLOPs


@pytest.mark.parametrize("input_grad", [True, False])
def test_conv_flops(input_grad):
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 8, 3)
    x = torch.randn(2, 3, 16, 16, requires_grad=input_grad)
    forward, backward = _count(lambda: conv(x))
    n, cin, cout, k, hout, wout = 2, 3, 8, 3, 14, 14
    expected = 2 * n * cout * hout * wout * cin * k * k
    assert expected == 169_344
    assert _flops(forward) == expected
    # input gradient (only when the input requires grad) + weight gradient
    assert _flops(backward) == (2 if input_grad else 1) * expected
    [conv_op] = [op for op in forward if op.flops]
    assert conv_op.kind == "matmul" and conv_op.name.startswith("aten.convolution")


@pytest.mark.parametrize("input_grad", [True, False])
def test_linear_flops(input_grad):
    lin = nn.Linear(5, 7)
    x = torch.randn(4, 5, requires_grad=input_grad)
    forward, backward = _count(lambda: lin(x))
    expected = 2 * 4 * 5 * 7
    assert _flops(forward) == expected
    assert _flops(backward) == (2 if input_grad else 1) * expected
    assert [op.kind for op in forward] == ["matmul"]  # t() is a view: not a kernel


def test_attention_flops():
    b, h, s, d = 2, 4, 16, 8
    q, k, v = (torch.randn(b, h, s, d, requires_grad=True) for _ in range(3))
    forward, backward = _count(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    qk = 2 * b * h * s * s * d  # Q @ K^T: (s x d) @ (d x s) per head
    av = 2 * b * h * s * s * d  # A @ V:   (s x s) @ (s x d) per head
    assert _flops(forward) == qk + av == 65_536
    assert _flops(backward) == 5 * qk == 163_840
    assert all(op.kind == "matmul" for op in forward if op.flops)

    # the same attention written out with matmuls counts the same products
    def explicit():
        scores = q @ k.transpose(-2, -1) / d**0.5
        return torch.softmax(scores, dim=-1) @ v

    forward, _ = _count(explicit)
    assert _flops(forward) == qk + av


def test_multihead_attention_module_counts_projections_and_attention():
    e, heads, b, s = 16, 4, 2, 10
    mha = nn.MultiheadAttention(e, heads, batch_first=True)
    x = torch.randn(b, s, e)
    forward, _ = _count(lambda: mha(x, x, x, need_weights=False)[0])
    projections = 2 * b * s * e * 3 * e + 2 * b * s * e * e  # in_proj (q, k, v) + out_proj
    attention = 2 * (2 * b * heads * s * s * (e // heads))
    assert _flops(forward) == projections + attention


# --------------------------------------------------------------------------- bytes and kernels


def test_bytes_counted_once_per_tensor():
    x = torch.randn(4, 4)
    y = torch.randn(4, 4)
    [op] = count_ops(lambda: x + x)
    assert (op.bytes_read, op.bytes_written) == (x.nbytes, x.nbytes)
    assert op.kind == "memory" and op.flops == 0 and op.dtype == "float32"
    [op] = count_ops(lambda: x + y)
    assert (op.bytes_read, op.bytes_written) == (x.nbytes + y.nbytes, x.nbytes)
    [op] = count_ops(lambda: x.add_(y))  # in place: reads both, writes x
    assert (op.bytes_read, op.bytes_written) == (2 * x.nbytes, x.nbytes)
    bias = torch.randn(4)
    [op] = count_ops(lambda: x + bias)  # a broadcast operand counts its own elements
    assert (op.bytes_read, op.bytes_written) == (x.nbytes + bias.nbytes, x.nbytes)
    [op] = count_ops(lambda: x.copy_(y))  # an overwritten destination is not read
    assert (op.bytes_read, op.bytes_written) == (y.nbytes, x.nbytes)
    [op] = count_ops(lambda: torch.cat([x, y]))
    assert (op.bytes_read, op.bytes_written) == (x.nbytes + y.nbytes, 2 * x.nbytes)
    [op] = count_ops(lambda: x.half())
    assert (op.bytes_read, op.bytes_written) == (x.nbytes, x.nbytes // 2)


def test_views_and_metadata_are_not_kernels():
    x = torch.randn(4, 6)
    ops = count_ops(
        lambda: (
            x.view(24),
            x.reshape(6, 4),
            x.t(),
            x.permute(1, 0),
            x.expand(2, 4, 6),
            x.detach(),
            x[1:3],
            x.unsqueeze(0),
            torch.empty(3),
            torch.empty_like(x),
        )
    )
    assert ops == []
    [op] = count_ops(lambda: x.t().contiguous())  # a copy is a kernel
    assert op.bytes_read == op.bytes_written == x.nbytes
    [op] = count_ops(lambda: torch.zeros_like(x))  # reads nothing, writes its output
    assert (op.bytes_read, op.bytes_written) == (0, x.nbytes)


def test_counter_holds_no_tensors():
    counter = OpCounter()
    with counter.counting("forward"):
        torch.randn(8, 8).relu()
    for op in counter.ops["forward"]:
        assert isinstance(op, OpRecord)
        assert all(not isinstance(v, torch.Tensor) for v in vars(op).values())


def test_tf32_follows_torch_flags():
    lin, conv = nn.Linear(8, 8), nn.Conv2d(2, 2, 1)
    previous = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        assert tf32_flags() == Tf32(conv=previous[1], matmul=previous[0])
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = False
        [mm] = [op for op in count_ops(lambda: lin(torch.randn(2, 8))) if op.flops]
        [cv] = [op for op in count_ops(lambda: conv(torch.randn(1, 2, 3, 3))) if op.flops]
        assert mm.tf32 and not cv.tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = previous
    assert Tf32() == Tf32(conv=True, matmul=False)  # PyTorch's defaults


# --------------------------------------------------------------------------- the roofline


def _toy_gpu(**changes) -> GpuSpec:
    data = {
        "name": "toy",
        "memory": 2**30,
        "hbm_bandwidth": 1e9,  # 1 GB/s
        "host_bandwidth": 1e8,
        "peak_flops": {"float32": 1e12, "tf32": 4e12, "float16": 8e12},
        "efficiency": {"tensor_core": 0.5, "cuda_core": 1.0, "memory": 1.0},
        "launch_cost": 1e-6,
    }
    data.update(changes)
    return GpuSpec.model_validate(data)


def _op(flops: int, nbytes: int, dtype: str = "float32", tf32: bool = False) -> OpRecord:
    kind = "matmul" if flops else "memory"
    return OpRecord("aten.x", kind, dtype, flops, nbytes, 0, tf32)


def test_roofline_picks_the_bound():
    gpu = _toy_gpu()
    compute = op_time(_op(10**10, 10**6), gpu)  # 10 ms of FLOPs, 1 ms of bytes
    assert compute.bound == "compute"
    assert compute.total == pytest.approx(1e10 / 1e12 + 1e-6)
    memory = op_time(_op(10**6, 10**8), gpu)  # 1 us of FLOPs, 100 ms of bytes
    assert memory.bound == "memory"
    assert memory.total == pytest.approx(1e8 / 1e9 + 1e-6)
    elementwise = op_time(_op(0, 4000), gpu)
    assert elementwise.bound == "memory" and elementwise.total == pytest.approx(4e-6 + 1e-6)

    phase = estimate_phase([_op(10**10, 10**6), _op(10**6, 10**8), _op(0, 4000)], gpu)
    assert phase.kernels == 3 and phase.flops == 10**10 + 10**6 and phase.bytes == 10**8 + 1004000
    assert phase.compute == pytest.approx(1e-2) and phase.launch == pytest.approx(3e-6)
    assert phase.memory == pytest.approx(1e-1 + 4e-6)
    assert phase.seconds == pytest.approx(phase.compute + phase.memory + phase.launch)


def test_roofline_peak_per_dtype():
    gpu = _toy_gpu()
    flops = 10**12
    t = {
        "fp32": op_time(_op(flops, 0), gpu).compute,
        "tf32": op_time(_op(flops, 0, tf32=True), gpu).compute,
        "fp16": op_time(_op(flops, 0, "float16"), gpu).compute,
        "bf16": op_time(_op(flops, 0, "bfloat16"), gpu).compute,  # no bf16 tensor cores here
    }
    assert t["fp32"] == pytest.approx(1.0)  # CUDA cores, efficiency 1
    assert t["tf32"] == pytest.approx(1 / (4 * 0.5))
    assert t["fp16"] == pytest.approx(1 / (8 * 0.5))
    assert t["bf16"] == pytest.approx(1.0)  # falls back to the float32 rate
    no_tf32 = _toy_gpu(peak_flops={"float32": 1e12})
    assert op_time(_op(flops, 0, tf32=True), no_tf32).compute == pytest.approx(1.0)


# --------------------------------------------------------------------------- estimated profiles


@pytest.fixture(scope="module")
def resnet18_a100() -> Profile:
    return profile_model("resnet18", batch_size=2, input_shape=(3, 64, 64), estimate="a100")


@pytest.fixture(scope="module")
def gpt_tiny_h100() -> Profile:
    return profile_model("gpt-tiny", batch_size=2, input_shape=(16,), estimate="h100")


KEYS = {
    "forward_flops",
    "backward_flops",
    "forward_bytes",
    "backward_bytes",
    "forward_kernels",
    "backward_kernels",
    "bound",
    "compute_ms",
    "memory_ms",
    "launch_ms",
}


def _check_estimated(prof: Profile, key: str) -> None:
    gpu = gpu_catalog()[key]
    again = load_profile(save_profile(prof))  # YAML round trip, validated
    assert again == prof and again.sha256() == prof.sha256()
    assert yaml.safe_load(save_profile(prof))["device"]["kind"] == "estimated"
    assert prof.device is not None and prof.device.kind == "estimated"
    assert prof.device.name == gpu.name and prof.device.memory == gpu.memory
    assert prof.bandwidth == gpu.host_bandwidth
    measured = prof.measured
    assert measured is not None and measured.repeats == 0 and measured.estimate is not None
    assert measured.estimate["model"] == "roofline/1" and measured.estimate["catalog"] == key
    assert measured.estimate["gpu"] == gpu.to_dict()
    assert measured.estimate["tf32"] == tf32_flags().to_dict()
    for stage in prof.stages:
        est = stage.extra["estimate"]
        assert set(est) == KEYS and est["bound"] in ("compute", "memory")
        assert est["forward_kernels"] > 0 and est["forward_bytes"] > 0
        launch = gpu.launch_cost * 1000
        assert stage.forward_time >= est["forward_kernels"] * launch - 1e-6
        assert stage.backward_time >= est["backward_kernels"] * launch - 1e-6
        total = est["compute_ms"] + est["memory_ms"] + est["launch_ms"]
        assert stage.forward_time + stage.backward_time == pytest.approx(total, abs=1e-5)
        assert stage.saved_size >= stage.output_size > 0
    info = describe(prof, "none")
    low, high = info["min_memory"]["chain"], info["store_all_memory"]
    assert low <= high
    budget = (low + high) // 2
    for algo in CHAIN_ALGOS:
        sched = memplan.solve(prof, algo, memory=budget, optimizer="none")
        if algo == "store-all" and budget < high:
            assert not sched.feasible
            sched = memplan.solve(prof, algo, memory=high, optimizer="none")
        assert sched.feasible, algo
        assert memplan.simulate(prof, sched).valid
        assert sched.makespan >= prof.lower_bound - 1e-9


def test_resnet18_estimated(resnet18_a100):
    prof = resnet18_a100
    _check_estimated(prof, "a100")
    assert prof.input_size == 2 * 3 * 64 * 64 * F32
    # weight_size: the parameters and what else the stages keep between iterations (buffers, a
    # step count per parameter tensor, the loss and its gradient), measured like a CPU profile's
    assert prof.weight_size > 11_689_512 * F32
    stem, block = prof.stages[0].extra["estimate"], prof.stages[1].extra["estimate"]
    # the stem's input needs no gradient: its convolution's backward is the weight gradient only
    assert stem["backward_flops"] == stem["forward_flops"] > 0
    # a basic block: two 3x3 convolutions, 64 channels, 16x16 (after the stem's /4)
    conv = 2 * 2 * 64 * 16 * 16 * 64 * 3 * 3
    assert block["forward_flops"] == 2 * conv and block["backward_flops"] == 4 * conv
    assert prof.stages[-1].extra["estimate"]["forward_flops"] == 0  # the loss


def test_gpt_tiny_estimated(gpt_tiny_h100):
    _check_estimated(gpt_tiny_h100, "h100")
    embedding = gpt_tiny_h100.stages[0].extra["estimate"]
    assert embedding["forward_flops"] == 0  # lookups move bytes


def test_estimated_sizes_are_the_measured_ones(resnet18_a100):
    measured = profile_model("resnet18", batch_size=2, input_shape=(3, 64, 64), repeats=1)
    assert measured.input_size == resnet18_a100.input_size
    for a, b in zip(measured.stages, resnet18_a100.stages, strict=True):
        assert (a.name, a.output_size, a.saved_size, a.weight_size, a.grad_size) == (
            b.name,
            b.output_size,
            b.saved_size,
            b.weight_size,
            b.grad_size,
        )


def test_a_faster_gpu_gives_smaller_times(resnet18_a100):
    # same counts on a GPU with every rate doubled: the compute and memory terms halve
    data = gpu_catalog()["a100"].to_dict()
    data["hbm_bandwidth"] *= 2
    data["peak_flops"] = {k: v * 2 for k, v in data["peak_flops"].items()}
    data["launch_cost"] = 0.0
    fast = profile_model("resnet18", batch_size=2, input_shape=(3, 64, 64), gpu_spec=data)
    assert fast.measured.estimate.get("catalog") is None
    for slow, quick in zip(resnet18_a100.stages, fast.stages, strict=True):
        e = slow.extra["estimate"]
        expected = (e["compute_ms"] + e["memory_ms"]) / 2
        assert quick.forward_time + quick.backward_time == pytest.approx(expected, abs=2e-5)


def test_estimate_argument_errors():
    with pytest.raises(memplan.InputError, match="not both"):
        profile_model("gpt-tiny", estimate="a100", gpu_spec="x.yaml")
    with pytest.raises(memplan.InputError, match="unknown GPU"):
        profile_model("gpt-tiny", estimate="nosuchgpu")


# --------------------------------------------------------------------------- CLI


def test_cli_estimate(tmp_path):
    runner = CliRunner()
    target = tmp_path / "r18.yaml"
    args = ["profile", "resnet18", "--batch-size", "2", "--input-shape", "3,64,64"]
    result = runner.invoke(app, [*args, "--estimate", "a100", "-o", str(target)])
    assert result.exit_code == 0, result.stderr
    data = yaml.safe_load(target.read_text(encoding="utf-8"))
    assert data["device"]["kind"] == "estimated"
    assert data["device"]["name"] == gpu_catalog()["a100"].name
    assert data["bandwidth"] == gpu_catalog()["a100"].host_bandwidth
    assert "estimated for" in result.stderr

    info = runner.invoke(app, ["info", str(target)])
    assert info.exit_code == 0, info.stderr
    assert "estimated for" in info.stderr and gpu_catalog()["a100"].name in info.stderr
    assert "bound" in info.stderr and ("memory" in info.stderr or "compute" in info.stderr)

    spec = tmp_path / "gpu.yaml"
    spec.write_text(yaml.safe_dump(gpu_catalog()["l4"].to_dict()), encoding="utf-8")
    result = runner.invoke(app, ["profile", "gpt-tiny", "-b", "1", "--gpu-spec", str(spec)])
    assert result.exit_code == 0, result.stderr
    prof = load_profile(result.stdout)
    assert prof.device.kind == "estimated" and prof.device.name == "NVIDIA L4"


def test_cli_unknown_gpu():
    result = CliRunner().invoke(app, ["profile", "resnet18", "--estimate", "nosuchgpu"])
    assert result.exit_code == 2 and "a100" in result.stderr and result.stdout == ""


def test_embedding_reads_only_the_rows_it_gathers():
    """A lookup of 3 rows of a 1000 x 16 table reads 3 rows (and the indices), not the table."""
    table = torch.randn(1000, 16)
    indices = torch.tensor([1, 5, 7])
    records = count_ops(lambda: torch.nn.functional.embedding(indices, table))
    (record,) = [r for r in records if "embedding" in r.name]
    assert record.bytes_written == 3 * 16 * 4
    assert record.bytes_read == 3 * 16 * 4 + indices.nbytes
