"""Command line of `python -m flashgdn.bench` (also the `flashgdn-bench` console script).

Argument parsing and configuration selection are torch-free (`--list` runs anywhere); the
measurement itself (runner.py) needs torch, an SM90 GPU and flashgdn's kernels.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from .configs import select

EPILOG = """\
examples:
  python -m flashgdn.bench --quick                      # 15 forward + 8x2 backward rows
  python -m flashgdn.bench                              # the full tables: 171 fwd, 32 bwd, 32 fwdbwd rows
  python -m flashgdn.bench --direction fwd --filter hv=32|64
  python -m flashgdn.bench --config 16/32:1x65536 --direction fwd     # a configuration outside the tables
  python -m flashgdn.bench --direction bwd --filter dir=bwd,mix=32k_1seq --anchors fla
  python -m flashgdn.bench --quick --list               # show what would run, no GPU needed

anchors (each optional: run live if importable, else reported with the reason): FLA (fla-core,
Triton path pinned with FLA_DISABLE_BACKEND_DISPATCH=1), FlashQLA (flash-qla + tilelang), FlashInfer
(flashinfer-python GDN prefill; forward only). FlashQLA's published H200 numbers are shown beside them
(marked p). Output: <out>/<date>_<forward|backward|all>_<commit>[_quick][_<tag>].csv, written row by
row, and <same stem>_speedup.png, _floor.png when matplotlib is importable. Summary for bench/README.md:
python -m flashgdn.bench.summary.
"""


def default_out() -> str:
    return "bench/results" if pathlib.Path("bench").is_dir() else "flashgdn-bench-results"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m flashgdn.bench", formatter_class=argparse.RawDescriptionHelpFormatter,
                                description="flashgdn beside FLA, FlashQLA and FlashInfer on DESIGN §5's tables: "
                                            "whole-call times, physical floors, accuracy against float64.",
                                epilog=EPILOG)
    p.add_argument("--quick", action="store_true", help="a subset: 3 head configs x 5 mixes forward, 2 x 4 backward")
    p.add_argument("--direction", choices=("fwd", "bwd", "all"), default="all",
                   help="fwd: forward table; bwd: backward table (bwd and fwdbwd rows); all (default): both")
    p.add_argument("--filter", action="append", default=[], metavar="KEY=VALUE[,...]",
                   help="keep configurations whose hv, hqk, mix (seqlens), model match; dir=bwd|fwdbwd picks row "
                        "kinds; a value may list alternatives a|b; repeatable (all must hold)")
    p.add_argument("--config", action="append", default=[], metavar="HQK/HV[:MIX]",
                   help="keep these head configurations (and mix); a mix outside the table adds a custom row; "
                        "repeatable")
    p.add_argument("--anchors", default="fla,flashqla,flashinfer",
                   help="comma list of anchors to try (fla, flashqla, flashinfer) or none (default: all three)")
    p.add_argument("--gates", choices=("bench", "model"), default="bench",
                   help="gate recipe: bench (FlashQLA's: logsigmoid(randn)/16, 25%% of heads g=0; default) or "
                        "model (-exp(A_log)*softplus(a+dt_bias), as real layers make)")
    p.add_argument("--replays", type=int, default=30, help="timed replays per library and row (median; default 30)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls before capture (default 2)")
    p.add_argument("--no-oracle", action="store_true", help="skip the float64 cross-check (no error columns)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--out", default=None, help="output folder (default bench/results in a checkout, else "
                                               "./flashgdn-bench-results)")
    p.add_argument("--tag", default="", help="suffix of the CSV name (e.g. a part of a table split over runs)")
    p.add_argument("--seed", type=int, default=0, help="torch seed of the inputs (default 0)")
    p.add_argument("--list", action="store_true", help="print the selected configurations and exit")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.filter = ",".join(args.filter)
    args.out = args.out or default_out()
    unknown = [a for a in args.anchors.split(",") if a and a not in ("fla", "flashqla", "flashinfer", "none")]
    if unknown:
        parser.error(f"--anchors: unknown {', '.join(unknown)} (expected fla, flashqla, flashinfer or none)")
    if args.replays < 1 or args.warmup < 1:
        parser.error("--replays and --warmup must be at least 1")
    try:
        args.configs = select(args.direction, args.quick, args.filter, args.config)
    except ValueError as exc:
        parser.error(str(exc))
    if not args.configs:
        parser.error("no configuration selected (check --filter / --config)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.list:
        for cfg in args.configs:
            print(f"{cfg.table:4s} {cfg.model:16s} {cfg.h_qk:3d}/{cfg.h_v:<3d} {cfg.seqlens:12s} "
                  f"{'+'.join(map(str, cfg.lengths))}")
        print(f"{len(args.configs)} configurations")
        return 0
    from .runner import run  # torch from here on

    return run(args, args.configs)


if __name__ == "__main__":
    sys.exit(main())
