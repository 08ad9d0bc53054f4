"""Backward table of DESIGN §5 (bwd and fwdbwd rows): a thin wrapper of
`python -m flashgdn.bench --direction bwd`.

    python bench/bench_backward.py [--quick] [--out DIR] [--filter hv=32,mix=8k_1seq,dir=bwd] [--no-oracle]

Kept so that older commands and scripts keep working; the benchmark lives in python/flashgdn/bench/.
"""

import importlib.util
import pathlib
import sys

if importlib.util.find_spec("flashgdn") is None:  # not installed, not on PYTHONPATH: the checkout's package
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))

from flashgdn.bench.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["--direction", "bwd", *sys.argv[1:]]))
