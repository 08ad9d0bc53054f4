"""One forward call to profile with ncu (DESIGN §5 inputs, CP off unless the planner can see the
lengths: the device cu_seqlens only).

    python bench/profile_forward.py [COUNTxLENGTH HQK HV]     (default 1x8192 16 32)
"""

import importlib.util
import pathlib
import sys

import torch

if importlib.util.find_spec("flashgdn") is None:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
import flashgdn  # noqa: E402
from flashgdn.bench.inputs import make_inputs  # noqa: E402

spec, hqk, hv = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3])) if len(sys.argv) == 4 else ("1x8192", 16, 32)
count, length = (int(n) for n in spec.split("x"))
inp = make_inputs([length] * count, hqk, hv)
flashgdn.chunk_gated_delta_rule(**inp["x"], cu_seqlens=inp["cu"], output_final_state=True)
torch.cuda.synchronize()
