"""Where a backward call's dg error enters: replays one GPU test case (the tests' seed and inputs)
and prints dg's relative L2 error against the float64 oracle with context parallelism on and off,
per v-head, and the tokens whose local error is largest.

dg_t is a reverse cumulative sum over tokens s >= t of local terms, so an error made at token s
shifts every dg_t, t <= s, by the same amount: the local error at s is err_s - err_{s+1}
(err = flashgdn's dg - the oracle's). A large error at a sequence's last tokens therefore
dominates the relative L2 of the whole dg.

    python3 bench/dg_error_locate.py --seed 1521375373 --T 4133 --heads 2 4 --regime model --dht \
        [--h0] [--segment-chunks 4]
    python3 bench/dg_error_locate.py --seed 0 --sweep 200 --dht [--batch B]   (CP off: dg's rel L2
        over seeds 0..199, whole and over the last chunk's tokens: the distributions, the worst
        seeds and the share of the last token's error in each)
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "gpu"))
from conftest import make_inputs  # noqa: E402
from oracle import backward_f64, rel_l2  # noqa: E402
from test_backward import upstream  # noqa: E402
from test_cp import OFF, ON, run_backward  # noqa: E402


def report(name, dg, ref, top):
    err = (dg.double() - ref)[0]  # [T, Hv]
    local = err.clone()
    local[:-1] -= err[1:]
    heads = " ".join(f"{rel_l2(dg[0, :, h], ref[0, :, h]):.2e}" for h in range(dg.shape[2]))
    print(f"{name}: dg rel L2 {rel_l2(dg, ref):.3e}; per v-head {heads}")
    flat = local.abs().flatten()
    values, where = flat.topk(top)
    T = err.shape[0]
    total = local.pow(2).sum().sqrt().item()
    print(f"  |local error| total {total:.3e}; |ref dg| {ref.norm().item():.3e}; top tokens (t, head, local error,"
          f" ref dg_t):")
    for v, i in zip(values.tolist(), where.tolist()):
        t, h = divmod(i, dg.shape[2])
        print(f"    t {t:5d} (chunk {t // 64}, {t % 64:2d}; from end {T - 1 - t:4d}) h {h}: {local[t, h].item():+.3e}"
              f"  ref {ref[0, t, h].item():+.3e}")
    last = local[-(T % 64 or 64):]
    print(f"  last chunk's share of the local error: {last.pow(2).sum().sqrt().item() / total:.2f}")


def sweep(args):
    rows = []
    for seed in range(args.seed, args.seed + args.sweep):
        torch.manual_seed(seed)
        x = make_inputs(args.batch, args.T, *args.heads, regime=args.regime, initial_state=args.h0)
        do, dht = upstream(x, args.dht)
        ref = backward_f64(*(x[n] for n in ("q", "k", "v", "g", "beta")), x["q"].shape[-1] ** -0.5, do, dht,
                           x["initial_state"])[3]
        dg = run_backward(x, do, dht, OFF)["dg"].double()
        err = dg - ref
        last = err[:, -1].norm().item() / max(err.norm().item(), 1e-300)
        first = (args.T - 1) // 64 * 64  # the last chunk's first token
        tail = err[:, first:].abs().amax(dim=1)  # [B, Hv]: the worst last-chunk error per sequence, head
        n, h = divmod(int(tail.argmax()), tail.shape[1])
        worst = (n, h, err[n, -1, h].item(), ref[n, -1, h].item(), ref[:, first:].pow(2).mean().sqrt().item())
        rows.append((rel_l2(dg, ref), seed, last, rel_l2(dg[:, first:], ref[:, first:]), worst))
    errors = torch.tensor([r[0] for r in rows])
    q = torch.quantile(errors, torch.tensor([0.5, 0.9, 0.99], dtype=errors.dtype)).tolist()
    print(f"dg rel L2 over {len(rows)} seeds ({args.batch} x T {args.T}, heads {tuple(args.heads)}, {args.regime}, dht {args.dht}, "
          f"h0 {args.h0}, CP off): median {q[0]:.2e} p90 {q[1]:.2e} p99 {q[2]:.2e} max {errors.max().item():.2e}; "
          f"over 1e-2: {(errors > 1e-2).sum().item()}, over 2e-2: {(errors > 2e-2).sum().item()}")
    chunk = torch.tensor([r[3] for r in rows])
    q = torch.quantile(chunk, torch.tensor([0.5, 0.9, 0.99], dtype=chunk.dtype)).tolist()
    print(f"  the last chunk's tokens alone: median {q[0]:.2e} p90 {q[1]:.2e} p99 {q[2]:.2e} max {chunk.max().item():.2e}")
    for e, seed, last, c, _ in sorted(rows, reverse=True)[:5]:
        print(f"  seed {seed}: {e:.3e} (last token's share of the error {last:.2f}; last chunk {c:.3e})")
    print("  worst seeds by the last chunk: (sequence, head) with the largest error there; its last token's"
          " error and reference dg; the rms reference dg over every last chunk")
    for e, seed, last, c, (n, h, err_t, ref_t, rms) in sorted(rows, key=lambda r: r[3], reverse=True)[:5]:
        print(f"  seed {seed}: last chunk {c:.3e} (whole {e:.3e}): sequence {n} head {h}: error {err_t:+.3e}"
              f" ref {ref_t:+.3e}; rms ref {rms:.3e}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--T", type=int, default=4133)
    ap.add_argument("--heads", type=int, nargs=2, default=(2, 4))
    ap.add_argument("--regime", default="model")
    ap.add_argument("--dht", action="store_true")
    ap.add_argument("--h0", action="store_true")
    ap.add_argument("--segment-chunks", type=int, default=4)
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--sweep", type=int, default=0)
    ap.add_argument("--batch", type=int, default=1, help="sequences per seed (--sweep)")
    args = ap.parse_args()
    if args.sweep:
        return sweep(args)
    torch.manual_seed(args.seed)
    x = make_inputs(1, args.T, *args.heads, regime=args.regime, initial_state=args.h0)
    do, dht = upstream(x, args.dht)
    ref = backward_f64(*(x[n] for n in ("q", "k", "v", "g", "beta")), x["q"].shape[-1] ** -0.5, do, dht,
                       x["initial_state"])
    ref_dg = ref[3]
    on = run_backward(x, do, dht, ON, segment_chunks=args.segment_chunks)
    off = run_backward(x, do, dht, OFF)
    print(f"seed {args.seed}: T {args.T} heads {tuple(args.heads)} regime {args.regime} dht {args.dht} h0 {args.h0}")
    print("gates per head (mean g):", " ".join(f"{m:.3f}" for m in x["g"][0].mean(0).tolist()))
    for n, r in zip(("dq", "dk", "dv", "dbeta"), (ref[0], ref[1], ref[2], ref[4])):
        print(f"{n}: CP on {rel_l2(on[n], r):.2e}, off {rel_l2(off[n], r):.2e}")
    report("CP on", on["dg"], ref_dg, args.top)
    report("CP off", off["dg"], ref_dg, args.top)


if __name__ == "__main__":
    main()
