"""PNG plots of a benchmark record (matplotlib, optional; torch-free).

    <stem>_speedup.png   per row: speedup of flashgdn over each anchor (other's time / flashgdn's, log
                         scale; filled marker: measured live, hollow: published), one panel per direction
    <stem>_floor.png     per row: each library's time against the row's floor max(memory, tensor-core)
                         on log-log axes, with the lines time = floor, 2x, 4x, ... floor

    python -m flashgdn.bench.plots RECORD.csv [--out DIR]
"""

from __future__ import annotations

import argparse
import pathlib

from .results import ANCHOR_LABELS, ANCHORS, read_csv, to_float

DIRECTIONS = ("fwd", "bwd", "fwdbwd")
COLORS = {"flashgdn": "#d62728", "fla": "#1f77b4", "flashqla": "#2ca02c", "flashinfer": "#ff7f0e"}


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt, None
    except Exception as exc:  # noqa: BLE001 - any reason matplotlib cannot draw
        return None, f"{type(exc).__name__}: {exc}"


def _log_axis(axis, suffix: str = "") -> None:
    """Log axis labelled at 1, 2, 5 x 10^k as plain numbers (no crowded minor labels)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}{suffix}"))
    axis.set_minor_formatter(NullFormatter())


def _label(r: dict) -> str:
    return f"({r.get('h_qk')},{r.get('h_v')}) {r.get('seqlens')}"


def speedup_figure(plt, rows: list[dict]):
    panels = [(d, [r for r in rows if r.get("direction") == d]) for d in DIRECTIONS]
    panels = [(d, rs) for d, rs in panels if rs]
    height = max(3.0, 0.13 * max(len(rs) for _, rs in panels) + 1.5)
    fig, axes = plt.subplots(1, len(panels), figsize=(7.5 * len(panels), height), squeeze=False)
    for ax, (direction, rs) in zip(axes[0], panels):
        ys = range(len(rs))
        for a in ANCHORS:
            for source, column, face in (("live", f"{a}_ms", COLORS[a]), ("published", f"{a}_pub_ms", "none")):
                pts = [(to_float(r.get(column)) / to_float(r["flashgdn_ms"]), y) for y, r in zip(ys, rs)
                       if to_float(r.get(column)) and to_float(r.get("flashgdn_ms"))]
                if pts:
                    ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=18, facecolors=face,
                               edgecolors=COLORS[a], label=f"{ANCHOR_LABELS[a]} ({source})")
        ax.axvline(1.0, color="black", lw=0.8)
        ax.set_xscale("log")
        _log_axis(ax.xaxis, "x")
        ax.set_yticks(list(ys))
        ax.set_yticklabels([_label(r) for r in rs], fontsize=5 if len(rs) > 40 else 7)
        ax.set_ylim(len(rs) - 0.5, -0.5)
        ax.set_xlabel("speedup of flashgdn = other's time / flashgdn's (> 1: flashgdn faster)")
        ax.set_title(f"{direction}: {len(rs)} rows")
        ax.grid(axis="x", which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def floor_figure(plt, rows: list[dict]):
    panels = [(d, [r for r in rows if r.get("direction") == d]) for d in DIRECTIONS]
    panels = [(d, rs) for d, rs in panels if rs]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 5.5), squeeze=False)
    for ax, (direction, rs) in zip(axes[0], panels):
        floors = [max(filter(None, (to_float(r.get("mem_floor_ms")), to_float(r.get("mma_floor_ms")))), default=None)
                  for r in rs]
        ratios = []
        for lib in ("flashgdn",) + ANCHORS:
            for source, column in (("live", f"{lib}_ms"), ("published", f"{lib}_pub_ms")):
                pts = [(f, to_float(r.get(column))) for f, r in zip(floors, rs) if f and to_float(r.get(column))]
                if not pts:
                    continue
                ratios += [t / f for f, t in pts]
                live = source == "live"
                ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=16, alpha=0.8, edgecolors=COLORS[lib],
                           facecolors=COLORS[lib] if live else "none",
                           label=ANCHOR_LABELS[lib] + ("" if lib == "flashgdn" or live else " (published)"))
        known = [f for f in floors if f]
        if known:
            lo, hi = min(known) * 0.8, max(known) * 1.25
            k = 1
            while True:  # time = k x floor for k = 1, 4, 16, ... up to the slowest point
                ax.plot([lo, hi], [k * lo, k * hi], color="gray", lw=1.2 if k == 1 else 0.6, ls="-" if k == 1 else ":")
                ax.annotate("floor" if k == 1 else f"{k}x", (hi, k * hi), fontsize=6, color="gray")
                if k >= max(ratios, default=1) or k >= 4096:
                    break
                k *= 4
        ax.set_xscale("log")
        ax.set_yscale("log")
        _log_axis(ax.xaxis)
        _log_axis(ax.yaxis)
        ax.set_xlabel("floor = max(memory, tensor-core) [ms]")
        ax.set_ylabel("measured time [ms]")
        ax.set_title(f"{direction}: time vs floor")
        ax.grid(which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def write_plots(rows: list[dict], stem: pathlib.Path) -> tuple[list[pathlib.Path], str | None]:
    """Write <stem>_speedup.png and <stem>_floor.png; returns (paths, reason they were not written)."""
    rows = [r for r in rows if to_float(r.get("flashgdn_ms"))]
    if not rows:
        return [], "no rows with a flashgdn time"
    plt, reason = _pyplot()
    if plt is None:
        return [], f"matplotlib not importable ({reason})"
    paths = []
    for suffix, make in (("speedup", speedup_figure), ("floor", floor_figure)):
        fig = make(plt, rows)
        path = stem.with_name(f"{stem.name}_{suffix}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths, None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flashgdn.bench.plots", description="PNG plots of a record")
    parser.add_argument("csv")
    parser.add_argument("--out", default=None, help="folder for the PNGs (default: beside the CSV)")
    args = parser.parse_args(argv)
    path = pathlib.Path(args.csv)
    stem = (pathlib.Path(args.out) if args.out else path.parent) / path.stem
    paths, reason = write_plots(read_csv(path), stem)
    print("\n".join(f"wrote {p}" for p in paths) if paths else f"no plots: {reason}")
    return 0 if paths else 1


if __name__ == "__main__":
    raise SystemExit(main())
