"""Backward benchmark: DESIGN §5's backward table on the H200, flashgdn beside FLA (Triton) in one process.

The configurations are the published backward rows of FlashQLA (bench/flashqla_published_h200.csv,
direction bwd): (Hqk, Hv) in {(16,32), (8,16), (4,8), (2,4)} x 8192 or 32768 tokens cut into 1/2/4/8
packed sequences at FlashQLA's random cut points. Inputs follow the forward benchmark's recipe
(bench_forward.make_inputs: 25% of v-heads with g == 0, h0 given) plus FlashQLA's backward inputs:
dO = randn (bf16), dht = randn / 8 (fp32).

Two rows per configuration, each timed by CUDA-graph replay (median of many replays):
  bwd     flashgdn.chunk_gated_delta_rule_bwd alone (it recomputes everything from the forward's
          inputs), beside FLA's low-level chunk_gated_delta_rule_bwd fed FLA's own forward
          intermediates (cumsummed g and A) -- the call FlashQLA's published bwd rows time;
  fwdbwd  forward + backward through autograd (chunk_gated_delta_rule, then torch.autograd.grad
          w.r.t. q, k, v, g, beta, h0 with dO and dht), the same for FLA's public function.
Beside each: the memory and tensor-core floors of the call (formulas in backward_floors), FlashQLA's
published numbers (bwd rows only: FlashQLA publishes no fwd+bwd numbers), and the relative L2 error of
dq, dk, dv, dg, dbeta, dh0 of each library against the float64 oracle (tests/gpu/oracle.py
backward_f64) on one q/k head and its group of v-heads of the longest sequence.

FLA's Triton backward and Hopper: fla-core 0.6.0 refuses to run its gated chunk_bwd_dqkwg on Hopper
with Triton >= 3.4.0 and < 3.7.1 (fla.ops.common.chunk_o.chunk_bwd_dqkwg raises RuntimeError, FLA
issue #640: that Triton range miscompiles the kernel; FLA's own way out is its TileLang backend).
This script bypasses the guard in this process only -- it sets the module global
fla.ops.common.chunk_o.TRITON_ABOVE_3_7_1 = True, which the guard reads at call time -- and labels
FLA's numbers "timing only" in the fla_note column when it did so (FLA's dq/dk/dg may then be wrong;
its error columns show by how much). Nothing on disk is changed. FLA_DISABLE_BACKEND_DISPATCH=1 is
set before FLA is imported (as in bench_forward.py), so FLA runs its Triton kernels, not the
FlashQLA or TileLang backends.

    python bench/bench_backward.py [--quick] [--out DIR] [--filter hv=32,mix=8k_1seq,dir=bwd] [--no-oracle]
"""

from __future__ import annotations

import argparse
import csv
import datetime
import math
import pathlib
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import flashgdn  # noqa: E402
from bench_forward import commit, load_fla, make_inputs, measure_ceilings, published, time_graph  # noqa: E402
from bench_forward import floors as forward_floors  # noqa: E402
from oracle import rel_l2  # noqa: E402  (bench_forward put tests/gpu on sys.path)

try:
    from oracle import backward_f64
except ImportError:  # the oracle's backward is not there yet: no error columns
    backward_f64 = None

D = 128   # head dim (K = V)
C = 64    # chunk length

# FlashQLA's backward table (the published bwd rows): model label as published, Hqk, Hv.
HEADS = [("hk16_hv32", 16, 32), ("hk8_hv16", 8, 16), ("hk4_hv8", 4, 8), ("hk2_hv4", 2, 4)]
MIXES = ["8k_1seq", "8k_2seq", "8k_4seq", "8k_8seq", "32k_1seq", "32k_2seq", "32k_4seq", "32k_8seq"]
QUICK_HEADS = [HEADS[0], HEADS[2]]
QUICK_MIXES = ["8k_1seq", "8k_8seq", "32k_1seq", "32k_8seq"]
DIRECTIONS = ["bwd", "fwdbwd"]
GRADS = ["dq", "dk", "dv", "dg", "dbeta", "dh0"]

FIELDS = (["direction", "model", "seqlens", "lengths", "h_qk", "h_v", "tokens", "time_ms", "fla_ms", "fla_note",
           "flashqla_pub_ms", "fla_pub_ms", "mem_floor_ms", "tc_floor_ms", "floor_fraction"]
          + [f"err_{n}" for n in GRADS] + [f"fla_err_{n}" for n in GRADS] + ["commit", "device"])


def split_lengths(mix: str, seed: int = 42) -> list[int]:
    """'32k_4seq': 32768 tokens cut into 4 sequences the way FlashQLA's backward benchmark cuts them:
    the n-1 cut points are the first n-1 entries of a random permutation of 0..T-2 (a fresh CPU
    generator seeded 42), plus one, sorted."""
    total_label, count_label = mix.split("_")
    total = int(total_label.rstrip("k")) * 1024
    n = int(count_label.removesuffix("seq"))
    if n <= 1:
        return [total]
    gen = torch.Generator().manual_seed(seed)
    cuts = sorted((torch.randperm(total - 1, dtype=torch.int32, generator=gen)[: n - 1] + 1).tolist())
    bounds = [0] + cuts + [total]
    return [b - a for a, b in zip(bounds, bounds[1:])]


def backward_floors(lengths, hqk, hv, bandwidth, flops_rate) -> tuple[float, float]:
    """Floors of one backward call (h0 and dht given), in ms.

    Bytes: read q, k [T,Hqk,D] bf16, v, dO [T,Hv,D] bf16, g, beta [T,Hv] fp32, h0, dht [N,Hv,D,D] fp32;
    write dq, dk [T,Hqk,D] bf16, dv [T,Hv,D] bf16, dg, dbeta [T,Hv] fp32, dh0 [N,Hv,D,D] fp32:
        bytes = T * (4*Hqk*D*2 + 3*Hv*D*2 + 4*Hv*4) + 3 * N*Hv*D*D*4.

    FLOPs: the GEMMs of the chunked backward of src/reference/backward_chunked.cpp, per (chunk, v-head),
    chunk C = 64 rows, K = V = D = 128, every product counted once (2 FLOPs per multiply-add):
      recompute   KK = K Kᵀ, P = Q Kᵀ, Vd = Ag W                    3 x C·C·D
                  U = K S, and Kᵀ (ρ ⊙ Vd) of the state pre-pass       2 x C·D·D
      gradients   Pgᵀ dO, dPg = dO Vdᵀ, dW = Agᵀ dVd, dAg = dVd Wᵀ,
                  dP K, dPᵀ Q, (dM + dMᵀ) K                            7 x C·C·D
                  K dS, dQ_a = dO Sᵀ, dK_a = Vd dSᵀ, dU Sᵀ,
                  dS_prev: Kᵀ dU and Qᵀ (Γ dO)                         6 x C·D·D
                  dL = A_rᵀ dA_r A_rᵀ                                   2 x C·C·C
        flops = chunks * Hv * 2 * (10*C*C*D + 8*C*D*D + 2*C**3)       (~28.3 MFLOP per chunk-head)
    with chunks = sum(ceil(n_i / 64)). Like the forward floor it leaves out the chunk inverse A_r
    (a triangular solve) and everything elementwise (gates, dβ/dg reductions, the group sum of dq/dk).
    """
    T, N = sum(lengths), len(lengths)
    bytes_ = T * (4 * hqk * D * 2 + 3 * hv * D * 2 + 4 * hv * 4) + 3 * N * hv * D * D * 4
    chunks = sum((n + C - 1) // C for n in lengths)
    flops = chunks * hv * 2 * (10 * C * C * D + 8 * C * D * D + 2 * C ** 3)
    return bytes_ / bandwidth * 1e3, flops / flops_rate * 1e3


def load_fla_backward():
    """FLA's public function, its low-level forward/backward and chunk-index helper, and the note for
    its backward numbers. Bypasses the #640 Hopper/Triton guard in this process (see the docstring)."""
    fla_chunk = load_fla()  # sets FLA_DISABLE_BACKEND_DISPATCH=1 before importing fla
    if fla_chunk is None:
        return None
    try:
        import triton
        import fla.ops.common.chunk_o as chunk_o
        from fla.ops.gated_delta_rule.chunk import chunk_gated_delta_rule_bwd as fla_bwd
        from fla.ops.gated_delta_rule.chunk import chunk_gated_delta_rule_fwd as fla_fwd
        from fla.ops.utils.index import prepare_chunk_indices
    except Exception as exc:  # noqa: BLE001 - report any reason the anchor cannot run
        print(f"FLA backward not available: {exc!r}")
        return None
    import fla as fla_package
    note = f"fla {getattr(fla_package, '__version__', '?')} triton {triton.__version__}"
    guarded = (getattr(chunk_o, "IS_NVIDIA_HOPPER", False) and getattr(chunk_o, "TRITON_ABOVE_3_4_0", False)
               and not getattr(chunk_o, "TRITON_ABOVE_3_7_1", True))
    if guarded:
        chunk_o.TRITON_ABOVE_3_7_1 = True  # the guard in chunk_bwd_dqkwg reads this global at call time
        note = f"timing only: #640 Hopper guard bypassed ({note} < 3.7.1)"
    print(f"FLA: {note}")
    return dict(chunk=fla_chunk, fwd=fla_fwd, bwd=fla_bwd, chunk_indices=prepare_chunk_indices, note=note)


def grad_errors(grads, ref, seq, bos, eos, group) -> dict:
    """Relative L2 of (dq, dk, dv, dg, dbeta, dh0) on q/k head 0 and its v-heads [0, group) of sequence
    seq (tokens [bos, eos)) against the oracle's float64 gradients of that slice."""
    if ref is None or grads is None:
        return {}
    dq, dk, dv, dg, dbeta, dh0 = grads
    mine = (dq[:, bos:eos, :1], dk[:, bos:eos, :1], dv[:, bos:eos, :group], dg[:, bos:eos, :group],
            dbeta[:, bos:eos, :group], None if dh0 is None or dh0.numel() == 0 else dh0[seq:seq + 1, :group])
    return {n: rel_l2(m.to(r.device), r) for n, m, r in zip(GRADS, mine, ref) if m is not None and r is not None}


def fmt(x, spec=".4f"):
    return "" if x is None else format(x, spec)


def geomean(values):
    values = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def selected(args_filter: str, hqk: int, hv: int, mix: str, model: str) -> tuple[bool, set]:
    """--filter key=value[,key=value...] (all must hold; value may list alternatives a|b), keys hv, hqk,
    mix, model, dir. Returns (config selected,
    directions selected)."""
    directions = set(DIRECTIONS)
    for item in filter(None, args_filter.split(",")):
        key, value = item.split("=")
        values = set(value.split("|"))  # hv=16|8: any of them
        if key == "dir":
            directions &= values
        elif {"hv": str(hv), "hqk": str(hqk), "mix": mix, "model": model}.get(key) not in values:
            return False, directions
    return bool(directions), directions


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a subset of the heads and sequence mixes")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    parser.add_argument("--filter", default="", help="e.g. hv=32 or mix=32k_1seq,dir=bwd")
    parser.add_argument("--no-oracle", action="store_true", help="skip the float64 error columns")
    args = parser.parse_args()

    start = time.perf_counter()
    torch.manual_seed(0)
    bandwidth, flops_rate = measure_ceilings()
    print(f"measured ceilings: copy {bandwidth / 1e12:.2f} TB/s, bf16 GEMM {flops_rate / 1e12:.0f} TFLOP/s")
    fla = load_fla_backward()
    oracle = None if args.no_oracle else backward_f64
    if oracle is None and not args.no_oracle:
        print("tests/gpu/oracle.py has no backward_f64: no error columns")
    pub = published()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.date.today().isoformat()
    sha, device = commit(), torch.cuda.get_device_name()
    path = out / f"{stamp}_backward_{sha}{'_quick' if args.quick else ''}.csv".replace("+", "_")
    csv_file = open(path, "w", newline="")  # written row by row: an interrupted run keeps its rows
    writer = csv.DictWriter(csv_file, fieldnames=FIELDS)
    writer.writeheader()
    rows = []
    scale = D ** -0.5
    names = ("q", "k", "v", "g", "beta", "initial_state")
    for model, hqk, hv in (QUICK_HEADS if args.quick else HEADS):
        for mix in (QUICK_MIXES if args.quick else MIXES):
            ok, directions = selected(args.filter, hqk, hv, mix, model)
            if not ok:
                continue
            lengths = split_lengths(mix)
            T, N, group = sum(lengths), len(lengths), hv // hqk
            x, cu = make_inputs(lengths, hqk, hv)
            do = torch.randn(1, T, hv, D, device="cuda").bfloat16()
            dht = torch.randn(N, hv, D, D, device="cuda") / 8
            # host copy of the offsets: lets flashgdn plan (and check) without a device sync; FLA gets the
            # same from its chunk-index table, prepared once below outside the timed graph.
            cu_cpu = torch.tensor([0] + lengths, dtype=torch.int64).cumsum(0)

            # float64 oracle on q/k head 0 and its v-heads [0, group) of the longest sequence
            seq = max(range(N), key=lambda i: lengths[i])
            bos, ref = sum(lengths[:seq]), None
            eos = bos + lengths[seq]
            if oracle is not None:
                try:
                    tok = slice(bos, eos)
                    ref = oracle(q=x["q"][:, tok, :1], k=x["k"][:, tok, :1], v=x["v"][:, tok, :group],
                                 g=x["g"][:, tok, :group], beta=x["beta"][:, tok, :group], scale=scale,
                                 do=do[:, tok, :group], dht=dht[seq:seq + 1, :group],
                                 initial_state=x["initial_state"][seq:seq + 1, :group])
                except Exception as exc:  # noqa: BLE001
                    print(f"oracle failed on {mix} ({hqk},{hv}): {exc!r}")

            # flashgdn: (a) backward only, (b) forward + backward through autograd
            ours, leaves = {}, {n: x[n].detach().clone().requires_grad_() for n in names}

            def bwd():
                return flashgdn.chunk_gated_delta_rule_bwd(x["q"], x["k"], x["v"], x["g"], x["beta"], do, dht,
                                                           x["initial_state"], cu, scale, False, False, cu_cpu)

            def fwdbwd():
                o, ht = flashgdn.chunk_gated_delta_rule(**leaves, scale=scale, output_final_state=True,
                                                        cu_seqlens=cu, cu_seqlens_cpu=cu_cpu)
                return torch.autograd.grad((o, ht), [leaves[n] for n in names], (do, dht))

            for direction, fn in (("bwd", bwd), ("fwdbwd", fwdbwd)):
                if direction not in directions:
                    continue
                try:
                    t = time_graph(fn)
                    ours[direction] = (t, grad_errors(fn(), ref, seq, bos, eos, group))
                except Exception as exc:  # noqa: BLE001 - the backward is young: record the row anyway
                    print(f"flashgdn {direction} failed on {mix} ({hqk},{hv}): {exc!r}")
                    ours[direction] = (None, {})

            # FLA: (a) low-level backward on its own forward's intermediates, (b) autograd fwd + bwd
            theirs = {}
            if fla is not None:
                cu64 = cu.long()
                try:
                    ci = fla["chunk_indices"](cu64, C)
                    fwd_out = fla["fwd"](q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], scale=scale,
                                         initial_state=x["initial_state"], output_final_state=True,
                                         cu_seqlens=cu64, chunk_indices=ci)
                    g_cum, A = fwd_out[0], fwd_out[2]  # fla-core 0.6.0: (g_cumsum, o, A, final, h0, g_input)
                    del fwd_out
                except Exception as exc:  # noqa: BLE001
                    print(f"FLA forward failed on {mix} ({hqk},{hv}): {exc!r}")
                    ci = None
                fla_leaves = {n: x[n].detach().clone().requires_grad_() for n in names}

                def fla_bwd():
                    dq, dk, dv, db, dg, dh0 = fla["bwd"](q=x["q"], k=x["k"], v=x["v"], g=g_cum, beta=x["beta"], A=A,
                                                         scale=scale, initial_state=x["initial_state"], do=do,
                                                         dht=dht, cu_seqlens=cu64, chunk_indices=ci)[:6]
                    return dq, dk, dv, dg, db, dh0

                def fla_fwdbwd():
                    o, ht = fla["chunk"](**fla_leaves, scale=scale, output_final_state=True, cu_seqlens=cu64,
                                         chunk_indices=ci)
                    return torch.autograd.grad((o, ht), [fla_leaves[n] for n in names], (do, dht))

                for direction, fn in (("bwd", fla_bwd), ("fwdbwd", fla_fwdbwd)):
                    if direction not in directions or ci is None:
                        continue
                    try:
                        t = time_graph(fn)
                        theirs[direction] = (t, grad_errors(fn(), ref, seq, bos, eos, group))
                    except Exception as exc:  # noqa: BLE001
                        print(f"FLA {direction} failed on {mix} ({hqk},{hv}): {exc!r}")

            fwd_mem, fwd_tc = forward_floors(lengths, hqk, hv, bandwidth, flops_rate)
            bwd_mem, bwd_tc = backward_floors(lengths, hqk, hv, bandwidth, flops_rate)
            p = pub.get(("bwd", mix, hqk, hv), {})
            for direction in DIRECTIONS:
                if direction not in directions:
                    continue
                t, errs = ours.get(direction, (None, {}))
                t_fla, fla_errs = theirs.get(direction, (None, {}))
                mem_ms = bwd_mem + (fwd_mem if direction == "fwdbwd" else 0.0)
                tc_ms = bwd_tc + (fwd_tc if direction == "fwdbwd" else 0.0)
                row = dict(direction=direction, model=model, seqlens=mix, lengths="+".join(map(str, lengths)),
                           h_qk=hqk, h_v=hv, tokens=T, time_ms=fmt(t), fla_ms=fmt(t_fla),
                           fla_note=fla["note"] if fla is not None and t_fla is not None else "",
                           flashqla_pub_ms=p.get("flashqla_ms", "") if direction == "bwd" else "",
                           fla_pub_ms=p.get("fla_ms", "") if direction == "bwd" else "",
                           mem_floor_ms=fmt(mem_ms), tc_floor_ms=fmt(tc_ms),
                           floor_fraction=fmt(max(mem_ms, tc_ms) / t, ".3f") if t else "",
                           commit=sha, device=device)
                row.update({f"err_{n}": fmt(errs.get(n), ".2e") for n in GRADS})
                row.update({f"fla_err_{n}": fmt(fla_errs.get(n), ".2e") for n in GRADS})
                writer.writerow(row)
                csv_file.flush()
                rows.append(dict(direction=direction, t=t, t_fla=t_fla,
                                 pub=float(row["flashqla_pub_ms"]) if row["flashqla_pub_ms"] else None,
                                 fla_pub=float(row["fla_pub_ms"]) if row["fla_pub_ms"] else None,
                                 errs=errs, fla_errs=fla_errs))
                err_text = "/".join(fmt(errs.get(n), ".1e") or "-" for n in GRADS)
                fla_err_text = "/".join(fmt(fla_errs.get(n), ".1e") or "-" for n in GRADS)
                print(f"{direction:6s} {model:10s} {hqk:2d}/{hv:2d} {mix:9s} ours {fmt(t, '7.3f') or '      -'} ms  "
                      f"fla {fmt(t_fla, '7.3f') or '      -'} ms  flashqla(pub) {row['flashqla_pub_ms'] or '-':>5}  "
                      f"floor {max(mem_ms, tc_ms):.3f} ms  err dq/dk/dv/dg/db/dh0 {err_text}  fla {fla_err_text}  "
                      f"[{time.perf_counter() - start:.0f} s]", flush=True)
            del x, cu, do, dht, leaves, ref
            torch.cuda.empty_cache()
    csv_file.close()
    print(f"wrote {path}")
    summary(rows)


def summary(rows):
    """Geometric-mean speedups (other's time / ours) and the worst errors, per direction."""
    for direction in DIRECTIONS:
        mine = [r for r in rows if r["direction"] == direction and r["t"] is not None]
        if not mine:
            if any(r["direction"] == direction for r in rows):
                print(f"summary {direction}: no flashgdn times")
            continue
        parts = [f"{direction}: {len(mine)} rows"]
        for label, key in (("FLA (measured)", "t_fla"), ("FlashQLA (published)", "pub"), ("FLA (published)", "fla_pub")):
            g = geomean([r[key] / r["t"] for r in mine if r[key] is not None])
            if g is not None:
                parts.append(f"vs {label} {g:.2f}x")
        worst = {n: max((r["errs"][n] for r in mine if r["errs"].get(n) is not None), default=None) for n in GRADS}
        if any(v is not None for v in worst.values()):
            parts.append("max err " + " ".join(f"{n} {v:.1e}" for n, v in worst.items() if v is not None))
        fla_worst = {n: max((r["fla_errs"][n] for r in mine if r["fla_errs"].get(n) is not None), default=None)
                     for n in GRADS}
        if any(v is not None for v in fla_worst.values()):
            parts.append("FLA max err " + " ".join(f"{n} {v:.1e}" for n, v in fla_worst.items() if v is not None))
        print("summary " + ", ".join(parts) + "  (speedup = other's time / flashgdn's; >1: flashgdn faster)")


if __name__ == "__main__":
    main()
