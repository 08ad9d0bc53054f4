"""The SASS instructions of a profiled kernel where its warps stall most, from the source page of an
ncu report (`ncu --import R --page source --csv --print-source sass`): each line's share of the
warp-state samples, its opcode, and the totals per opcode, so a profile shows which waits
(mbarrier SYNCS, CTA BAR, wgmma WARPGROUP waits, loads) hold a kernel's chain. Where the page has the
executed-instruction column, the instruction mix too (warp-level instructions per opcode and the lines
executed most): what an issue-bound kernel spends its slots on. Opcodes are counted without their
predicate (@P0 BRA and @!P1 BRA are both BRA).
--regions: the kernel cut at its CTA barriers (BAR.SYNC, BAR.RED, EXIT: a stall at a barrier lands on
the instruction after it, so a region's stalls are mostly its own barrier's): each region's share of
the executed instructions and of the stall samples, so an issue-bound kernel shows which stage costs.
--context ADDRESS ...: each address (a suffix of it is enough) with its stall reasons and the lines
before and after it (samples, executed), to tell which wait a hot line is.

    python bench/ncu_source_top.py SOURCE.csv[.gz] [--top 25] [--regions] [--context ADDRESS ...]
"""

from __future__ import annotations

import argparse
import collections
import csv
import gzip
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


def regions(body: list[list[str]], samples_at: int, executed_at: int | None, address_at: int, source_at: int,
            min_share: float = 0.005) -> None:
    """The kernel cut after each CTA barrier and exit: per region (at least min_share of the executed
    instructions or twice that of the samples) its address range, lines, shares and last instruction."""
    lines = [r for r in body if len(r) > max(samples_at, source_at, address_at)]
    total_samples = sum(number(r[samples_at]) for r in lines) or 1.0
    total_executed = (sum(number(r[executed_at]) for r in lines) or 1.0) if executed_at is not None else 1.0
    print("regions (cut after BAR.SYNC / BAR.RED / EXIT): executed, stall samples")
    first = 0
    for i, r in enumerate(lines):
        ends = opcode(r[source_at]).startswith(("BAR.SYNC", "BAR.RED", "EXIT")) or i == len(lines) - 1
        if not ends:
            continue
        part = lines[first:i + 1]
        samples = sum(number(x[samples_at]) for x in part) / total_samples
        executed = sum(number(x[executed_at]) for x in part) / total_executed if executed_at is not None else 0.0
        if executed >= min_share or samples >= 2 * min_share:
            print(f"  {part[0][address_at]:>8} .. {r[address_at]:>8}  {len(part):5d} lines  "
                  f"{100 * executed:5.1f}%  {100 * samples:5.1f}%  ends {r[source_at].strip()[:40]}")
        first = i + 1


def context(body: list[list[str]], header: list[str], samples_at: int, executed_at: int | None, address_at: int,
            source_at: int, address: str, before: int = 20, after: int = 5) -> None:
    """The stall reasons of the line at `address` (a suffix of it) and its neighbourhood."""
    reasons = [(i, name[len("stall_"):]) for i, name in enumerate(header)
               if name.startswith("stall_") and "Not Issued" not in name]
    at = next((i for i, r in enumerate(body) if len(r) > address_at and r[address_at].endswith(address)), None)
    if at is None:
        print(f"== {address}: no such line")
        return
    row = body[at]
    print(f"== {row[address_at]}: " + ", ".join(f"{name} {number(row[i]):.0f}" for i, name in reasons
                                                 if i < len(row) and number(row[i]) > 0))
    for r in body[max(0, at - before):at + after + 1]:
        executed = f"{number(r[executed_at]):10.0f}" if executed_at is not None and len(r) > executed_at else ""
        print(f"  {r[address_at][-6:]:>6} {number(r[samples_at]):7.0f} {executed}  {r[source_at].strip()[:70]}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--regions", action="store_true", help="shares per region between CTA barriers")
    parser.add_argument("--context", nargs="*", default=[], metavar="ADDRESS",
                        help="stall reasons and neighbouring lines of these addresses (suffixes)")
    args = parser.parse_args(argv)
    opener = gzip.open if args.csv.endswith(".gz") else open  # h200_check keeps the pages gzipped
    with opener(args.csv, "rt", newline="") as f:
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
    if args.regions:
        regions(body, samples_at, executed_at, address_at, source_at)
    for address in args.context:
        context(body, header, samples_at, executed_at, address_at, source_at, address)
    return 0


if __name__ == "__main__":
    sys.exit(main())
