"""The SASS instructions of a profiled kernel where its warps stall most, from the source page of an
ncu report (`ncu --import R --page source --csv --print-source sass`): each line's share of the
warp-state samples, its opcode, and the totals per opcode, so a profile shows which waits
(mbarrier SYNCS, CTA BAR, wgmma WARPGROUP waits, loads) hold a kernel's chain.

    python bench/ncu_source_top.py SOURCE.csv [--top 25]
"""

from __future__ import annotations

import argparse
import collections
import csv
import sys


def sample_column(header: list[str]) -> int:
    """Index of the all-samples warp-stall column (names vary a little between ncu versions)."""
    for i, name in enumerate(header):
        if "Warp Stall Sampling" in name and "Not" not in name:
            return i
    raise SystemExit(f"no warp-stall sampling column in {header}")


def number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    with open(args.csv, newline="") as f:
        rows = [row for row in csv.reader(f) if row]
    start = next(i for i, row in enumerate(rows) if any("Source" == c or "Address" == c for c in row))
    header, body = rows[start], rows[start + 1:]
    samples_at = sample_column(header)
    source_at = header.index("Source") if "Source" in header else len(header) - 1
    address_at = header.index("Address") if "Address" in header else 0
    lines = [(number(r[samples_at]), r[address_at], r[source_at].strip()) for r in body if len(r) > samples_at]
    total = sum(s for s, _, _ in lines) or 1.0
    per_opcode = collections.Counter()
    for samples, _, source in lines:
        per_opcode[source.split()[0] if source else "?"] += samples
    print(f"{len(lines)} SASS lines, {total:.0f} warp-state samples")
    print("top lines:")
    for samples, address, source in sorted(lines, reverse=True)[:args.top]:
        print(f"  {100 * samples / total:5.1f}%  {address:>8}  {source[:90]}")
    print("per opcode:")
    for opcode, samples in per_opcode.most_common(12):
        print(f"  {100 * samples / total:5.1f}%  {opcode}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
