"""Two benchmark records of flashgdn's own times, row by row: per direction (fwd, bwd, fwdbwd) the
geometric mean of new / base time over the rows both hold, how many rows moved by more than a
threshold each way, the extremes, and the rows past it. Two libraries' tables from one call
(scripts/h200_check.sh BASELINE_TABLES=1) are the intended input; the whole-call times drift by a few
percent within a call (bench/ab_compare.py's per-round line shows it), so read a uniform shift with
every kernel unchanged as drift.

    python3 bench/table_compare.py BASE.csv NEW.csv [BASE2.csv NEW2.csv ...] [--threshold 0.02] [--rows]

Plain Python (no torch): the records are bench CSVs (python/flashgdn/bench/results.py's columns).
"""

from __future__ import annotations

import argparse
import csv
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from summarize import torch_free_bench  # noqa: E402

torch_free_bench()
from flashgdn.bench.summary import geomean  # noqa: E402

KEY = ("direction", "model", "seqlens", "lengths", "h_qk", "h_v")


def load(path: pathlib.Path) -> dict[tuple, float]:
    """flashgdn's time per row (ms), keyed by the row's identity."""
    with open(path, newline="") as f:
        return {tuple(r[k] for k in KEY): float(r["flashgdn_ms"]) for r in csv.DictReader(f) if r["flashgdn_ms"]}


def compare(base: dict[tuple, float], new: dict[tuple, float], threshold: float = 0.02,
            rows: bool = False) -> str:
    by_direction: dict[str, list[tuple[tuple, float]]] = {}
    for key, t in base.items():
        if key in new and t > 0:
            by_direction.setdefault(key[0], []).append((key, new[key] / t))
    out = []
    for direction, ratios in by_direction.items():
        values = [r for _, r in ratios]
        faster = sum(r < 1 - threshold for r in values)
        slower = sum(r > 1 + threshold for r in values)
        out.append(f"{direction}: {len(values)} rows, new / base time geomean {geomean(values):.3f}x, "
                   f"{faster} faster and {slower} slower by more than {100 * threshold:g}%, "
                   f"range {min(values):.3f} .. {max(values):.3f}")
        if rows:
            out += [f"    {' '.join(key[1:])}: {r:.3f}" for key, r in ratios if abs(r - 1) > threshold]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", nargs="+", type=pathlib.Path, help="pairs: base then new")
    parser.add_argument("--threshold", type=float, default=0.02)
    parser.add_argument("--rows", action="store_true", help="list the rows past the threshold")
    args = parser.parse_args(argv)
    if len(args.records) % 2:
        parser.error("records come in pairs: base then new")
    for base, new in zip(args.records[::2], args.records[1::2]):
        print(f"{new.name} against {base.name}")
        print(compare(load(base), load(new), args.threshold, args.rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
