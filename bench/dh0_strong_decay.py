"""dh0's error against float64 under strong decay (A = 16 on every head) with an initial state and no
final-state gradient: dh0 then comes from the first tokens only, through gates of ~e^-11 a token, and is
~1e-5 of the other gradients. Per seed and dtype: the uncached backward's dh0 rel L2, the backward given
a v5 forward's inverse cache, and dh0's rms. Run on the GPU from the repository root:
  python3 bench/dh0_strong_decay.py [--seeds 192460836,1,2,...] [--random 16]"""

import argparse
import random
import sys

import torch

sys.path.insert(0, "tests/gpu")
from conftest import make_inputs  # noqa: E402
from oracle import backward_f64, rel_l2  # noqa: E402
from test_backward import run_poisoned, upstream  # noqa: E402
from test_inverse_cache import OFF, V5, backward, forward_filling_cache  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", default="192460836")
    parser.add_argument("--random", type=int, default=16)
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s]
    seeds += [random.SystemRandom().randrange(2**31) for _ in range(args.random)]
    print("seed       dtype     uncached   v5-cached  rms(dh0)   rms(dq)")
    for seed in seeds:
        for dtype in (torch.float16, torch.bfloat16):
            torch.manual_seed(seed)
            x = make_inputs(2, 1000, 2, 4, regime="strong", dtype=dtype, initial_state=True)
            do, dht = upstream(x, False)
            want = backward_f64(*(x[n] for n in ("q", "k", "v", "g", "beta")), x["q"].shape[-1] ** -0.5, do, dht,
                                x["initial_state"], None, False, False)
            plain = run_poisoned(x, do, dht)
            _, cache = forward_filling_cache(x, mode=OFF, kernel=V5)
            cached = backward(x, do, dht, mode=OFF, inverse_cache=cache)
            print(f"{seed:<10} {str(dtype)[6:]:<9} {rel_l2(plain['dh0'], want[5]):.2e}   "
                  f"{rel_l2(cached['dh0'], want[5]):.2e}   {want[5].pow(2).mean().sqrt().item():.2e}   "
                  f"{want[0].pow(2).mean().sqrt().item():.2e}")


if __name__ == "__main__":
    main()
