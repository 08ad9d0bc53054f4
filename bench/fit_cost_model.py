"""Fit the auto-CP cost model (src/plan/cost_model.h) to flashgdn's forward kernels on this GPU.

Whole calls are timed by CUDA-graph replay (median) in three single-wave experiments, so that every
kernel's makespan is its longest item and the model is linear in its coefficients:

  A  no CP, one sequence of C chunks, Hv = 4:       t_A(C) = base(C) + launch + C f
  B  CP on, g == 0 (every head exact), segments of L chunks, S = C / L:
       t_B - t_A = 3 launch + L max(s, m) + (S - 1)(c + c_m) + (L - C) f  [+ item constants]
  C  CP on, strong decay (windows of one chunk):
       t_C - t_A = 3 launch + s + (S - 1) c + (L - C) f                    [+ item constants]
with f = fused_chunk_us, s = state_chunk_us, m = state_m_chunk_us, c = correction_step_us,
c_m = correction_m_step_us. base(C) (the chunk inverse, parallel over chunks) is the same with and
without CP and cancels in the differences. B and C run on two families fitted together: the long
sequence of A (C = 512 chunks, L = 32 .. 256) and a short one at more heads (64 chunks at Hv = 16,
L = 8 .. 32: one wave), where the decisions of the tables' 4k-8k rows are made; each family's differences are
taken from its own no-CP time. The per-item constants and the gate scan are folded
into launch_us (item constants 0). Prints the fitted coefficients as C++ for CostModel's defaults
and writes them, with every measurement, to bench/results/<date>_cost_model_<commit>.json.

--direction bwd fits the same model to the backward (the whole backward call: its chunk inverse,
forward recompute and fused backward, or with CP their CP pipelines): the fused chunk stands for the
chunk-state pass plus the fused backward, the state pass for the S* and dS* passes, the correction
for the forward and the reverse scan; the record is <date>_cost_model_bwd_<commit>.json.

--write-header puts the fitted values into the sources (forward: CostModel's defaults in
src/plan/cost_model.h; backward: CostModel::backward() in src/plan/cost_model.cpp) and the record's
name beside them, for a rebuild and a sweep in the same run.

    python bench/fit_cost_model.py [--direction fwd|bwd] [--tokens 32768] [--heads 4] [--short-tokens 4096]
        [--short-heads 16] [--write-header]
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import re
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "tests" / "gpu"))

import flashgdn  # noqa: E402
from conftest import make_gates  # noqa: E402  (the test regimes: zero, weak, strong, mixed, model)
from flashgdn.bench.timing import git_commit as commit, time_graph  # noqa: E402

OFF, ON = 1, 2


def inputs(T, hv, regime):
    q = torch.nn.functional.normalize(torch.randn(1, T, hv, 128, device="cuda"), dim=-1).bfloat16()
    k = torch.nn.functional.normalize(torch.randn(1, T, hv, 128, device="cuda"), dim=-1).bfloat16()
    v = torch.randn(1, T, hv, 128, device="cuda").bfloat16()
    g = make_gates(regime, 1, T, hv, "cuda")
    beta = torch.sigmoid(torch.randn(1, T, hv, device="cuda"))
    return q, k, v, g, beta


def call_time_us(x, mode, segment_chunks=0, direction="fwd"):
    q, k, v, g, beta = x
    if direction == "fwd":
        o = torch.empty_like(v)

        def fn():
            flashgdn.ops.forward_into(o, None, q, k, v, g, beta, None, None, 128 ** -0.5, False, False, False,
                                      None, mode, segment_chunks)
    else:
        do = torch.randn_like(v)
        grads = [torch.empty_like(t) for t in x]

        def fn():
            flashgdn.ops.backward_into(*grads, None, q, k, v, g, beta, do, None, None, None, 128 ** -0.5, False,
                                       False, None, mode, segment_chunks)
    return 1e3 * time_graph(fn)


def lstsq(rows, values):
    a = torch.tensor(rows, dtype=torch.float64)
    b = torch.tensor(values, dtype=torch.float64).unsqueeze(1)
    return torch.linalg.lstsq(a, b).solution.squeeze(1).tolist()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--short-tokens", type=int, default=4096, help="the short family's sequence")
    parser.add_argument("--short-heads", type=int, default=16, help="the short family's v-heads")
    parser.add_argument("--direction", choices=("fwd", "bwd"), default="fwd")
    parser.add_argument("--write-header", action="store_true", help="put the fit into src/plan/")
    args = parser.parse_args()
    hv, T, direction = args.heads, args.tokens, args.direction
    C = T // 64
    record = {"device": torch.cuda.get_device_name(), "commit": commit(), "direction": direction, "heads": hv,
              "tokens": T}

    # A: the fused kernel's per-chunk time from the slope over sequence lengths.
    a_rows, a_times = [], []
    for tokens in (T // 8, T // 4, T // 2, T):
        t = call_time_us(inputs(tokens, hv, "weak"), OFF, direction=direction)
        a_rows.append([1.0, tokens / 64])
        a_times.append(t)
    intercept_a, fused_chunk = lstsq(a_rows, a_times)
    record["A"] = {"chunks": [r[1] for r in a_rows], "us": a_times}
    t_a = a_times[-1]

    # B and C run in two families: the long sequence of A (segments of C/16 .. C/2 chunks) and a short
    # one at more heads (--short-tokens, --short-heads; segments of 4 .. 32 chunks while the segments'
    # items fit one wave of the H200's 132 SMs), where the planner's
    # decisions are closest; both share the coefficients, each has its own no-CP time t_A.
    short_chunks = args.short_tokens // 64
    families = [(T, hv, t_a, [L for L in (C // 16, C // 8, C // 4, C // 2) if L >= 4]),
                (args.short_tokens, args.short_heads,
                 call_time_us(inputs(args.short_tokens, args.short_heads, "weak"), OFF, direction=direction),
                 [L for L in (4, 8, 16, 32) if L < short_chunks and short_chunks // L * args.short_heads <= 132])]
    record["families"] = [{"tokens": f[0], "heads": f[1], "t_A_us": f[2], "segment_chunks": f[3]} for f in families]

    # C: windows of one chunk -> s and c.
    c_rows, c_vals, c_times = [], [], []
    for tokens, heads, t_nocp, segment_lengths in families:
        strong, chunks = inputs(tokens, heads, "strong"), tokens // 64
        for L in segment_lengths:
            S = chunks // L
            t = call_time_us(strong, ON, L, direction)
            c_times.append(t)
            c_rows.append([1.0, S - 1])
            c_vals.append(t - t_nocp - (L - chunks) * fused_chunk)
    const_c, step = lstsq(c_rows, c_vals)
    record["C"] = {"segment_chunks": [L for f in families for L in f[3]], "us": c_times}

    # B: every head exact -> max(s, m) and c + c_m.
    b_rows, b_vals, b_times = [], [], []
    for tokens, heads, t_nocp, segment_lengths in families:
        exact, chunks = inputs(tokens, heads, "zero"), tokens // 64
        for L in segment_lengths:
            S = chunks // L
            t = call_time_us(exact, ON, L, direction)
            b_times.append(t)
            b_rows.append([1.0, L, S - 1])
            b_vals.append(t - t_nocp - (L - chunks) * fused_chunk)
    const_b, state_or_m, step_with_m = lstsq(b_rows, b_vals)
    record["B"] = {"segment_chunks": [L for f in families for L in f[3]], "us": b_times}

    launch = max(const_c, 0.0) / 3  # 3 extra launches carry the constants (items, gate scan, one chunk)
    coefficients = {
        "fused_chunk_us": fused_chunk,
        "fused_item_us": 0.0,
        "state_chunk_us": state_or_m,  # the S* and M CTAs of a segment run side by side in one wave
        "state_m_chunk_us": 0.0,
        "state_item_us": 0.0,
        "correction_step_us": max(step, 0.0),
        "correction_m_step_us": max(step_with_m - step, 0.0),
        "correction_item_us": 0.0,
        "gate_scan_chunk_us": 0.0,
        "launch_us": launch,
    }
    record["fit"] = coefficients
    record["residual_constants_us"] = {"A_intercept": intercept_a, "B_const": const_b, "C_const": const_c}
    tag = "cost_model" if direction == "fwd" else "cost_model_bwd"
    out = ROOT / "bench" / "results" / f"{datetime.date.today()}_{tag}_{record['commit']}.json"
    out.write_text(json.dumps(record, indent=1))
    print(json.dumps(record, indent=1))
    print(f"// fitted by bench/fit_cost_model.py --direction {direction}:")
    for name, value in coefficients.items():
        print(f"  {name} = {value:.3f};")
    print(f"wrote {out}")
    if args.write_header:
        write_sources(coefficients, out.name, direction)


def write_sources(coefficients, record_name, direction):
    """The fitted coefficients into the source that holds them (forward: `double name = value;`, the
    defaults in cost_model.h; backward: `model.name = value;` in CostModel::backward()), and the
    record named beside them."""
    source = ROOT / "src" / "plan" / ("cost_model.h" if direction == "fwd" else "cost_model.cpp")
    prefix = "double " if direction == "fwd" else "model\\."
    tag = "cost_model" if direction == "fwd" else "cost_model_bwd"
    text = source.read_text()
    for name, value in coefficients.items():
        text, count = re.subn(rf"({prefix}{name} = )[-0-9.e]+;", rf"\g<1>{value:.3f};", text)
        if count != 1:
            raise SystemExit(f"{source}: expected one value of {name}, found {count}")
    text, count = re.subn(rf"bench/results/[0-9-]+_{tag}_\w+\.json", f"bench/results/{record_name}", text)
    if count != 1:
        raise SystemExit(f"{source}: expected one record name, found {count}")
    source.write_text(text)
    print(f"wrote the fitted coefficients into {source}")


if __name__ == "__main__":
    main()
