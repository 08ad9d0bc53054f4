"""The A/B logs of scripts/h200_check.sh side by side: per row of bench/kernel_breakdown.py, the whole
call and each kernel of the baseline, then of each other library with its change against the baseline
in percent. Every log holds the rows once a round; a row's last round is taken (the earlier rounds
are warm-up against the machine's clocks; pass --round 1 for the first). Under each row, every
library's whole-call change in each round against the baseline's same round: the machine's drift
shows there (session 28: one round equal within 0.5%, the next +1.5..+3.5% with every kernel equal);
then each one's fastest round against the baseline's fastest, the whole call and every kernel (session
30: a process's whole calls sat at ~74 or ~77 us at 8x1024 (16,16), so the minimum is the steadier
statistic).

    python3 bench/ab_compare.py ab_baseline.log ab_candidate.log [ab_variant.log] [--round N]

Plain Python (no torch): the logs are text, "SPEC: whole call X us (...), kernels Y us (...), rest Z us"
then one "T us  NAME (xN)" line per kernel.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys

WHOLE = re.compile(r"^(?P<spec>\S+): whole call (?P<us>[0-9.]+) us")
KERNEL = re.compile(r"^\s+(?P<us>[0-9.]+) us\s+(?P<name>\S+) \(x[0-9.]+\)$")


def parse(text: str) -> list[dict[str, dict[str, float]]]:
    """The rounds of one log: each a mapping spec -> {"whole call": us, kernel name: us}. A row that
    appears again starts the next round."""
    rounds: list[dict[str, dict[str, float]]] = [{}]
    row: dict[str, float] | None = None
    for line in text.splitlines():
        if m := WHOLE.match(line):
            spec = m["spec"]
            if spec in rounds[-1]:
                rounds.append({})
            row = rounds[-1].setdefault(spec, {})
            row["whole call"] = float(m["us"])
        elif (m := KERNEL.match(line)) and row is not None:
            row[m["name"]] = float(m["us"])
    return [r for r in rounds if r]


def compare(logs: list[tuple[str, list[dict[str, dict[str, float]]]]], round_index: int = -1) -> str:
    """The side-by-side text of (label, rounds) pairs, the first the baseline."""
    picked = []
    for label, rounds in logs:
        if not rounds:
            raise ValueError(f"{label}: no kernel_breakdown rows")
        picked.append((label, rounds[round_index if -len(rounds) <= round_index < len(rounds) else -1]))
    base_label, base = picked[0]
    out = []
    header = f"{'':34s}{base_label:>12s}" + "".join(f"{label:>20s}" for label, _ in picked[1:])
    for spec in base:
        out.append(f"{spec}")
        out.append(header)
        names = list(base[spec])
        for _, rows in picked[1:]:
            names += [n for n in rows.get(spec, {}) if n not in names]
        for name in names:
            ref = base[spec].get(name)
            cells = f"{name[:33]:34s}" + (f"{ref:12.1f}" if ref is not None else f"{'-':>12s}")
            for _, rows in picked[1:]:
                got = rows.get(spec, {}).get(name)
                if got is None:
                    cells += f"{'-':>20s}"
                elif ref:
                    cells += f"{got:12.1f} {100 * (got / ref - 1):+6.1f}%"
                else:
                    cells += f"{got:12.1f}{'':8s}"
            out.append(cells)
        for label, rounds in logs[1:]:
            changes = [_change(b.get(spec, {}).get("whole call"), r.get(spec, {}).get("whole call"))
                       for b, r in zip(logs[0][1], rounds)]
            out.append(f"  {label} whole call by round: " + ", ".join(changes))
        for label, rounds in logs[1:]:  # the fastest round of each: whole calls are bimodal per process
            mins = [f"{name.removesuffix('_kernel')} {_change(_fastest(logs[0][1], spec, name), _fastest(rounds, spec, name))}"
                    for name in names]
            out.append(f"  {label} fastest round against the baseline's: " + ", ".join(mins))
        out.append("")
    return "\n".join(out)


def _fastest(rounds: list[dict[str, dict[str, float]]], spec: str, name: str) -> float | None:
    times = [r[spec][name] for r in rounds if name in r.get(spec, {})]
    return min(times) if times else None


def _change(ref: float | None, got: float | None) -> str:
    return f"{100 * (got / ref - 1):+.1f}%" if ref and got is not None else "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", nargs="+", type=pathlib.Path, help="baseline log first")
    parser.add_argument("--round", type=int, default=0, help="1-based round (default: each log's last)")
    args = parser.parse_args(argv)
    logs = []
    for path in args.logs:
        label = path.stem.removeprefix("ab_")
        logs.append((label, parse(path.read_text())))
    print(compare(logs, args.round - 1 if args.round > 0 else -1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
