import json
import math
import os
import random
import tempfile

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("GPU tests need a CUDA device", allow_module_level=True)

import flashgdn  # noqa: E402


def pytest_report_header(config):
    return (f"flashgdn {flashgdn.__version__} (kernels: {flashgdn.has_kernels}), torch {torch.__version__}, "
            f"device {torch.cuda.get_device_name()}")


@pytest.fixture
def seed(request):
    """A fresh seed per test, printed so a failure can be replayed (FLASHGDN_TEST_SEED)."""
    value = int(os.environ.get("FLASHGDN_TEST_SEED", random.SystemRandom().randrange(2**31)))
    torch.manual_seed(value)
    print(f"\n[seed {value}] {request.node.name}")
    return value


REGIMES = ("zero", "weak", "strong", "mixed", "model")


def make_gates(regime, B, T, Hv, device):
    """Log-space gates of DESIGN §4's regimes, [B, T, Hv] fp32."""
    if regime == "zero":
        return torch.zeros(B, T, Hv, device=device)
    if regime in ("weak", "mixed"):
        g = torch.nn.functional.logsigmoid(torch.randn(B, T, Hv, device=device)) / 16
        if regime == "mixed":
            zero_heads = torch.rand(Hv, device=device) < 0.25
            zero_heads[0] = True
            g[:, :, zero_heads] = 0
        return g
    # real-model gates: g = -exp(A_log) * softplus(a + dt_bias), A_log ~ log U(0, 16);
    # "strong" pins A = 16 on every head.
    if regime == "strong":
        a_log = torch.full((Hv,), math.log(16.0), device=device)
    else:
        a_log = torch.log(torch.empty(Hv, device=device).uniform_(1e-3, 16))
    dt_bias = torch.randn(Hv, device=device)
    a = torch.randn(B, T, Hv, device=device)
    return -torch.exp(a_log) * torch.nn.functional.softplus(a + dt_bias)


def make_inputs(B, T, Hqk, Hv, regime="weak", dtype=torch.bfloat16, device="cuda", normalize=True,
                initial_state=True, N=None):
    K = V = 128
    q = torch.randn(B, T, Hqk, K, device=device)
    k = torch.randn(B, T, Hqk, K, device=device)
    if normalize:
        q = torch.nn.functional.normalize(q, dim=-1)
        k = torch.nn.functional.normalize(k, dim=-1)
    v = torch.randn(B, T, Hv, V, device=device)
    g = make_gates(regime, B, T, Hv, device)
    beta = torch.sigmoid(torch.randn(B, T, Hv, device=device))
    N = B if N is None else N
    h0 = torch.randn(N, Hv, K, V, device=device) if initial_state else None
    return dict(q=q.to(dtype), k=k.to(dtype), v=v.to(dtype), g=g, beta=beta, initial_state=h0)


# Packed lengths every varlen path must take: empty sequences, one token, the chunk edges (63, 64, 65),
# short and long ones.
EDGE_LENGTHS = (0, 1, 63, 64, 65, 1000, 3, 2500, 0, 257)


def packed_varlen(Hqk, Hv, regime="mixed", lengths=EDGE_LENGTHS, padding=37, index_dtype=torch.int32):
    """Packed inputs of `lengths` with `padding` tokens past the last sequence: (x, cu_seqlens on the GPU)."""
    T = sum(lengths) + padding
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=index_dtype, device="cuda")
    return make_inputs(1, T, Hqk, Hv, regime=regime, N=len(lengths)), cu


def kernels_launched(fn):
    """Names of the CUDA kernels fn() launches (torch.profiler)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}


def kernel_grids(fn):
    """(name, grid (x, y, z)) of each CUDA kernel fn() launches, in the order they start: torch.profiler's
    chrome trace, whose kernel events carry the launch's grid in args["grid"]."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    kernels = sorted((e for e in events if str(e.get("cat", "")).lower() == "kernel"), key=lambda e: e["ts"])
    assert all("grid" in e.get("args", {}) for e in kernels), "the profiler's trace gives no kernel grids"
    grids = (e["args"]["grid"] for e in kernels)  # [x, y, z] (as a string in some traces)
    return [(e["name"], tuple(json.loads(g) if isinstance(g, str) else g)) for e, g in zip(kernels, grids)]


def as_batch(t, N):
    """A packed (1, N L, ...) tensor viewed as (N, L, ...)."""
    return t.view(N, t.shape[1] // N, *t.shape[2:])
