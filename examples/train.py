"""Train a small Gated DeltaNet layer for a few steps through flashgdn's autograd on an SM90 GPU.

The layer is built the way hybrid models (Qwen3.5/3.6) build theirs: q, k, v, a, b projections of a
hidden state, the model gate g = -exp(A_log) * softplus(a + dt_bias) (A = exp(A_log) ~ U(0, 16),
dt_bias = softplus^-1(dt) with dt log-uniform in [1e-3, 0.1]), beta = sigmoid(b), q/k L2-normalised
inside the kernel (use_qk_l2norm_in_kernel=True), grouped value heads (Hqk = 2, Hv = 4), an output
projection. Three packed sequences of odd lengths (partial chunks) go through
flashgdn.chunk_gated_delta_rule under bf16 autocast (fp32 master weights), AdamW fits the layer to
a fixed random teacher layer, and:
  - the first step's parameter gradients are checked against the same layer run in float64 on the
    CPU (CPU tensors run flashgdn's float64 reference forward and backward), loose tolerance;
  - the loss must stay finite and go down.
Prints one line; exits non-zero on failure. About a few seconds on an H200.

    pip install . && python examples/train.py        (needs torch and an SM90 GPU)
"""

import copy
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import flashgdn

HEAD_DIM = 128
STEPS = 40
LR = 3e-3
GRAD_TOL = 5e-2        # relative L2 of each weight matrix's gradient vs the float64 run
GATE_GRAD_TOL = 2e-1   # A_log, dt_bias: [Hv] sums over every token of dg, so coherent rounding shows most
LOSS_TOL = 1e-2        # relative difference of the first loss vs the float64 run


class GatedDeltaNet(nn.Module):
    def __init__(self, hidden=512, num_qk_heads=2, num_v_heads=4):
        super().__init__()
        self.hqk, self.hv = num_qk_heads, num_v_heads
        self.q_proj = nn.Linear(hidden, num_qk_heads * HEAD_DIM, bias=False)
        self.k_proj = nn.Linear(hidden, num_qk_heads * HEAD_DIM, bias=False)
        self.v_proj = nn.Linear(hidden, num_v_heads * HEAD_DIM, bias=False)
        self.a_proj = nn.Linear(hidden, num_v_heads, bias=False)
        self.b_proj = nn.Linear(hidden, num_v_heads, bias=False)
        self.o_proj = nn.Linear(num_v_heads * HEAD_DIM, hidden, bias=False)
        A = torch.empty(num_v_heads).uniform_(0, 16).clamp_min(1e-3)
        self.A_log = nn.Parameter(torch.log(A))
        dt = torch.exp(torch.empty(num_v_heads).uniform_(math.log(1e-3), math.log(0.1))).clamp_min(1e-4)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1(dt)

    def forward(self, x, cu_seqlens=None, cu_seqlens_cpu=None):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.hqk, HEAD_DIM)
        k = self.k_proj(x).view(B, T, self.hqk, HEAD_DIM)
        v = self.v_proj(x).view(B, T, self.hv, HEAD_DIM)
        # gates in fp32 on the GPU (the kernels' precision policy), in float64 on the reference path
        gate_dtype = torch.float32 if x.is_cuda else torch.float64
        g = -torch.exp(self.A_log.to(gate_dtype)) * F.softplus(self.a_proj(x).to(gate_dtype)
                                                               + self.dt_bias.to(gate_dtype))
        beta = torch.sigmoid(self.b_proj(x).to(gate_dtype))
        kwargs = {} if cu_seqlens_cpu is None else {"cu_seqlens_cpu": cu_seqlens_cpu}
        o, _ = flashgdn.chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True,
                                               cu_seqlens=cu_seqlens, **kwargs)
        return self.o_proj(o.reshape(B, T, self.hv * HEAD_DIM))


def loss_of(model, x, y, cu_seqlens, cu_seqlens_cpu=None):
    """Mean squared error against the teacher's output, normalised by the target's mean square."""
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=x.is_cuda):
        out = model(x, cu_seqlens, cu_seqlens_cpu)
    return ((out.to(y.dtype) - y) ** 2).mean() / (y ** 2).mean()


def rel_l2(x, ref):
    x, ref = x.double().cpu(), ref.double().cpu()
    return ((x - ref).norm() / ref.norm()).item() if ref.norm() > 0 else (x - ref).norm().item()


def main():
    if not torch.cuda.is_available():
        raise SystemExit("examples/train.py needs a CUDA device (SM90)")
    start = time.perf_counter()
    torch.manual_seed(0)
    hidden, lengths = 512, [300, 1100, 648]  # packed varlen, partial last chunks
    T = sum(lengths)
    cu_cpu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    cu = cu_cpu.cuda()

    teacher = GatedDeltaNet(hidden).cuda()
    student = GatedDeltaNet(hidden).cuda()
    x = torch.randn(1, T, hidden, device="cuda")
    with torch.no_grad():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = teacher(x, cu, cu_cpu).float()

    # 1. one step's gradients: bf16 on the GPU vs the same layer in float64 on the CPU (reference path)
    reference = copy.deepcopy(student).cpu().double()
    loss = loss_of(student, x, y, cu, cu_cpu)
    loss.backward()
    ref_loss = loss_of(reference, x.cpu().double(), y.cpu().double(), cu_cpu)
    ref_loss.backward()
    failures = []
    loss_err = abs(loss.item() - ref_loss.item()) / abs(ref_loss.item())
    if not loss_err < LOSS_TOL:
        failures.append(f"first loss {loss.item():.6f} vs float64 {ref_loss.item():.6f}")
    worst, worst_name = 0.0, ""
    ref_params = dict(reference.named_parameters())
    for name, p in student.named_parameters():
        if p.grad is None or not torch.isfinite(p.grad).all():
            failures.append(f"{name}: gradient missing or not finite")
            continue
        err = rel_l2(p.grad, ref_params[name].grad)
        tol = GATE_GRAD_TOL if name in ("A_log", "dt_bias") else GRAD_TOL
        if not err < tol:
            failures.append(f"{name}: gradient relative L2 {err:.2e} vs float64 (tolerance {tol:.0e})")
        if err > worst:
            worst, worst_name = err, name

    # 2. a few AdamW steps on the fixed batch
    optimizer = torch.optim.AdamW(student.parameters(), lr=LR, weight_decay=0.01)
    losses = []
    for _ in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_of(student, x, y, cu, cu_cpu)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    if not all(math.isfinite(v) for v in losses):
        failures.append(f"loss not finite: {losses}")
    elif not losses[-1] < 0.8 * losses[0]:
        failures.append(f"loss did not go down: {losses[0]:.4f} -> {losses[-1]:.4f}")
    elapsed = time.perf_counter() - start

    summary = (f"train.py: flashgdn {flashgdn.__version__}, {STEPS} AdamW steps on {T} tokens "
               f"({'+'.join(map(str, lengths))}), loss {losses[0]:.4f} -> {losses[-1]:.4f}; "
               f"gradients vs float64 reference: worst {worst:.2e} ({worst_name}), first loss off by "
               f"{loss_err:.1e}; {elapsed:.1f} s")
    if failures:
        raise SystemExit(summary + "\nFAILED: " + "; ".join(failures))
    print(summary + ": OK")


if __name__ == "__main__":
    main()
