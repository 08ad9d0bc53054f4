"""Runs the selected configurations on the GPU: flashgdn and every loaded anchor on the same fresh
inputs, timed, cross-checked, written row by row (torch, CUDA).

Cross-check on a sampled head: the longest sequence of the configuration, and
  fwd rows    v-head 0 (its q/k head is 0): o and the final state;
  bwd rows    q/k head 0 and its group of Hv/Hqk v-heads: dq, dk (q/k head 0), dv, dg, dbeta, dh0;
each library's output on that slice against the float64 oracle (oracle.py) and against flashgdn's
output (relative L2 ‖x − ref‖ / ‖ref‖). An anchor's error column is the worst of its outputs.
"""

from __future__ import annotations

import dataclasses
import datetime
import pathlib
import sys

import torch

import flashgdn

from .. import ops
from . import anchors as anchors_mod
from .configs import Config, row_directions, parse_filter
from .floors import floors_ms
from .inputs import make_inputs
from .oracle import backward_f64, forward_f64, rel_l2
from .plots import write_plots
from .report import Progress, closing_summary, table_header, table_row
from .results import GRADS, PUBLISHED_CSV, CsvWriter, complete_row, csv_name, read_published
from .timing import git_commit, measure_ceilings, time_call, versions


@dataclasses.dataclass
class Context:
    anchors: list
    published: dict
    bandwidth: float
    flops_rate: float
    replays: int
    warmup: int
    gates: str
    oracle: bool
    gpu: str
    commit: str
    versions: str


def _base_row(cfg: Config, direction: str, ctx: Context) -> dict:
    lengths = cfg.lengths
    mem, mma = floors_ms(direction, lengths, cfg.h_qk, cfg.h_v, ctx.bandwidth, ctx.flops_rate)
    # FlashQLA publishes fwd and bwd rows (its bwd rows: backward call only); none for fwd+bwd
    pub = ctx.published.get((direction, cfg.seqlens, cfg.h_qk, cfg.h_v), {})
    row = dict(direction=direction, model=cfg.model, seqlens=cfg.seqlens, lengths="+".join(map(str, lengths)),
               h_qk=cfg.h_qk, h_v=cfg.h_v, tokens=sum(lengths), gates=ctx.gates, mem_floor_ms=mem, mma_floor_ms=mma,
               copy_tbps=ctx.bandwidth / 1e12, gemm_tflops=ctx.flops_rate / 1e12, gpu=ctx.gpu, commit=ctx.commit,
               versions=ctx.versions)
    for a in ("fla", "flashqla", "flashinfer"):
        row[f"{a}_pub_ms"] = pub.get(f"{a}_ms") or None
    return row


def _timed(fn, ctx: Context, name: str, notes: list, timing: list):
    """(ms, outputs) of one library's call, or (None, None) with a note when it fails."""
    try:
        ms, how = time_call(fn, ctx.replays, ctx.warmup)
        timing.append(f"{name}={how}")
        return ms, fn()
    except Exception as exc:  # noqa: BLE001 - record the row anyway
        notes.append(f"{name}: failed: {anchors_mod.short_reason(exc)}")
        return None, None


def _worst(values) -> float | None:
    values = [v for v in values if v is not None]
    return max(values) if values else None


def run_forward(cfg: Config, ctx: Context) -> list[dict]:
    inp = make_inputs(cfg.lengths, cfg.h_qk, cfg.h_v, ctx.gates)
    x, scale, lengths = inp["x"], inp["scale"], inp["lengths"]
    seq = max(range(len(lengths)), key=lengths.__getitem__)
    bos = sum(lengths[:seq])
    eos = bos + lengths[seq]

    def sample(out):  # o and final state of v-head 0 of the sampled sequence
        o, ht = out
        return o[:, bos:eos, :1].double(), ht[seq:seq + 1, :1].double()

    ref = None
    if ctx.oracle:
        tok = slice(bos, eos)
        ref = forward_f64(**{n: x[n][:, tok, :1] for n in ("q", "k", "v", "g", "beta")}, scale=scale,
                          initial_state=x["initial_state"][seq:seq + 1, :1])
    row, notes, timing = _base_row(cfg, "fwd", ctx), [], []
    # the host copy of cu_seqlens, as the backward rows get it: the planner needs the lengths (auto-CP)
    ours_fn = lambda: flashgdn.chunk_gated_delta_rule(**x, scale=scale, cu_seqlens=inp["cu"], output_final_state=True,
                                                      cu_seqlens_cpu=inp["cu_cpu"])
    row["flashgdn_ms"], out = _timed(ours_fn, ctx, "flashgdn", notes, timing)
    ours = sample(out) if out is not None else None
    del out
    if ours is not None and ref is not None:
        row["rel_err_o"], row["rel_err_ht"] = rel_l2(ours[0], ref[0]), rel_l2(ours[1], ref[1])
    for anchor in ctx.anchors:
        try:
            fn = anchor.forward(inp)
        except Exception as exc:  # noqa: BLE001
            notes.append(f"{anchor.name}: failed: {anchors_mod.short_reason(exc)}")
            continue
        row[f"{anchor.name}_ms"], out = _timed(fn, ctx, anchor.name, notes, timing)
        if out is None:
            continue
        theirs = sample(out)
        del out, fn
        if ref is not None:
            row[f"{anchor.name}_err"] = _worst(rel_l2(t, r) for t, r in zip(theirs, ref))
        if ours is not None:
            row[f"{anchor.name}_vs_flashgdn"] = _worst(rel_l2(t, o) for t, o in zip(theirs, ours))
    row["notes"], row["timing"] = "; ".join(notes), ";".join(timing)
    return [complete_row(row)]


def forward_caches(x, cu, cu_cpu, scale):
    """What one forward with the default options keeps for its backward, filled by that forward:
    {"cp_cache": flashgdn.ops.new_cp_cache's (None without CP), "inverse_cache": new_inverse_cache's
    (None where it runs no chunk inverse the backward can take)}: chunk_gated_delta_rule_bwd's keywords
    through backward_kwargs."""
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], x["initial_state"], cu, scale)
    caches = {"cp_cache": ops.new_cp_cache(*args, cu_seqlens_cpu=cu_cpu),
              "inverse_cache": ops.new_inverse_cache(*args, cu_seqlens_cpu=cu_cpu)}
    if any(cache is not None for cache in caches.values()):
        ops.forward_into(torch.empty_like(x["v"]), None, *args, cu_seqlens_cpu=cu_cpu, **caches)
    return caches


def backward_kwargs(caches) -> dict:
    """chunk_gated_delta_rule_bwd's keyword arguments for forward_caches' caches."""
    return dict(ops.CpCache.backward_kwargs(caches["cp_cache"]), inverse_cache=caches["inverse_cache"])


def run_backward(cfg: Config, ctx: Context, directions: tuple[str, ...]) -> list[dict]:
    inp = make_inputs(cfg.lengths, cfg.h_qk, cfg.h_v, ctx.gates, backward=True)
    x, scale, lengths, cu, cu_cpu = inp["x"], inp["scale"], inp["lengths"], inp["cu"], inp["cu_cpu"]
    do, dht = inp["do"], inp["dht"]
    group = cfg.h_v // cfg.h_qk
    seq = max(range(len(lengths)), key=lengths.__getitem__)
    bos = sum(lengths[:seq])
    tok = slice(bos, bos + lengths[seq])

    def sample(grads):  # q/k head 0 and its v-heads [0, group) of the sampled sequence
        dq, dk, dv, dg, db, dh0 = grads
        parts = (dq[:, tok, :1], dk[:, tok, :1], dv[:, tok, :group], dg[:, tok, :group], db[:, tok, :group],
                 None if dh0 is None or dh0.numel() == 0 else dh0[seq:seq + 1, :group])
        return tuple(None if p is None else p.double() for p in parts)  # copies: the full grads can go

    ref = None
    if ctx.oracle:
        ref = backward_f64(q=x["q"][:, tok, :1], k=x["k"][:, tok, :1], v=x["v"][:, tok, :group],
                           g=x["g"][:, tok, :group], beta=x["beta"][:, tok, :group], scale=scale,
                           do=do[:, tok, :group], dht=dht[seq:seq + 1, :group],
                           initial_state=x["initial_state"][seq:seq + 1, :group])

    def errors(mine, other):
        return {n: rel_l2(m, r) for n, m, r in zip(GRADS, mine, other) if m is not None and r is not None}

    leaves = anchors_mod._leaves(x)
    # flashgdn's low-level backward after a forward: given what that forward keeps (its CP cache where it
    # ran CP, its chunk inverse unless decode-sized: v4's chunk inverse or v5's own), as FlashQLA's published backward
    # reuses its forward's A and CP cache; else from the inputs alone
    caches = forward_caches(x, cu, cu_cpu, scale)
    ours_fns = {
        "bwd": lambda: flashgdn.chunk_gated_delta_rule_bwd(
            x["q"], x["k"], x["v"], x["g"], x["beta"], do, dht, x["initial_state"], cu, scale, False, False, cu_cpu,
            **backward_kwargs(caches)),
        "fwdbwd": lambda: torch.autograd.grad(
            flashgdn.chunk_gated_delta_rule(**leaves, scale=scale, output_final_state=True, cu_seqlens=cu,
                                            cu_seqlens_cpu=cu_cpu),
            [leaves[n] for n in anchors_mod.NAMES], (do, dht)),
    }
    rows = []
    for direction in directions:
        row, notes, timing = _base_row(cfg, direction, ctx), [], []
        row["flashgdn_ms"], out = _timed(ours_fns[direction], ctx, "flashgdn", notes, timing)
        ours = sample(out) if out is not None else None
        del out
        if ours is not None and ref is not None:
            for n, e in errors(ours, ref).items():
                row[f"err_{n}"] = e
        for anchor in ctx.anchors:
            if not anchor.has_backward:
                notes.append(f"{anchor.name}: forward only (no backward)")
                continue
            try:
                fn = anchor.backward(inp) if direction == "bwd" else anchor.forward_backward(inp)
            except Exception as exc:  # noqa: BLE001
                notes.append(f"{anchor.name}: failed: {anchors_mod.short_reason(exc)}")
                continue
            row[f"{anchor.name}_ms"], out = _timed(fn, ctx, anchor.name, notes, timing)
            if out is None:
                continue
            if anchor.note:
                notes.append(f"{anchor.name}: {anchor.note}")
            theirs = sample(out)
            del out, fn
            if ref is not None:
                row[f"{anchor.name}_err"] = _worst(errors(theirs, ref).values())
            if ours is not None:
                row[f"{anchor.name}_vs_flashgdn"] = _worst(errors(theirs, ours).values())
        row["notes"], row["timing"] = "; ".join(notes), ";".join(timing)
        rows.append(complete_row(row))
    return rows


def _announce_anchors(anchors: list) -> None:
    for a in anchors:
        if a.available:
            print(f"anchor {a.label}: {a.version}, run live" + (f"; {a.note}" if a.note else ""))
        else:
            print(f"anchor {a.label}: not run ({a.reason}); FlashQLA's published H200 numbers stand in where "
                  f"they exist, marked p")


def run(args, configs: list[Config]) -> int:
    if not torch.cuda.is_available():
        print("flashgdn.bench: no CUDA device (the benchmark needs an SM90 GPU)", file=sys.stderr)
        return 2
    if not flashgdn.has_kernels:
        print("flashgdn.bench: this flashgdn build has no CUDA kernels", file=sys.stderr)
        return 2
    torch.manual_seed(args.seed)
    bandwidth, flops_rate = measure_ceilings()
    print(f"{torch.cuda.get_device_name()}: measured copy {bandwidth / 1e12:.2f} TB/s (read + write), "
          f"bf16 GEMM {flops_rate / 1e12:.0f} TFLOP/s")
    names = [a for a in args.anchors.split(",") if a and a != "none"]
    loaded = anchors_mod.load(names)
    _announce_anchors(loaded)
    live = [a for a in loaded if a.available]
    ctx = Context(anchors=live, published=read_published(PUBLISHED_CSV), bandwidth=bandwidth, flops_rate=flops_rate,
                  replays=args.replays, warmup=args.warmup, gates=args.gates, oracle=not args.no_oracle,
                  gpu=torch.cuda.get_device_name(), commit=git_commit(),
                  versions=versions({a.name: a.version for a in live}))
    out_dir = pathlib.Path(args.out)
    path = out_dir / csv_name(datetime.date.today().isoformat(), args.direction, ctx.commit, args.quick, args.tag)
    flt = parse_filter(args.filter)
    rows, progress = [], Progress(len(configs))
    print(table_header(), flush=True)
    progress.show("starting")
    with CsvWriter(path) as writer:
        for cfg in configs:
            try:
                new = (run_forward(cfg, ctx) if cfg.table == "fwd"
                       else run_backward(cfg, ctx, row_directions("bwd", flt)))
            except Exception as exc:  # noqa: BLE001 - inputs or oracle failed (e.g. out of memory): next config
                progress.clear()
                print(f"{cfg.label}: skipped: {anchors_mod.short_reason(exc)}", flush=True)
                new = []
            for row in new:
                writer.write(row)
                progress.clear()
                print(table_row(row), flush=True)
            rows += new
            torch.cuda.empty_cache()
            progress.step(cfg.label)
    progress.clear()
    print(closing_summary(rows))
    print(f"wrote {path} ({len(rows)} rows)")
    if not args.no_plots:
        pngs, reason = write_plots(rows, path.with_suffix(""))
        print("\n".join(f"wrote {p}" for p in pngs) if pngs else f"no plots: {reason}")
    return 0
