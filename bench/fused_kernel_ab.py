"""A/B timing of the fused forward kernels (mma.sync with its V split, wgmma, warp-specialized wgmma v3,
v4 with the state in registers and v5 with the chunk inverse inside) on the same
inputs: whole forward call by CUDA-graph replay (median), CP off and CP automatic, and the
per-chunk step time of the fused kernel's serial chain without CP (call time / chunks per CTA wave).

    python bench/fused_kernel_ab.py [--kernels rs,inv] [--out DIR]     (CSV <date>_fused_kernel_ab_<commit>.csv)
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
if importlib.util.find_spec("flashgdn") is None:
    sys.path.insert(0, str(ROOT / "python"))
from flashgdn.bench.inputs import make_inputs  # noqa: E402
from flashgdn.bench.timing import git_commit, time_graph  # noqa: E402
from flashgdn.ops import forward_into  # noqa: E402

# (lengths, Hqk, Hv): rows of the forward table from one long sequence to full waves
CONFIGS = [([32768], 2, 8), ([32768], 16, 32), ([8192], 16, 32), ([8192] * 4, 16, 32), ([8192] * 8, 8, 32),
           ([2048] * 16, 16, 32), ([32768], 16, 16)]
KERNELS = {"mma.sync": 1, "wgmma": 2, "ws": 3, "rs": 4, "inv": 5}
AUTO, OFF = 0, 1


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    parser.add_argument("--kernels", default=",".join(KERNELS), help="comma-separated names of KERNELS")
    args = parser.parse_args()
    kernels = {name: KERNELS[name] for name in args.kernels.split(",")}
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    path = pathlib.Path(args.out) / f"{datetime.date.today()}_fused_kernel_ab_{git_commit()}.csv"
    lines = ["seqlens,h_qk,h_v,kernel,cp,ms,chunk_step_us"]
    for lengths, hqk, hv in CONFIGS:
        inp = make_inputs(lengths, hqk, hv)
        x, cu = inp["x"], inp["cu"]
        o = torch.empty_like(x["v"])
        final = torch.empty(len(lengths), hv, 128, 128, device="cuda")
        for name, kernel in kernels.items():
            for cp in (OFF, AUTO):
                def call():
                    forward_into(o, final, x["q"], x["k"], x["v"], x["g"], x["beta"], x["initial_state"], cu,
                                 128 ** -0.5, False, False, False, inp["cu_cpu"], cp, kernel=kernel)
                ms = time_graph(call)
                # CTAs (v split 2 for mma.sync when the doubled grid fits), waves, chunks per CTA
                ctas = len(lengths) * hv * (2 if kernel == 1 and 2 * len(lengths) * hv <= sms else 1)
                waves = -(-ctas // sms)
                step = 1e3 * ms / (waves * -(-max(lengths) // 64)) if cp == OFF else float("nan")
                label = "x".join(str(n) for n in lengths) if len(set(lengths)) > 1 else f"{len(lengths)}x{lengths[0]}"
                lines.append(f"{label},{hqk},{hv},{name},{'auto' if cp == AUTO else 'off'},{ms:.4f},{step:.2f}")
                print(f"{label:>12} ({hqk:2},{hv:2}) {name:8} cp {'auto' if cp == AUTO else 'off ':4} {ms:8.3f} ms"
                      + (f"  chunk step {step:6.2f} us" if cp == OFF else ""), flush=True)
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
