"""The SASS instructions of a profiled kernel where its warps stall most, from the source page of an
ncu report (`ncu --import R --page source --csv --print-source sass`): each line's share of the
warp-state samples, its opcode, and the totals per opcode, so a profile shows which waits
(mbarrier SYNCS, CTA BAR, wgmma WARPGROUP waits, loads) hold a kernel's chain. Where the page has the
executed-instruction column, the instruction mix too (warp-level instructions per opcode and the lines
executed most): what an issue-bound kernel spends its slots on. Opcodes are counted without their
predicate (@P0 BRA and @!P1 BRA are both BRA).

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


def executed_column(header: list[str]) -> int | None:
    """Index of the warp-level executed-instructions column, if the page has it."""
    for i, name in enumerate(header):
        if name.strip() == "Instructions Executed":
            return i
    return None


def opcode(source: str) -> str:
    """The instruction's opcode without its predicate ("@!P0 BRA 0x10" -> "BRA")."""
    words = source.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0] if words else "?"


def number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def column_lines(body: list[list[str]], at: int, address_at: int, source_at: int) -> list[tuple[float, str, str]]:
    """(value in column `at`, address, source) of every SASS line."""
    return [(number(r[at]), r[address_at], r[source_at].strip()) for r in body if len(r) > at]


def shares(lines: list[tuple[float, str, str]], lines_title: str, opcodes_title: str, top_lines: int,
           top_opcodes: int, counts: bool = False) -> None:
    """The lines with the largest values and the totals per opcode, each as a share of the sum."""
    total = sum(n for n, _, _ in lines) or 1.0
    per_opcode = collections.Counter()
    for n, _, source in lines:
        per_opcode[opcode(source)] += n
    print(lines_title)
    for n, address, source in sorted(lines, reverse=True)[:top_lines]:
        print(f"  {100 * n / total:5.1f}%  {address:>8}  {source[:90]}")
    print(opcodes_title)
    for name, n in per_opcode.most_common(top_opcodes):
        print(f"  {100 * n / total:5.1f}%  " + (f"{n:12.0f}  " if counts else "") + name)


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
    samples = column_lines(body, samples_at, address_at, source_at)
    print(f"{len(samples)} SASS lines, {sum(n for n, _, _ in samples):.0f} warp-state samples")
    shares(samples, "top lines:", "per opcode:", args.top, 12)
    executed_at = executed_column(header)
    if executed_at is not None:
        executed = column_lines(body, executed_at, address_at, source_at)
        print(f"instructions executed (warp level): {sum(n for n, _, _ in executed):.0f}")
        shares(executed, "lines executed most:", "per opcode, executed:", args.top // 2, 15, counts=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
