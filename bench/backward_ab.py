"""A/B of the two backward paths on the same inputs: the fused backward (default) and the split
backward (FLASHGDN_BACKWARD_SPLIT=1: the dS pass writing dS^T per chunk, then the gradient pass over
every (chunk, v-head)). Per configuration: the whole backward call by CUDA-graph replay (median, CP
automatic, the benchmark's bwd row) for each path, and the largest relative L2 difference between
the two paths' gradients (both are checked against float64 by the test suite; here a quick cross-check).

    python bench/backward_ab.py [COUNTxLENGTH:HQK:HV ...] [--out DIR]   (CSV <date>_backward_ab_<commit>.csv)
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
if importlib.util.find_spec("flashgdn") is None:
    sys.path.insert(0, str(ROOT / "python"))
import flashgdn  # noqa: E402
from flashgdn.bench.inputs import make_inputs  # noqa: E402
from flashgdn.bench.timing import git_commit, time_graph  # noqa: E402

DEFAULT = ["8x1024:16:32", "1x8192:16:32", "4x8192:8:16", "1x32768:16:32", "1x8192:2:8", "8x8192:4:8"]
GRADS = ("dq", "dk", "dv", "dg", "dbeta", "dh0")


def backward_call(spec: str):
    shape, hqk, hv = spec.split(":")
    count, length = shape.split("x")
    inp = make_inputs([int(length)] * int(count), int(hqk), int(hv), backward=True)
    x = inp["x"]
    return lambda: flashgdn.chunk_gated_delta_rule_bwd(x["q"], x["k"], x["v"], x["g"], x["beta"], inp["do"],
                                                       inp["dht"], x["initial_state"], inp["cu"], inp["scale"],
                                                       False, False, inp["cu_cpu"])


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("configs", nargs="*", default=DEFAULT)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = parser.parse_args()
    path = pathlib.Path(args.out) / f"{datetime.date.today()}_backward_ab_{git_commit()}.csv"
    lines = ["config,fused_ms,split_ms,split_speedup,max_rel_diff,worst_grad"]
    for spec in args.configs:
        call = backward_call(spec)
        times, grads = {}, {}
        for split in ("0", "1"):
            os.environ["FLASHGDN_BACKWARD_SPLIT"] = split
            grads[split] = [g.clone() for g in call()]
            torch.cuda.synchronize()
            times[split] = time_graph(call)
        os.environ.pop("FLASHGDN_BACKWARD_SPLIT")
        diffs = {name: rel_l2(a, b) for name, a, b in zip(GRADS, grads["1"], grads["0"]) if a.numel()}
        worst = max(diffs, key=diffs.get)
        line = (f"{spec},{times['0']:.4f},{times['1']:.4f},{times['0'] / times['1']:.3f},{diffs[worst]:.2e},"
                f"{worst}")
        lines.append(line)
        print(line, flush=True)
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
