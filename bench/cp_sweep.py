"""Auto-CP never slower than no CP: the forward timed with the planner's choice (auto) and with CP
off over (sequences x v-heads) from 1 to 256 and sequence lengths 2k-128k, by CUDA-graph replay.

Each row: sequences N, v-heads Hv, tokens per sequence, the planner's segment length (0: off),
both times and auto / off. The summary gives the worst ratio (it must stay within noise, <= 1.03)
and the geometric-mean gain where CP engaged. CSV under bench/results/<date>_cp_sweep_<commit>.csv.

--direction bwd, or --splits for the forward: the low-parallelism rows of the tables (SPLIT_CONFIGS:
one sequence of 2k-32k tokens at Hv 8, 16, 32; two of 4k at Hv 16; four of 8k at Hv 8; one of 8k
at Hv 64, where CP should stay off; the backward adds BACKWARD_SPLIT_CONFIGS' rows, the forward
FORWARD_SPLIT_CONFIGS' corners of the sweep's grid), timed with the planner's choice (auto), with CP off and forced on at segment lengths 4-256
chunks: does auto find the best cut? bench/fit_cost_model.py fits the cost model to this scan. CSV
<date>_cp_sweep_<fwd|bwd>_splits_<commit>.csv, one row per (configuration, segment length; 0: off,
-1: auto).

    python bench/cp_sweep.py [--quick] [--direction fwd|bwd] [--splits] [--out DIR]
"""

from __future__ import annotations

import argparse
import csv
import datetime
import math
import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "tests" / "gpu"))

import flashgdn  # noqa: E402
from conftest import make_gates  # noqa: E402  (the test regimes: zero, weak, strong, mixed, model)
from flashgdn.bench.timing import git_commit as commit, time_graph  # noqa: E402

AUTO, OFF, ON = 0, 1, 2
LENGTHS = [2048, 8192, 32768, 131072]
SEQS = [1, 2, 4, 8]
HEADS = [1, 2, 4, 8, 16, 32, 64]
MAX_TOKENS_HEADS = 131072 * 32  # memory / time cap per configuration


def sweep_inputs(n, length, hv):
    """n sequences of `length` tokens (or of the lengths in a tuple of n) packed in one batch row,
    "mixed" gates: (q, k, v, g, beta), the device cu_seqlens and its host copy."""
    lengths = list(length) if isinstance(length, tuple) else [length] * n
    T = sum(lengths)
    q = torch.nn.functional.normalize(torch.randn(1, T, hv, 128, device="cuda"), dim=-1).bfloat16()
    k = torch.nn.functional.normalize(torch.randn(1, T, hv, 128, device="cuda"), dim=-1).bfloat16()
    v = torch.randn(1, T, hv, 128, device="cuda").bfloat16()
    g = make_gates("mixed", 1, T, hv, "cuda")
    beta = torch.sigmoid(torch.randn(1, T, hv, device="cuda"))
    cu_cpu = torch.tensor([0] + lengths, dtype=torch.int64).cumsum(0)
    return (q, k, v, g, beta), cu_cpu.to(device="cuda", dtype=torch.int32), cu_cpu


def timed(x, mode, cu, cu_cpu, segment_chunks=0):
    q, k, v, g, beta = x
    o = torch.empty_like(v)

    def fn():
        flashgdn.ops.forward_into(o, None, q, k, v, g, beta, None, cu, 128 ** -0.5, False, False, False, cu_cpu,
                                  mode, segment_chunks)
    return time_graph(fn, replays=10), o


def backward_timed(x, mode, segment_chunks, cu, cu_cpu):
    q, k, v, g, beta = x
    do = torch.randn_like(v)
    grads = [torch.empty_like(t) for t in (q, k, v, g, beta)]

    def fn():
        flashgdn.ops.backward_into(*grads, None, q, k, v, g, beta, do, None, None, cu, 128 ** -0.5, False, False,
                                   cu_cpu, mode, segment_chunks)
    return time_graph(fn, replays=10)


# Low-parallelism configurations (sequences, tokens per sequence, v-heads) of the split scans: the
# tables' 1 x 2k-32k rows at Hv 8, 16, 32, the 4096-token rows where the decision is closest, four
# sequences of 8k at Hv 8, and one of 8k at Hv 64, where CP should stay off. The forward's scan adds
# the corners of the sweep's grid (1-2 heads, several short sequences, 128k), which its cost-model
# fit needs to keep auto within noise of off there, and the table's rows of 24-48 v-heads where CP
# fills more than one wave (one 32k sequence; two of mixed lengths, a tuple of lengths: the
# planner's balanced segments and waves at unequal lengths).
SPLIT_CONFIGS = ([(1, length, hv) for hv in (8, 16, 32) for length in (2048, 4096, 8192, 32768)]
                 + [(2, 4096, 16), (4, 8192, 8), (1, 8192, 64)])
FORWARD_SPLIT_CONFIGS = SPLIT_CONFIGS + [(1, 2048, 1), (8, 2048, 2), (4, 2048, 4), (2, 2048, 8), (2, 8192, 1),
                                         (4, 8192, 4), (2, 32768, 2), (4, 32768, 4), (1, 131072, 4), (4, 131072, 2),
                                         (1, 32768, 24), (1, 32768, 48), (2, (28672, 4096), 48),
                                         (2, (24576, 8192), 16), (2, (6144, 2048), 24), (2, (28672, 4096), 8),
                                         (8, 2048, 4),  # 8 x 2048 at Hv 4: CP taken at 1.062 of off (edbf548)
                                         # mixed pairs the 005411a refit cut shorter, 2-5.6% slower (3757801):
                                         (2, (6144, 2048), 8), (2, (1024, 7168), 8), (2, (1024, 7168), 48),
                                         # rows the ab2cb94 refit cut shorter, 3-5% slower (session 18):
                                         (1, 32768, 64), (2, (24576, 8192), 48), (1, 16384, 48)]
# The backward's scan adds the shapes its 7abd2b5 refit got wrong or could not see: four 8k sequences at
# Hv 16 (CP turned on, the call no faster: 1806 -> 1824 us) and the backward table's mixed rows at Hv 32
# (7212+7072+13725+4759 0.969x of the old model's cut; 7212+25556 1.159x).
# The ab2cb94 refit's loser: the backward table's eight mixed sequences at Hv 8 (0.937x).
BACKWARD_SPLIT_CONFIGS = SPLIT_CONFIGS + [(4, 8192, 16), (2, (7212, 25556), 32), (4, (7212, 7072, 13725, 4759), 32),
                                          (8, (161, 1928, 3157, 563, 1244, 229, 177, 733), 8)]


def lengths_label(length):
    """The tokens_per_seq column: one length, or a mixed configuration's lengths joined by '+'
    (bench/cp_plan_predict reads both)."""
    return "+".join(map(str, length)) if isinstance(length, tuple) else str(length)


def split_sweep(direction, out_dir):
    """Auto against CP off and forced on at several segment lengths: does auto find the best cut?
    Returns the CSV's path (bench/fit_cost_model.py fits the cost model to it)."""
    def timed_call(x, mode, segment_chunks, cu, cu_cpu):
        if direction == "bwd":
            return backward_timed(x, mode, segment_chunks, cu, cu_cpu)
        return timed(x, mode, cu, cu_cpu, segment_chunks)[0]

    configs = FORWARD_SPLIT_CONFIGS if direction == "fwd" else BACKWARD_SPLIT_CONFIGS
    path = pathlib.Path(out_dir) / f"{datetime.date.today()}_cp_sweep_{direction}_splits_{commit()}.csv"
    worst = 0.0
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["sequences", "h_v", "tokens_per_seq", "segment_chunks", "ms", "over_off"])
        for n, length, hv in configs:
            x, cu, cu_cpu = sweep_inputs(n, length, hv)
            label, longest = lengths_label(length), max(length) if isinstance(length, tuple) else length
            t_off = timed_call(x, OFF, 0, cu, cu_cpu)
            writer.writerow([n, hv, label, 0, f"{t_off:.4f}", "1.000"])
            best = (t_off, 0)
            for L in (4, 8, 16, 32, 64, 128, 256):
                if L >= longest // 64:
                    continue
                t = timed_call(x, ON, L, cu, cu_cpu)
                writer.writerow([n, hv, label, L, f"{t:.4f}", f"{t / t_off:.3f}"])
                best = min(best, (t, L))
            t_auto = timed_call(x, AUTO, 0, cu, cu_cpu)
            writer.writerow([n, hv, label, -1, f"{t_auto:.4f}", f"{t_auto / t_off:.3f}"])
            f.flush()
            worst = max(worst, t_auto / best[0])
            print(f"{direction} N={n} Hv={hv:3d} len={label:>11}  off {t_off:8.3f} ms  best {best[0]:8.3f} ms at "
                  f"L={best[1]} ({t_off / best[0]:.2f}x)  auto {t_auto:8.3f} ms (auto/off {t_auto / t_off:.3f}, "
                  f"auto/best {t_auto / best[0]:.3f})")
    print(f"summary {direction} splits: {len(configs)} configs, worst auto/best {worst:.3f}; wrote {path}")
    return path


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="lengths 8k and 32k, heads 2/8/32")
    parser.add_argument("--direction", choices=("fwd", "bwd"), default="fwd")
    parser.add_argument("--splits", action="store_true", help="forward: the split scan of --direction bwd")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = parser.parse_args()
    if args.direction == "bwd" or args.splits:
        split_sweep(args.direction, args.out)
        return
    lengths = [8192, 32768] if args.quick else LENGTHS
    heads = [2, 8, 32] if args.quick else HEADS
    path = pathlib.Path(args.out) / f"{datetime.date.today()}_cp_sweep_{commit()}{'_quick' if args.quick else ''}.csv"
    ratios, gains = [], []
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["sequences", "h_v", "tokens_per_seq", "auto_ms", "off_ms", "auto_over_off", "differs"])
        for length in lengths:
            for n in SEQS:
                for hv in heads:
                    if n * hv > 256 or n * length * hv > MAX_TOKENS_HEADS:
                        continue
                    x, cu, cu_cpu = sweep_inputs(n, length, hv)
                    t_auto, o_auto = timed(x, AUTO, cu, cu_cpu)
                    t_off, o_off = timed(x, OFF, cu, cu_cpu)
                    differs = not torch.equal(o_auto, o_off)  # CP engaged (different roundings)
                    ratio = t_auto / t_off
                    ratios.append(ratio)
                    if differs:
                        gains.append(t_off / t_auto)
                    writer.writerow([n, hv, length, f"{t_auto:.4f}", f"{t_off:.4f}", f"{ratio:.3f}", int(differs)])
                    f.flush()
                    print(f"N={n:2d} Hv={hv:3d} len={length:6d}  auto {t_auto:8.3f} ms  off {t_off:8.3f} ms  "
                          f"ratio {ratio:.3f}{'  (CP)' if differs else ''}")
                    del x, o_auto, o_off
    geo = math.exp(sum(map(math.log, gains)) / len(gains)) if gains else float("nan")
    print(f"summary: {len(ratios)} configs, worst auto/off {max(ratios):.3f}, CP engaged on {len(gains)} "
          f"with geomean speedup {geo:.2f}x; wrote {path}")


if __name__ == "__main__":
    main()
