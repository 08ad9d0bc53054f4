"""The backward's errors on expansive keys over many seeds: the data behind the tolerance of
tests/gpu/test_backward.py::test_expansive_keys_fail_loudly (its inputs: one key direction shared
by 64 tokens, beta |k|^2 = 2.4, so the state grows by 1.4 a token along it and every rounding in the
chain is amplified by up to 1.4^63).

  python3 bench/expansive_keys_sweep.py [seeds]     (default 32; needs the GPU and the built library)

Per seed: whether the default call (fp16 merges) came back with a non-finite gradient, and each
gradient's relative L2 error against the float64 oracle for the inverse_fp32 call (split bf16
merges). A library without the inverse_fp32 flag (before it existed) gives its default call's errors
instead. Last line: the worst of each gradient over the seeds."""

import inspect
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "gpu"))
from conftest import make_inputs  # noqa: E402
from oracle import backward_f64, rel_l2  # noqa: E402

from flashgdn.ops import backward_into  # noqa: E402

NAMES = ("dq", "dk", "dv", "dg", "dbeta")


def expansive_inputs():
    x = make_inputs(1, 64, 1, 1, regime="zero", initial_state=False)
    direction = torch.nn.functional.normalize(torch.randn(1, 1, 1, 128, device="cuda"), dim=-1)
    x["k"] = (2.4 ** 0.5 * direction).expand(1, 64, 1, 128).to(torch.bfloat16).contiguous()
    x["beta"] = torch.ones_like(x["beta"])
    return x


def gradients(x, do, **flags):
    grads = {n: torch.empty_like(x[i], dtype=torch.float32 if i == "g" else x[i].dtype)
             for n, i in zip(NAMES, ("q", "k", "v", "g", "beta"))}
    for t in grads.values():
        t.fill_(float("nan"))
    backward_into(*(grads[n] for n in NAMES), None, *(x[n] for n in ("q", "k", "v", "g", "beta")), do, None, None,
                  None, 128 ** -0.5, False, False, None, 1, **flags)
    return grads


def main():
    seeds = int(sys.argv[1]) if len(sys.argv) > 1 else 32
    has_flag = "inverse_fp32" in inspect.signature(backward_into).parameters
    worst = dict.fromkeys(NAMES, 0.0)
    print(f"expansive keys, {seeds} seeds, errors of the {'inverse_fp32' if has_flag else 'default'} call")
    for seed in range(seeds):
        torch.manual_seed(seed)
        x = expansive_inputs()
        do = torch.randn_like(x["v"])
        default = gradients(x, do)
        default_finite = all(torch.isfinite(default[n].float()).all() for n in NAMES)
        got = gradients(x, do, inverse_fp32=True) if has_flag else default
        ref = backward_f64(*(x[n] for n in ("q", "k", "v", "g", "beta")), 128 ** -0.5, do, None, None, None, False,
                           False)
        errors = {n: rel_l2(got[n], want) for n, want in zip(NAMES, ref)}
        for n, e in errors.items():
            worst[n] = max(worst[n], e)
        print(f"seed {seed:3d}: default all finite {default_finite!s:5}  "
              + " ".join(f"{n}={e:.2e}" for n, e in errors.items()))
    print("worst: " + " ".join(f"{n}={e:.2e}" for n, e in worst.items()))


if __name__ == "__main__":
    main()
