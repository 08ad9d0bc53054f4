"""`python -m flashgdn.bench.summary` without torch or a built flashgdn library (the summary, CSV
and plot modules are torch-free): writes the summary of the latest records into bench/README.md.

    python bench/summarize.py [CSV ...] [--stdout]        # run from the repository root
    python bench/summarize.py --plots CSV                 # the PNG plots of one record (matplotlib)
"""

import importlib
import pathlib
import sys
import types

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "python" / "flashgdn"


def torch_free_bench():
    """flashgdn.bench's torch-free modules, without running flashgdn/__init__.py (which loads torch and the
    C library): a stand-in parent package that only knows where its files are."""
    if "flashgdn" not in sys.modules:
        stub = types.ModuleType("flashgdn")
        stub.__path__ = [str(PACKAGE)]
        sys.modules["flashgdn"] = stub
    return importlib.import_module("flashgdn.bench")


if __name__ == "__main__":
    torch_free_bench()
    if sys.argv[1:2] == ["--plots"]:
        from flashgdn.bench.plots import main
        sys.exit(main(sys.argv[2:]))
    from flashgdn.bench.summary import main
    sys.exit(main(sys.argv[1:]))
