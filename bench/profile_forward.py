"""One forward call to profile with ncu (DESIGN §5 inputs). Without "cp" the planner cannot see
the lengths (device cu_seqlens only), so CP stays off; with "cp" it gets the host copy and CP on.
"ws" runs the warp-specialized fused kernel (kernel 3) instead of the default, "rs" the one with the
state in registers (kernel 4), "inv" the one with the chunk inverse inside (kernel 5). "bwd" runs one
backward call instead (chunk_gated_delta_rule_bwd, the benchmark's bwd row; CP as above).

    python bench/profile_forward.py [COUNTxLENGTH HQK HV [cp] [ws|rs|inv|bwd]]     (default 1x8192 16 32)
"""

import importlib.util
import pathlib
import sys

import torch

if importlib.util.find_spec("flashgdn") is None:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
import flashgdn  # noqa: E402
from flashgdn.bench.inputs import make_inputs  # noqa: E402

args = sys.argv[1:]
spec, hqk, hv = (args[0], int(args[1]), int(args[2])) if len(args) >= 3 else ("1x8192", 16, 32)
with_cp = "cp" in args[3:]
kernel = 3 if "ws" in args[3:] else 4 if "rs" in args[3:] else 5 if "inv" in args[3:] else 0
count, length = (int(n) for n in spec.split("x"))
backward = "bwd" in args[3:]
inp = make_inputs([length] * count, hqk, hv, backward=backward)
if backward:
    x = inp["x"]
    flashgdn.chunk_gated_delta_rule_bwd(x["q"], x["k"], x["v"], x["g"], x["beta"], inp["do"], inp["dht"],
                                        x["initial_state"], inp["cu"], inp["scale"], False, False,
                                        inp["cu_cpu"] if with_cp else None)
elif kernel:
    x = inp["x"]
    flashgdn.ops.forward_into(torch.empty_like(x["v"]), None, x["q"], x["k"], x["v"], x["g"], x["beta"],
                              x["initial_state"], inp["cu"], 128 ** -0.5, False, False, False,
                              inp["cu_cpu"] if with_cp else None, 0 if with_cp else 1, kernel=kernel)
else:
    extra = dict(cu_seqlens_cpu=inp["cu_cpu"], auto_cp=True) if with_cp else {}
    flashgdn.chunk_gated_delta_rule(**inp["x"], cu_seqlens=inp["cu"], output_final_state=True, **extra)
torch.cuda.synchronize()
