"""What the benchmark prints (torch-free): a plain-text progress bar, the table row by row, and the
closing per-direction summary."""

from __future__ import annotations

import sys
import time

from .results import ANCHOR_LABELS, ANCHORS, to_float
from .summary import direction_stats


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class Progress:
    """[#####.....] 12/54 fwd (16,32) 1x32768  1m02s elapsed, ~2m10s left

    On a terminal the bar redraws in place; into a log it prints one line per step."""

    def __init__(self, total: int, stream=None, width: int = 24):
        self.total, self.done, self.width = max(total, 1), 0, width
        self.stream = stream or sys.stderr
        self.start = time.perf_counter()
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()

    def line(self, label: str) -> str:
        filled = self.width * self.done // self.total
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = time.perf_counter() - self.start
        text = f"[{bar}] {self.done}/{self.total} {label}  {_duration(elapsed)} elapsed"
        if 0 < self.done < self.total:
            text += f", ~{_duration(elapsed / self.done * (self.total - self.done))} left"
        return text

    def show(self, label: str) -> None:
        text = self.line(label)
        if self.tty:
            self.stream.write("\r\033[K" + text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def step(self, label: str) -> None:
        self.done += 1
        self.show(label)

    def clear(self) -> None:
        if self.tty:
            self.stream.write("\r\033[K")
            self.stream.flush()


def _ms(value, published=False) -> str:
    v = to_float(value)
    if v is None:
        return "-"
    return f"{v:.3f}" + ("p" if published else "")


HEADER = (f"{'dir':6s} {'model':16s} {'heads':>6s} {'seqlens':>12s} {'flashgdn':>9s} "
          + " ".join(f"{ANCHOR_LABELS[a]:>10s}" for a in ANCHORS)
          + f" {'speedup':>8s} {'vs':>11s} {'mem fl':>7s} {'mma fl':>7s} {'%floor':>6s}  errors vs float64")


def table_header() -> str:
    legend = ("times in ms (median of CUDA-graph replays); 'p': FlashQLA's published H200 number (anchor not "
              "run live); speedup = best anchor / flashgdn (> 1: flashgdn faster); floors: memory and "
              "tensor-core (mma); errors: relative L2 on a sampled head, in () vs flashgdn's output")
    return legend + "\n" + HEADER + "\n" + "-" * len(HEADER)


def table_row(row: dict) -> str:
    anchors = []
    for a in ANCHORS:
        live = row.get(f"{a}_ms")
        anchors.append(_ms(live) if to_float(live) is not None else _ms(row.get(f"{a}_pub_ms"), published=True))
    speedup = to_float(row.get("speedup"))
    best = row.get("best_anchor") or ""
    vs = (ANCHOR_LABELS.get(best, best) + ("(p)" if row.get("anchor_source") == "published" else "")) if best else "-"
    frac = to_float(row.get("floor_fraction"))
    errs = [f"ours {_err(row.get('flashgdn_err'))}"]
    for a in ANCHORS:
        if to_float(row.get(f"{a}_err")) is not None or to_float(row.get(f"{a}_vs_flashgdn")) is not None:
            errs.append(f"{ANCHOR_LABELS[a]} {_err(row.get(f'{a}_err'))} ({_err(row.get(f'{a}_vs_flashgdn'))})")
    seqlens = str(row.get("seqlens", ""))
    return (f"{row.get('direction', ''):6s} {str(row.get('model', ''))[:16]:16s} "
            f"{str(row.get('h_qk')) + '/' + str(row.get('h_v')):>6s} {seqlens:>12s} "
            f"{_ms(row.get('flashgdn_ms')):>9s} " + " ".join(f"{x:>10s}" for x in anchors)
            + f" {('-' if speedup is None else f'{speedup:.2f}x'):>8s} {vs[:11]:>11s} "
            f"{_ms(row.get('mem_floor_ms')):>7s} {_ms(row.get('mma_floor_ms')):>7s} "
            f"{('-' if frac is None else f'{100 * frac:.1f}%'):>6s}  " + " ".join(errs))


def _err(value) -> str:
    v = to_float(value)
    return "-" if v is None else f"{v:.1e}"


def closing_summary(rows: list[dict]) -> str:
    """Per direction: rows, geometric-mean speedups over each anchor (live and published) and the best
    anchor, and the worst errors."""
    lines = []
    for direction in ("fwd", "bwd", "fwdbwd"):
        mine = [r for r in rows if r.get("direction") == direction]
        if not mine:
            continue
        s = direction_stats(mine)
        parts = [f"{direction}: {s['rows']} rows"]
        for key, label in s["speedup_labels"]:
            g = s["speedups"].get(key)
            if g:
                parts.append(f"vs {label} {g['geomean']:.2f}x ({g['faster']}/{g['n']} faster)")
        if s["floor_geomean"] is not None:
            parts.append(f"floor fraction geomean {s['floor_geomean']:.3f}")
        for lib, e in s["errors"].items():
            parts.append(f"max err {ANCHOR_LABELS[lib]} {e['max']:.1e}")
        lines.append("summary " + ", ".join(parts))
    return "\n".join(lines)
