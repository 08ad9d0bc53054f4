"""Where the chunk step of the warp-specialized forwards goes, from the timeline of a measurement
build (cmake -DFLASHGDN_TIMELINE=ON; src/kernels/sm90/timeline.cuh): one forward per configuration
and kernel (3, 4 and 5, no CP; the second of two calls), then per phase the median cycles over
chunks 8..126 of CTA (0, 0, 0) that mark both its events (a phase no chunk marks is left out), for
the aux group and state group 0, and the chunk step (top of
chunk c to top of c + 1). The aux's "issue loads, wait tiles" is the cp.async tiles; its gate and
A_r loads are waited at first use ("gates, barrier", "Ag"). In a timeline build v3 spills a little
(h200_check reports it).

    FLASHGDN_LIBRARY=build-timeline/libflashgdn_c.so python bench/timeline.py [--kernels ws,rs,inv] [--out DIR]

With --backward, the backward's gradient pass instead (backward_grads.cuh, no CP): per stage the median
cycles over the items 2..126 of CTA 0, for each warpgroup, and the item step (top to next top).

With --correction, the forward's CP correction (cp_kernels.cu) on CORRECTION_CONFIGS, CP forced on with
4-chunk segments and every head's gate 0 (no decay window: every step applies M): per step phase the
median cycles over CTA (0, 0, 0)'s steps 4..last-1, the step (top to next top), and the kernel's start to
its M steps and to its first step.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import pathlib
import statistics
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
if importlib.util.find_spec("flashgdn") is None:
    sys.path.insert(0, str(ROOT / "python"))
from flashgdn.bench.inputs import make_inputs  # noqa: E402
from flashgdn.bench.timing import git_commit  # noqa: E402
from flashgdn.ops import TIMELINE_SHAPE, backward_into, forward_into, set_timeline  # noqa: E402

CONFIGS = [([32768], 2, 8), ([8192] * 4, 16, 32), ([1024] * 8, 16, 16)]
# Phases: (name, from event, to event) of each role (timeline.cuh). v4's TMA-fed aux group: "wait slot
# free" is its first poll (it issues chunk c+1's loads there when the slot is free, never waits), "issue
# loads, wait tiles" its wait for chunk c's loads, "-B~, -W~" includes a poll.
AUX = [("wait slot free", 0, 1), ("issue loads, wait tiles, zero rows", 1, 2), ("Q K^T, P", 3, 4), ("Ag", 4, 5), ("-B~, -W~", 5, 6), ("store -W~, ready", 6, 7)]
# (v3 copies chunk c-1's o out inside "Vd (+QS)", v4 inside "update (+P Vd)".)
STATE = [("wait ready", 0, 1), ("Vd (+QS)", 1, 2), ("Vd epilogue, issue update", 2, 3), ("update (+P Vd)", 3, 4),
         ("epilogue, o, barrier", 4, 5)]
# v5 (fused_forward_inv.cuh): the aux group forms A_r itself; its state groups take U^T and W^T before Vd^T.
AUX_INV = [("wait slot free", 0, 1), ("wait keys, zero rows", 1, 2), ("K K^T", 2, 3), ("L", 3, 4),
           ("inverse: diagonal", 4, 8), ("inverse: 16->32", 8, 9), ("inverse: 32->64", 9, 5), ("ready", 5, 7)]
STATE_INV = [("wait ready", 0, 1), ("U, QS", 1, 7), ("W", 7, 8), ("Ag half", 8, 9), ("Ag barrier", 9, 6), ("Vd, P", 6, 2),
             ("Vd epilogue, barrier, issue update", 2, 3), ("update (+P Vd)", 3, 4), ("epilogue, o, barrier", 4, 5)]
KERNELS = {"ws": (3, AUX, STATE), "rs": (4, AUX, STATE), "inv": (5, AUX_INV, STATE_INV)}
FIRST = 8  # skip the pipeline's start
FILL_PHASES = 2  # the chunks whose own phases are printed too
# The gradient pass (timeline.cuh's backward events); group_sums' wait (8) only on a group's later v-heads.
BACKWARD_CONFIGS = [([1024] * 8, 16, 32), ([8192] * 4, 8, 16), ([8192] * 4, 16, 16)]
GRADS = [("wait loads", 0, 1), ("A: U, W, P", 1, 2), ("B: Vd, dVd, a", 2, 3), ("C: dW, dPg, dAg", 3, 4),
         ("C: epilogue, dQ_a, dK_a", 4, 5), ("D: X, Y, KK", 5, 6), ("E: wgmmas", 6, 7), ("E: sums, stores", 7, 9),
         ("dg, dbeta", 9, 10), ("E: to the issuer's lookup of the item after next", 6, 11)]


# The CP correction (timeline.cuh's correction events, rows from CORRECTION_ROW).
CORRECTION_CONFIGS = [([8192], 2, 8), ([32768], 2, 8)]
CORRECTION_ROW = 16
CORRECTION = [("barrier", 0, 2), ("k-half 0 issued", 2, 4), ("k-half 1 split + barrier", 4, 7),
              ("k-half 1 issued + next inputs waited", 7, 1), ("next base + k-half 0 split", 1, 6),
              ("wgmmas waited", 6, 5), ("stores", 5, 3)]


def correction_phases(row):
    """Median cycles of each step phase over the steps 4..last-1 and the step; the kernel's start to
    its M loop (flags, copies) and to the first step's top."""
    steps = [r for r in range(CORRECTION_ROW, TIMELINE_SHAPE[1]) if row[r, 0] > 0]
    body = [r for r in steps[4:-1] if row[r + 1, 0] > 0]
    out = {name: statistics.median(int(row[r, b] - row[r, a]) for r in body) for name, a, b in CORRECTION}
    out["step"] = statistics.median(int(row[r + 1, 0] - row[r, 0]) for r in body)
    start = row[CORRECTION_ROW - 1]
    out["start to barriers initialised"] = int(start[0] - start[10])
    out["S_0 stored"] = int(start[1] - start[0])
    out["flags read"] = int(start[2] - start[1])
    out["wait + copies"] = int(start[11] - start[2])  # the early start's wait for the state pass, then the copies
    out["start to M loop"] = int(start[11] - start[10])
    out["start to first step"] = int(row[steps[0], 0] - start[10])
    out["steps recorded"] = len(steps)
    return out


def correction(path: pathlib.Path, buffer: torch.Tensor) -> None:
    lines = ["seqlens,h_qk,h_v,kernel,role,phase,cycles"]
    for lengths, hqk, hv in CORRECTION_CONFIGS:
        inp = make_inputs(lengths, hqk, hv)
        x = inp["x"]
        x["g"].zero_()  # no window anywhere: every step applies M
        label = f"{len(lengths)}x{lengths[0]}"
        buffer.zero_()
        forward_into(torch.empty_like(x["v"]), None, x["q"], x["k"], x["v"], x["g"], x["beta"], x["initial_state"],
                     inp["cu"], 128 ** -0.5, False, False, False, inp["cu_cpu"], 2, 4)
        torch.cuda.synchronize()
        result = correction_phases(buffer.cpu()[1])
        print(f"{label} ({hqk},{hv}) cp_correction: " + ", ".join(f"{phase} {cycles:.0f}" for phase, cycles in result.items()),
              flush=True)
        lines += [f"{label},{hqk},{hv},cp_correction,cta0,{phase},{cycles:.0f}" for phase, cycles in result.items()]
    path.write_text("\n".join(lines) + "\n")


def grads_phases(row):
    """Median cycles of each stage over the CTA's items 2..126 and the item step; group_sums' wait
    over the items that have one."""
    items = [i for i in range(2, TIMELINE_SHAPE[1] - 1) if row[i, 0] > 0 and row[i + 1, 0] > 0]
    out = {}
    for name, a, b in GRADS:  # over the items that mark both events (the issuer's lookup: group 1 only)
        marked = [int(row[i, b] - row[i, a]) for i in items if row[i, a] > 0 and row[i, b] > 0]
        if marked:
            out[name] = statistics.median(marked)
    waits = [int(row[i, 8] - row[i, 7]) for i in items if row[i, 8] > 0]
    if waits:
        out["E: running sum waited"] = statistics.median(waits)
    out["item step"] = statistics.median(int(row[i + 1, 0] - row[i, 0]) for i in items)
    return out


def backward(path: pathlib.Path, buffer: torch.Tensor) -> None:
    lines = ["seqlens,h_qk,h_v,kernel,role,phase,cycles"]
    for lengths, hqk, hv in BACKWARD_CONFIGS:
        inp = make_inputs(lengths, hqk, hv, backward=True)
        x = inp["x"]
        label = f"{len(lengths)}x{lengths[0]}"
        grads = [torch.empty_like(x[n]) for n in ("q", "k", "v")] + [torch.empty_like(x["g"]),
                                                                     torch.empty_like(x["beta"]),
                                                                     torch.empty_like(x["initial_state"])]
        buffer.zero_()
        backward_into(*grads, x["q"], x["k"], x["v"], x["g"], x["beta"], inp["do"], inp["dht"], x["initial_state"],
                      inp["cu"], inp["scale"], False, False, inp["cu_cpu"], 1)
        torch.cuda.synchronize()
        data = buffer.cpu()
        for role in (0, 1):
            result = grads_phases(data[role])
            print(f"{label} ({hqk},{hv}) grads group {role}: " +
                  ", ".join(f"{phase} {cycles:.0f}" for phase, cycles in result.items()), flush=True)
            lines += [f"{label},{hqk},{hv},grads,group{role},{phase},{cycles:.0f}" for phase, cycles in result.items()]
    path.write_text("\n".join(lines) + "\n")


def phases(row, table, done_event):
    """Median cycles of each phase over the recorded chunks, the step (top to next top), the item's
    ends: its start to chunk 0's top, and the last recorded chunk's end (done_event) to the item's end
    (events 10 and 11 in chunk 0's row; the last chunk is the item's own when it has at most
    TIMELINE_SHAPE[1] chunks), the steps of the chunks before FIRST (the pipeline's fill) and the
    phases of the first FILL_PHASES chunks ("c0 K K^T")."""
    chunks = [c for c in range(FIRST, TIMELINE_SHAPE[1] - 1) if row[c, 0] > 0 and row[c + 1, 0] > 0]
    out = {}
    for name, a, b in table:  # over the chunks that mark both events (v5's Ag half: unfolded chunks only)
        marked = [int(row[c, b] - row[c, a]) for c in chunks if row[c, a] > 0 and row[c, b] > 0]
        if marked:
            out[name] = statistics.median(marked)
    out["chunk step"] = statistics.median(int(row[c + 1, 0] - row[c, 0]) for c in chunks)
    last = max(c for c in range(TIMELINE_SHAPE[1]) if row[c, 0] > 0)
    if row[0, 10] > 0:
        out["item start to chunk 0"] = int(row[0, 0] - row[0, 10])
        if row[1, 10] > 0:  # its steps (chunk 1's row): aux lookups and barriers, chunk 0's issue
            out["start: lookups, barriers"] = int(row[1, 10] - row[0, 10])
            out["start: issue"] = int(row[1, 11] - row[1, 10])
        if row[1, 11] > 0:  # (the state's: its initial state loaded)
            out["start: to issued / h0 loaded"] = int(row[1, 11] - row[0, 10])
    if row[0, 11] > 0 and last + 1 < TIMELINE_SHAPE[1]:
        out["last chunk to item end"] = int(row[0, 11] - row[last, done_event])
        out[f"item ({last + 1} chunks)"] = int(row[0, 11] - row[0, 10])
    for c in range(min(FIRST, last)):  # the pipeline's fill: the first steps, which the medians leave out
        out[f"step {c}"] = int(row[c + 1, 0] - row[c, 0])
    for c in range(min(FILL_PHASES, last)):  # and the first chunks' phases (where the fill's cycles go)
        for name, a, b in table:
            if row[c, a] > 0 and row[c, b] > 0:
                out[f"c{c} {name}"] = int(row[c, b] - row[c, a])
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    parser.add_argument("--kernels", default=",".join(KERNELS), help="comma-separated names of KERNELS")
    parser.add_argument("--backward", action="store_true", help="the backward's gradient pass instead")
    parser.add_argument("--correction", action="store_true", help="the forward's CP correction instead")
    args = parser.parse_args()
    kind = "timeline_backward" if args.backward else "timeline_correction" if args.correction else "timeline"
    path = pathlib.Path(args.out) / f"{datetime.date.today()}_{kind}_{git_commit()}.csv"
    lines = ["seqlens,h_qk,h_v,kernel,role,phase,cycles"]
    buffer = torch.zeros(TIMELINE_SHAPE, dtype=torch.int64, device="cuda")
    set_timeline(buffer)
    if args.backward or args.correction:
        (backward if args.backward else correction)(path, buffer)
        set_timeline(None)
        print(f"wrote {path}")
        return
    for lengths, hqk, hv in CONFIGS:
        inp = make_inputs(lengths, hqk, hv)
        x = inp["x"]
        label = f"{len(lengths)}x{lengths[0]}"
        for name in args.kernels.split(","):
            kernel, aux, state = KERNELS[name]
            o = torch.empty_like(x["v"])
            for _ in range(2):  # the second call's marks: warm, as in the benchmark's replays
                buffer.zero_()
                forward_into(o, None, x["q"], x["k"], x["v"], x["g"], x["beta"], x["initial_state"], inp["cu"],
                             128 ** -0.5, False, False, False, inp["cu_cpu"], 1, kernel=kernel)
            torch.cuda.synchronize()
            data = buffer.cpu()
            for role, table in (("aux", aux), ("state", state)):
                result = phases(data[0 if role == "aux" else 1], table, 7 if role == "aux" else 5)
                print(f"{label} ({hqk},{hv}) {name} {role}: " +
                      ", ".join(f"{phase} {cycles:.0f}" for phase, cycles in result.items()), flush=True)
                lines += [f"{label},{hqk},{hv},{name},{role},{phase},{cycles:.0f}" for phase, cycles in result.items()]
    set_timeline(None)
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
