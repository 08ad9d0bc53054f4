"""Fit the auto-CP cost model (src/plan/cost_model.h) to flashgdn's kernels on this GPU, through the
planner's own code.

Data: the split scan (bench/cp_sweep.py, SPLIT_CONFIGS: the tables' low-parallelism shapes, one to
four sequences of 2k-32k tokens at 8-64 v-heads), each configuration timed by CUDA-graph replay
(median) with CP off and forced on at segment lengths L = 4 .. 128 chunks. A point is the measured
change of the whole call when the sequence is cut at L, t(L) - t(off); the chunk inverse, the same
with and without CP, cancels in it.

Model: the planner's modelled time (cp_plan.h predict_time_us, evaluated by the cp_plan_predict
tool of the build, bench/cp_plan_predict.cpp) of split_plan(L) minus that of no CP, with the
coefficients under fit. The planner assumes every v-head needs the exact transition M (its worst
case; the scan runs the tests' "mixed" gates), so only the sums state + state_m and correction
step + m_step are observable: they are fitted into state_chunk_us and correction_step_us, the M
extras set to 0. Fitted: fused_chunk_us, fused_item_us, state_chunk_us, state_item_us,
correction_step_us, gate_scan_chunk_us (the decay-window scan walks a whole segment for a head
without a window) and launch_us (the correction's per-item constant folds into it). The loss is the squared error of each point relative to its configuration's no-CP time (every
shape weighs alike), minimised by Nelder-Mead over nonnegative coefficients from the current ones;
--ranking-weight W adds W times the mean squared ranking violation (how far the model puts a cut
ahead of the configuration's measured best, relative to t(off)): the errors that change the
planner's choice, which the time error alone can leave (the backward's refit of 26bb088 picked
L = 128 on (1, 32) 32k where 64 is best; with W = 100 it picks 64, offline on the same scan).
Because the model's makespans are exact wave counts, the fit sees where a cut spills into a second
wave. min_segment_chunks, the shortest target length the planner considers, is chosen of 4, 8, 16
by the planner's choices on the scan: never slower than no CP first, closest to the best cut
second. The record gives, per configuration, the length the fitted planner picks and its measured
time against the best measured one.

--direction bwd fits CostModel::backward() to the backward's split scan the same way.

--write-header puts the fitted values into the sources (forward: CostModel's defaults in
src/plan/cost_model.h; backward: CostModel::backward() in src/plan/cost_model.cpp) and the record's
name beside them, for a rebuild and a sweep in the same run.

    python bench/fit_cost_model.py [--direction fwd|bwd] [--splits CSV] [--predictor PATH] [--write-header]
                                   [--ranking-weight W]

Without --splits the scan is measured first (a CUDA GPU and the built library needed; its CSV goes
to bench/results/); with it, the fit runs anywhere the build's cp_plan_predict does. The record is
bench/results/<date>_cost_model[_bwd]_<commit>.json.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import math
import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[1]
FITTED = ("fused_chunk_us", "fused_item_us", "state_chunk_us", "state_item_us", "correction_step_us",
          "gate_scan_chunk_us", "launch_us")
FIXED_ZERO = ("state_m_chunk_us", "correction_m_step_us", "correction_item_us")


def read_scan(path):
    """{(sequences, v_heads, tokens): {segment_chunks: ms}} of a split-scan CSV (0: off, -1: auto);
    tokens is the column's text: one length, or each sequence's joined by '+'."""
    scan = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            key = (int(row["sequences"]), int(row["h_v"]), row["tokens_per_seq"])
            scan.setdefault(key, {})[int(row["segment_chunks"])] = float(row["ms"]) * 1e3
    return scan


class Planner:
    """The planner's modelled times through cp_plan_predict, for one direction."""

    def __init__(self, predictor, direction):
        self.predictor, self.direction = str(predictor), direction

    def predict(self, coefficients, plans):
        """[(modelled_us, target_segment_chunks)] of each (sequences, heads, tokens, segment_chunks)."""
        args = [self.predictor, self.direction] + [f"{name}={value:.6f}" if isinstance(value, float) else f"{name}={value}"
                                                   for name, value in coefficients.items()]
        text = "".join(f"{n} {h} {t} {L}\n" for n, h, t, L in plans)
        out = subprocess.run(args, input=text, capture_output=True, text=True, check=True).stdout.split()
        return [(float(out[i]), int(out[i + 1])) for i in range(0, len(out), 2)]


def points_of(scan):
    """(config, L, measured t(L) - t(off) in us, t(off) in us) for every forced cut."""
    return [(config, L, us - times[0], times[0])
            for config, times in sorted(scan.items()) for L, us in sorted(times.items()) if L > 0]


def loss(planner, coefficients, points, ranking_weight=0.0):
    """Mean squared error of the modelled t(L) - t(off) relative to t(off); with ranking_weight, plus
    that weight times the mean squared ranking violation: for every cut the measurement puts behind
    its configuration's best (or behind no CP), how far the model puts it ahead, relative to t(off)
    (the planner picks the model's fastest cut, so these are the errors that change its choice)."""
    configs = sorted({p[0] for p in points})
    plans = [config + (0,) for config in configs] + [p[0] + (p[1],) for p in points]
    modelled = planner.predict(coefficients, plans)
    off = {config: modelled[i][0] for i, config in enumerate(configs)}
    total = 0.0
    model_gain, measured_gain = {}, {}  # per configuration: cut L -> t(L) - t(off), modelled / measured
    for (config, L, measured, t_off), (us, _) in zip(points, modelled[len(configs):]):
        total += ((us - off[config] - measured) / t_off) ** 2
        model_gain.setdefault(config, {0: 0.0})[L] = (us - off[config]) / t_off
        measured_gain.setdefault(config, {0: 0.0})[L] = measured / t_off
    if ranking_weight == 0.0:
        return total / len(points)
    violations, pairs = 0.0, 0
    for config, measured in measured_gain.items():
        best = min(measured, key=measured.get)
        for L, gain in measured.items():
            if L != best:
                violations += max(0.0, model_gain[config][best] - model_gain[config][L]) ** 2
                pairs += 1
    return total / len(points) + ranking_weight * violations / max(pairs, 1)


def nelder_mead(f, x0, steps, iterations=600):
    """Minimise f over R^n from x0 (simplex edges `steps`); the standard reflection, expansion,
    contraction and shrink moves."""
    simplex = [list(x0)] + [[x + (steps[i] if i == j else 0.0) for j, x in enumerate(x0)] for i in range(len(x0))]
    values = [f(x) for x in simplex]
    for _ in range(iterations):
        order = sorted(range(len(simplex)), key=values.__getitem__)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        centroid = [sum(x[j] for x in simplex[:-1]) / (len(simplex) - 1) for j in range(len(x0))]
        worst = simplex[-1]
        reflected = [c + (c - w) for c, w in zip(centroid, worst)]
        f_reflected = f(reflected)
        if f_reflected < values[0]:
            expanded = [c + 2.0 * (c - w) for c, w in zip(centroid, worst)]
            f_expanded = f(expanded)
            simplex[-1], values[-1] = (expanded, f_expanded) if f_expanded < f_reflected else (reflected, f_reflected)
        elif f_reflected < values[-2]:
            simplex[-1], values[-1] = reflected, f_reflected
        else:
            contracted = [c + 0.5 * (w - c) for c, w in zip(centroid, worst)]
            f_contracted = f(contracted)
            if f_contracted < values[-1]:
                simplex[-1], values[-1] = contracted, f_contracted
            else:
                best = simplex[0]
                simplex = [best] + [[b + 0.5 * (x - b) for b, x in zip(best, s)] for s in simplex[1:]]
                values = [values[0]] + [f(x) for x in simplex[1:]]
    i = min(range(len(simplex)), key=values.__getitem__)
    return simplex[i], values[i]


def model_source(direction):
    """(file, declaration prefix of a floating coefficient, of an integer one, record tag) of the
    direction's coefficients: the forward's are CostModel's defaults in cost_model.h
    (`double name = value;`), the backward's CostModel::backward() in cost_model.cpp
    (`model.name = value;`)."""
    if direction == "fwd":
        return ROOT / "src" / "plan" / "cost_model.h", "double ", "int64_t ", "cost_model"
    return ROOT / "src" / "plan" / "cost_model.cpp", r"model\.", r"model\.", "cost_model_bwd"


def declared(name, value, direction):
    """The regex prefix that declares coefficient `name` (an int: min_segment_chunks)."""
    _, floating, integer, _ = model_source(direction)
    return integer if isinstance(value, int) else floating


def current_coefficients(direction):
    """The coefficients now in the sources (the fit's starting point)."""
    text = model_source(direction)[0].read_text()

    def read(name, kind):
        return kind(re.search(rf"{declared(name, kind(0), direction)}{name} = ([-0-9.e]+);", text).group(1))
    start = {name: read(name, float) for name in FITTED + FIXED_ZERO}
    start["min_segment_chunks"] = read("min_segment_chunks", int)
    return start


def shortest_segment(scan, planner, coefficients, candidates=(4, 8, 16)):
    """CostModel::min_segment_chunks: of the candidates, the one whose planner choices on the scan
    are never slower than no CP by the smallest margin (the worst measured t(chosen) / t(off), at
    least 1), then the closest to the best measured cut (geometric mean of t(chosen) / t(best));
    configurations whose chosen length the scan did not time are left out."""
    def score(shortest):
        worst_over_off, log_over_best, n = 1.0, 0.0, 0
        for c in choices(scan, planner, {**coefficients, "min_segment_chunks": shortest}):
            if c["planner_us"] is None:
                continue
            worst_over_off = max(worst_over_off, c["planner_us"] / scan[tuple(c["config"])][0])
            log_over_best += math.log(c["planner_us"] / c["best_us"])
            n += 1
        return round(worst_over_off, 3), log_over_best / max(n, 1)
    return min(candidates, key=score)


def fit(scan, planner, start, ranking_weight=0.0):
    points = points_of(scan)
    # min_segment_chunks does not enter the forced cuts' times: chosen from the scan afterwards
    fixed = {**{name: 0.0 for name in FIXED_ZERO}, "min_segment_chunks": start["min_segment_chunks"]}

    def coefficients_of(x):
        return {**{name: abs(v) for name, v in zip(FITTED, x)}, **fixed}

    x0 = [start[name] for name in FITTED]
    steps = [max(0.3 * abs(v), 1.0) for v in x0]
    objective = lambda x: loss(planner, coefficients_of(x), points, ranking_weight)
    x, value = nelder_mead(objective, x0, steps)
    for _ in range(2):  # restarts from the optimum: Nelder-Mead can stall on the makespans' kinks
        x, value = nelder_mead(objective, x, [max(0.1 * abs(v), 0.5) for v in x])
    return coefficients_of(x), math.sqrt(loss(planner, coefficients_of(x), points)), math.sqrt(loss(planner, start, points))


def choices(scan, planner, coefficients):
    """Per configuration: the fitted planner's length, its measured time when the scan has it, the
    best measured length and time."""
    configs = sorted(scan)
    picked = planner.predict(coefficients, [c + (-1,) for c in configs])
    out = []
    for config, (_, L) in zip(configs, picked):
        times = {k: v for k, v in scan[config].items() if k >= 0}
        best = min(times, key=times.get)
        out.append({"config": list(config), "planner_L": L, "planner_us": times.get(L),
                    "best_L": best, "best_us": times[best]})
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--direction", choices=("fwd", "bwd"), default="fwd")
    parser.add_argument("--splits", help="a split-scan CSV (bench/cp_sweep.py --splits / --direction bwd)")
    parser.add_argument("--predictor", default=str(ROOT / "build" / "bench" / "cp_plan_predict"))
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    parser.add_argument("--write-header", action="store_true", help="put the fit into src/plan/")
    parser.add_argument("--ranking-weight", type=float, default=0.0,
                        help="weight of the ranking violations in the loss (0: the t(L) - t(off) error alone)")
    args = parser.parse_args()
    if args.splits:
        splits, commit = pathlib.Path(args.splits), re.search(r"_([0-9a-f]{7,})\.csv$", args.splits)
        commit = commit.group(1) if commit else "unknown"
    else:
        import cp_sweep  # torch and the library: only to measure
        splits, commit = cp_sweep.split_sweep(args.direction, args.out), cp_sweep.commit()
    scan = read_scan(splits)
    planner = Planner(args.predictor, args.direction)
    start = current_coefficients(args.direction)
    coefficients, rms, rms_start = fit(scan, planner, start, args.ranking_weight)
    coefficients["min_segment_chunks"] = shortest_segment(scan, planner, coefficients)
    record = {"direction": args.direction, "commit": commit, "splits": splits.name, "fit": coefficients,
              "rms_relative_error": rms, "rms_relative_error_before": rms_start, "start": start,
              "choices": choices(scan, planner, coefficients)}
    out = pathlib.Path(args.out) / f"{datetime.date.today()}_{model_source(args.direction)[3]}_{commit}.json"
    out.write_text(json.dumps(record, indent=1))
    for c in record["choices"]:
        measured = "not scanned" if c["planner_us"] is None else f"{c['planner_us'] / c['best_us']:.3f} of best"
        print(f"{args.direction} N={c['config'][0]} Hv={c['config'][1]:3d} len={c['config'][2]:>6}  planner L={c['planner_L']:3d}"
              f"  best L={c['best_L']:3d}  ({measured})")
    print(f"// fitted by bench/fit_cost_model.py --direction {args.direction} (rms relative error of t(L) - t(off): "
          f"{rms:.4f}, {rms_start:.4f} with the previous coefficients):")
    for name, value in coefficients.items():
        print(f"  {name} = {value:.3f};" if isinstance(value, float) else f"  {name} = {value};")
    print(f"wrote {out}")
    if args.write_header:
        write_sources(coefficients, out.name, args.direction)


def write_sources(coefficients, record_name, direction):
    """The fitted coefficients into the source that holds them (forward: `double name = value;`, the
    defaults in cost_model.h; backward: `model.name = value;` in CostModel::backward()), and the
    record named beside them."""
    source, _, _, tag = model_source(direction)
    text = source.read_text()
    for name, value in coefficients.items():
        formatted = f"{value:.3f}" if isinstance(value, float) else str(value)
        text, count = re.subn(rf"({declared(name, value, direction)}{name} = )[-0-9.e]+;", rf"\g<1>{formatted};", text)
        if count != 1:
            raise SystemExit(f"{source}: expected one value of {name}, found {count}")
    text, count = re.subn(rf"bench/results/[0-9-]+_{tag}_\w+\.json", f"bench/results/{record_name}", text)
    if count != 1:
        raise SystemExit(f"{source}: expected one record name, found {count}")
    source.write_text(text)
    print(f"wrote the fitted coefficients into {source}")


if __name__ == "__main__":
    main()
