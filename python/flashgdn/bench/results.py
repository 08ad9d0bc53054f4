"""The benchmark's CSV records (torch-free): columns, the best-anchor/speedup rule, an incremental
writer, and a reader that also understands the older records in bench/results/.

One row per (direction, config). Times are whole-call milliseconds. Anchor columns `<anchor>_ms` hold
times measured live in the same run (empty where the anchor did not run); `<anchor>_pub_ms` hold
FlashQLA's published H200 numbers (shared/data/flashqla_published_h200.csv). The best anchor of a row
is the fastest live anchor time, a published time standing in for an anchor that did not run live;
`anchor_source` says which kind it was, and speedup = best_anchor_ms / flashgdn_ms (> 1: flashgdn is
faster). Errors are relative L2 norms ‖x − ref‖ / ‖ref‖ on one sampled head (see runner.py).
"""

from __future__ import annotations

import csv
import math
import pathlib
import re

ANCHORS = ("fla", "flashqla", "flashinfer")
ANCHOR_LABELS = {"flashgdn": "flashgdn", "fla": "FLA", "flashqla": "FlashQLA", "flashinfer": "FlashInfer"}
GRADS = ("dq", "dk", "dv", "dg", "dbeta", "dh0")

COLUMNS = (
    ["direction", "model", "seqlens", "lengths", "h_qk", "h_v", "tokens", "gates",
     "flashgdn_ms"] + [f"{a}_ms" for a in ANCHORS] + [f"{a}_pub_ms" for a in ANCHORS]
    + ["best_anchor", "best_anchor_ms", "anchor_source", "speedup",
       "mem_floor_ms", "mma_floor_ms", "floor_fraction",
       "rel_err_o", "rel_err_ht"] + [f"err_{g}" for g in GRADS] + ["flashgdn_err"]
    + [f"{a}_err" for a in ANCHORS] + [f"{a}_vs_flashgdn" for a in ANCHORS]
    + ["notes", "timing", "copy_tbps", "gemm_tflops", "gpu", "commit", "versions"])

MS_COLUMNS = {c for c in COLUMNS if c.endswith("_ms")}
ERR_COLUMNS = ({"rel_err_o", "rel_err_ht", "flashgdn_err"} | {f"err_{g}" for g in GRADS}
               | {f"{a}_err" for a in ANCHORS} | {f"{a}_vs_flashgdn" for a in ANCHORS})
RATIO_COLUMNS = {"speedup", "floor_fraction"}


def best_anchor(live: dict[str, float | None], published: dict[str, float | None]
                ) -> tuple[str, float | None, str]:
    """(anchor name, its ms, "live" or "published") of the fastest anchor; a published time counts
    only for an anchor with no live time. ("", None, "") when there is none."""
    candidates = [(t, a, "live") for a, t in live.items() if t is not None and t > 0]
    candidates += [(t, a, "published") for a, t in published.items()
                   if t is not None and t > 0 and live.get(a) is None]
    if not candidates:
        return "", None, ""
    t, a, source = min(candidates)
    return a, t, source


def complete_row(row: dict) -> dict:
    """Fill the derived columns (best anchor, speedup, floor fraction, worst errors) from the others."""
    live = {a: to_float(row.get(f"{a}_ms")) for a in ANCHORS}
    pub = {a: to_float(row.get(f"{a}_pub_ms")) for a in ANCHORS}
    name, t_best, source = best_anchor(live, pub)
    ours = to_float(row.get("flashgdn_ms"))
    row["best_anchor"], row["best_anchor_ms"], row["anchor_source"] = name, t_best, source
    row["speedup"] = t_best / ours if ours and t_best else None
    floor = max([v for v in (to_float(row.get("mem_floor_ms")), to_float(row.get("mma_floor_ms"))) if v],
                default=None)
    row["floor_fraction"] = floor / ours if floor and ours else None
    if to_float(row.get("flashgdn_err")) is None:
        errs = [to_float(row.get(c)) for c in ["rel_err_o", "rel_err_ht"] + [f"err_{g}" for g in GRADS]]
        row["flashgdn_err"] = max([e for e in errs if e is not None], default=None)
    return row


def to_float(x) -> float | None:
    if x is None or x == "":
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def fmt_cell(column: str, value) -> str:
    """How a value is written into the CSV."""
    if value is None:
        return ""
    if isinstance(value, float):
        if not math.isfinite(value):
            return "nan"
        if column in ERR_COLUMNS:
            return f"{value:.2e}"
        if column in RATIO_COLUMNS:
            return f"{value:.3f}"
        if column in MS_COLUMNS:
            return f"{value:.4f}"
        return f"{value:.4g}"
    return str(value)


class CsvWriter:
    """Writes rows as they are measured (flushed each row: an interrupted run keeps its rows)."""

    def __init__(self, path: pathlib.Path):
        self.path = pathlib.Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "w", newline="")
        self._writer = csv.DictWriter(self._file, fieldnames=COLUMNS, extrasaction="ignore")
        self._writer.writeheader()
        self._file.flush()
        self.rows = 0

    def write(self, row: dict) -> None:
        self._writer.writerow({c: fmt_cell(c, row.get(c)) for c in COLUMNS})
        self._file.flush()
        self.rows += 1

    def close(self) -> None:
        self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def csv_name(date: str, direction: str, commit: str, quick: bool, tag: str = "") -> str:
    """<date>_<forward|backward|all>_<commit>[_quick][_<tag>].csv"""
    kind = {"fwd": "forward", "bwd": "backward", "all": "all"}[direction]
    parts = [date, kind, re.sub(r"[^0-9A-Za-z.-]", "-", commit)]
    if quick:
        parts.append("quick")
    if tag:
        parts.append(re.sub(r"[^0-9A-Za-z.-]", "-", tag))
    return "_".join(parts) + ".csv"


# Older records: forward CSVs up to 7c6b158 (bench/bench_forward.py) and the backward CSV of 7c6b158.
_LEGACY = {
    "flashqla_published_ms": "flashqla_pub_ms", "flashinfer_published_ms": "flashinfer_pub_ms",
    "fla_published_ms": "fla_pub_ms", "memory_floor_ms": "mem_floor_ms", "tensor_floor_ms": "mma_floor_ms",
    "tc_floor_ms": "mma_floor_ms", "err_flashgdn": "rel_err_o", "err_fla": "fla_err", "device": "gpu",
    "time_ms": "flashgdn_ms", "fla_note": "notes",
}


def normalize(row: dict) -> dict:
    """A row of any record version in the current columns (derived columns recomputed where missing)."""
    out = {}
    for key, value in row.items():
        if key is None:
            continue
        out[_LEGACY.get(key, key)] = value
    if "flashgdn_ms" not in row and "time_ms" in row:
        out["flashgdn_ms"] = row["time_ms"]
    fla_grad_errs = [to_float(row.get(f"fla_err_{g}")) for g in GRADS]
    if any(e is not None for e in fla_grad_errs) and not out.get("fla_err"):
        out["fla_err"] = max(e for e in fla_grad_errs if e is not None)
    if row.get("fla_note"):  # the backward record of 7c6b158: the note was FLA's
        out["notes"] = "fla: " + row["fla_note"]
    for key in ("best_anchor", "speedup", "floor_fraction", "flashgdn_err"):
        if out.get(key) in (None, ""):
            complete_row(out)
            break
    return out


def read_csv(path) -> list[dict]:
    with open(path, newline="") as f:
        return [normalize(r) for r in csv.DictReader(f)]


def read_published(path) -> dict[tuple[str, str, int, int], dict]:
    """FlashQLA's published H200 table keyed by (direction, seqlens, h_qk, h_v)."""
    table = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            table[(r["direction"], r["seqlens"], int(r["h_qk"]), int(r["h_v"]))] = r
    return table


PUBLISHED_CSV = pathlib.Path(__file__).with_name("flashqla_published_h200.csv")
