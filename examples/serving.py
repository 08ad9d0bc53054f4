"""Serving with flashgdn: a prefill that checkpoints states for prefix caching into a state pool, then
a decode loop that reads and writes the pool in place, checked against the float64 oracle.

    python examples/serving.py

Three requests of different lengths are prefilled in one varlen call: their final states go to pool
slots, and the state after every 256 tokens goes to a checkpoint buffer (a prefix cache). Then 16
decode steps (one token per request per step) read each request's slot and write it back. Finally
a new request that shares a 512-token prefix with request 1 starts from that checkpoint instead of
recomputing it, and must match a full prefill of its whole text. Prints one summary line; exits
non-zero on a mismatch.
"""

import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

from flashgdn.bench.oracle import forward_f64, rel_l2  # noqa: E402
from flashgdn.ops import forward_into  # noqa: E402

HQK, HV, D = 2, 4, 128
SCALE = D ** -0.5
CHECKPOINT_CHUNKS = 4  # every 256 tokens


def tokens(n, gen):
    """Per-token inputs of one request: q, k (L2-normalised), v, g (model-like gates), beta."""
    q = torch.nn.functional.normalize(torch.randn(1, n, HQK, D, generator=gen, device="cuda"), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(1, n, HQK, D, generator=gen, device="cuda"), dim=-1)
    v = torch.randn(1, n, HV, D, generator=gen, device="cuda")
    g = -torch.nn.functional.softplus(torch.randn(1, n, HV, generator=gen, device="cuda")) * 0.1
    beta = torch.sigmoid(torch.randn(1, n, HV, generator=gen, device="cuda"))
    return dict(q=q.bfloat16(), k=k.bfloat16(), v=v.bfloat16(), g=g, beta=beta)


def cat(parts):
    return {key: torch.cat([p[key] for p in parts], dim=1) for key in parts[0]}


def run(x, cu, pool, read, write, checkpoints=None):
    o = torch.empty_like(x["v"])
    forward_into(o, pool, x["q"], x["k"], x["v"], x["g"], x["beta"], pool, cu, SCALE, False, False, False, None, 0, 0,
                 -10.0, 0, read, write, checkpoints, CHECKPOINT_CHUNKS if checkpoints is not None else 0)
    return o


def main():
    gen = torch.Generator(device="cuda").manual_seed(0)
    lengths = [700, 1024, 300]
    prompts = [tokens(n, gen) for n in lengths]
    pool = torch.zeros(8, HV, D, D, device="cuda")  # slots 0-7; requests use 5, 1, 6
    slots = torch.tensor([5, 1, 6], dtype=torch.int32, device="cuda")
    cu = torch.tensor([0, 700, 1724, 2024], dtype=torch.int32, device="cuda")
    prefill = cat(prompts)
    checkpoints = torch.full((2024 // 256, HV, D, D), float("nan"), device="cuda")
    no_slot = torch.full_like(slots, -1)
    run(prefill, cu, pool, no_slot, slots, checkpoints)  # zero start, final states into the slots

    history = [dict(p) for p in prompts]
    step_cu = torch.arange(4, dtype=torch.int32, device="cuda")
    for _ in range(16):  # decode: one token per request, the pool updated in place
        step = [tokens(1, gen) for _ in lengths]
        run(cat(step), step_cu, pool, slots, slots)
        history = [cat([h, s]) for h, s in zip(history, step)]

    errors = []
    for i, h in enumerate(history):  # each slot equals the oracle's state after prompt + 16 tokens
        _, ref = forward_f64(**h, scale=SCALE)
        errors.append(rel_l2(pool[slots[i]], ref[0]))
    # Prefix cache: request 1's checkpoint after 512 tokens is row 700 // 256 + 1 = 3.
    shared = {key: value[:, :512] for key, value in prompts[1].items()}
    suffix = tokens(200, gen)
    cache = torch.zeros(1, HV, D, D, device="cuda")
    cache[0] = checkpoints[700 // 256 + 1]
    zero = torch.zeros(1, dtype=torch.int32, device="cuda")
    o_suffix = run(suffix, torch.tensor([0, 200], dtype=torch.int32, device="cuda"), cache, zero, zero)
    ref_o, ref_final = forward_f64(**cat([shared, suffix]), scale=SCALE)
    errors.append(rel_l2(o_suffix, ref_o[:, 512:]))
    errors.append(rel_l2(cache[0], ref_final[0]))
    worst = max(errors)
    ok = worst <= 5e-3
    print(f"serving.py: prefill {lengths} with checkpoints every {64 * CHECKPOINT_CHUNKS} tokens, 16 decode "
          f"steps through a state pool, a 512-token cached prefix reused; worst rel L2 vs float64 {worst:.2e}: "
          f"{'OK' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
