"""Inputs of one benchmark configuration, fresh for every configuration (DESIGN §4-§5).

Packed varlen (B = 1, int32 cu_seqlens), head dim 128, as FlashQLA's published benchmark:
q, k = L2-normalised randn (bf16); v = randn (bf16); beta = sigmoid(randn) (fp32); h0 = randn (fp32);
gates by one of two recipes:
  bench   g = logsigmoid(randn) / 16 (fp32), then 25% of the v-heads, chosen at random, set to g = 0
          (FlashQLA's recipe; those heads never decay);
  model   g = -exp(A_log) * softplus(a + dt_bias), A_log = log U(1e-3, 16) per head, dt_bias = randn per
          head, a = randn per token (the gates real Qwen3.5/3.6 GDN layers make; DESIGN §4).
Backward: dO = randn (bf16), dht = randn / 8 (fp32), as FlashQLA's backward benchmark.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .configs import D

GATE_RECIPES = ("bench", "model")


def make_gates(recipe: str, T: int, hv: int, device) -> torch.Tensor:
    """Log-space gates [1, T, Hv] fp32."""
    if recipe == "bench":
        g = F.logsigmoid(torch.randn(1, T, hv, device=device)) / 16
        g[:, :, torch.randperm(hv, device=device)[: hv // 4]] = 0
        return g
    if recipe == "model":
        a_log = torch.log(torch.empty(hv, device=device).uniform_(1e-3, 16))
        dt_bias = torch.randn(hv, device=device)
        a = torch.randn(1, T, hv, device=device)
        return -torch.exp(a_log) * F.softplus(a + dt_bias)
    raise ValueError(f"gate recipe {recipe!r}: expected one of {', '.join(GATE_RECIPES)}")


def make_inputs(lengths: list[int], hqk: int, hv: int, gates: str = "bench", backward: bool = False,
                device="cuda") -> dict:
    """dict(x=dict(q, k, v, g, beta, initial_state), cu (int32, device), cu_cpu (int64, host), lengths,
    scale, and with backward=True: do, dht)."""
    T, N = sum(lengths), len(lengths)
    q = F.normalize(torch.randn(1, T, hqk, D, device=device), dim=-1).bfloat16()
    k = F.normalize(torch.randn(1, T, hqk, D, device=device), dim=-1).bfloat16()
    v = torch.randn(1, T, hv, D, device=device).bfloat16()
    g = make_gates(gates, T, hv, device)
    beta = torch.sigmoid(torch.randn(1, T, hv, device=device))
    h0 = torch.randn(N, hv, D, D, device=device)
    cu_cpu = torch.tensor([0] + lengths, dtype=torch.int64).cumsum(0)
    inp = dict(x=dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0), cu=cu_cpu.to(device, torch.int32),
               cu_cpu=cu_cpu, lengths=list(lengths), scale=1 / math.sqrt(D))
    if backward:
        inp["do"] = torch.randn(1, T, hv, D, device=device).bfloat16()
        inp["dht"] = torch.randn(N, hv, D, D, device=device) / 8
    return inp
