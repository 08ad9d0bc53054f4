"""One forward call to profile with ncu: 1 x 8192 tokens, (Hqk, Hv) = (16, 32), DESIGN §5 inputs."""

import sys
import pathlib

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import flashgdn  # noqa: E402
from bench_forward import make_inputs  # noqa: E402

x, cu = make_inputs([8192], 16, 32)
flashgdn.chunk_gated_delta_rule(**x, cu_seqlens=cu, output_final_state=True)
torch.cuda.synchronize()
