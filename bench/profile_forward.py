"""One forward call to profile with ncu: 1 x 8192 tokens, (Hqk, Hv) = (16, 32), DESIGN §5 inputs."""

import importlib.util
import pathlib
import sys

import torch

if importlib.util.find_spec("flashgdn") is None:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
import flashgdn  # noqa: E402
from flashgdn.bench.inputs import make_inputs  # noqa: E402

inp = make_inputs([8192], 16, 32)
flashgdn.chunk_gated_delta_rule(**inp["x"], cu_seqlens=inp["cu"], output_final_state=True)
torch.cuda.synchronize()
