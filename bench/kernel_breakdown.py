"""Where a forward call's time goes: per configuration, the whole call by CUDA-graph replay (median,
as the benchmark times it) beside each kernel's device time, averaged over warm eager calls
(torch.profiler / CUPTI), and the rest (launch gaps and idle between kernels). The call is the
benchmark's (chunk_gated_delta_rule with the host lengths: auto kernel, auto CP). The kernels are
launched with programmatic dependent launch (FLASHGDN_PDL, default on), under which a kernel starts
early and waits for the previous one, so its CUPTI time would include the wait: the kernel times come
from a child process with FLASHGDN_PDL=0, the whole call from this one (PDL as the environment says).

    python bench/kernel_breakdown.py [COUNTxLENGTH:HQK:HV[:KERNEL[:CP]] ...] [--calls N] [--dtype fp16]
                                     [--gates model]
        (default: the short-sequence rows 8x1024:16:32 4x2048:16:32 8x1024:2:8 1x2048:16:32 4x8192:16:32)
    LENGTH may list the sequences' lengths '+'-joined (1x1024+7168). KERNEL (rs, inv) pins the fused kernel
    through ops.forward_into, with CP auto (default), off, or a segment length in chunks (forced on).
    KERNEL bwd times the backward call instead (chunk_gated_delta_rule_bwd with the host lengths; CP auto,
    off or a segment length as above, or `cache`: given what a forward with the default options keeps, its
    CP cache where it runs CP and its inverse cache (every call but decode-sized and shard ones: written
    by the register-state kernel's chunk inverse, or by the inverse-inside kernel itself), as the
    benchmark's bwd rows). KERNEL keep times that forward (ops.forward_into writing those caches).
    --dtype fp16: q, k, v (and dO) cast to fp16 (default bf16, the benchmark's); --gates: the gate recipe
    (flashgdn.bench.inputs: bench, the default, or model).
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
if importlib.util.find_spec("flashgdn") is None:
    sys.path.insert(0, str(ROOT / "python"))
import flashgdn  # noqa: E402
from flashgdn import ops  # noqa: E402
from flashgdn.bench.inputs import make_inputs  # noqa: E402
from flashgdn.bench.timing import time_graph  # noqa: E402

DEFAULT = ["8x1024:16:32", "4x2048:16:32", "8x1024:2:8", "1x2048:16:32", "4x8192:16:32"]


def short_name(name: str) -> str:
    """The kernel's function name without namespaces, template arguments and parameters."""
    name = re.sub(r"\(.*", "", name.replace("(anonymous namespace)::", ""))
    while "<" in name:
        name = re.sub(r"<[^<>]*>", "", name)
    return name.split("::")[-1].replace("void ", "").strip()


KERNELS = {"rs": 4, "inv": 5}


def forward_cache_kwargs(x, inp) -> dict:
    """chunk_gated_delta_rule_bwd's keywords for what a default forward keeps. A/B runs pass this script
    older packages: those before the inverse cache (session 35) keep only the CP cache (forward_cp_cache)."""
    import flashgdn.bench.runner as runner
    args = (x, inp["cu"], inp["cu_cpu"], inp["scale"])
    if hasattr(runner, "forward_caches"):
        return runner.backward_kwargs(runner.forward_caches(*args))
    cache = runner.forward_cp_cache(*args)
    return ops.CpCache.backward_kwargs(cache) if cache is not None else {}


DTYPE, GATES = "bf16", "bench"  # main's --dtype and --gates


def call_of(spec: str):
    shape, hqk, hv, *pinned = spec.split(":")
    count, length = shape.split("x")
    lengths = [int(n) for n in length.split("+")] * int(count)
    inp = make_inputs(lengths, int(hqk), int(hv), gates=GATES, backward=bool(pinned) and pinned[0] == "bwd")
    x = inp["x"]
    if DTYPE == "fp16":
        for name in ("q", "k", "v"):
            x[name] = x[name].half()
        if "do" in inp:
            inp["do"] = inp["do"].half()
    if pinned and pinned[0] == "bwd":
        cp = pinned[1] if len(pinned) > 1 else "auto"
        mode, segment = (0, 0) if cp in ("auto", "cache") else (1, 0) if cp == "off" else (2, int(cp))
        cached = {}
        if cp == "cache":
            cached = forward_cache_kwargs(x, inp)
        fn = lambda: flashgdn.chunk_gated_delta_rule_bwd(  # noqa: E731
            x["q"], x["k"], x["v"], x["g"], x["beta"], inp["do"], inp["dht"], x["initial_state"], inp["cu"],
            inp["scale"], False, False, inp["cu_cpu"], mode, segment, **cached)
    elif pinned and pinned[0] == "keep":  # the default forward writing the caches its backward takes
        args = (x["q"], x["k"], x["v"], x["g"], x["beta"], x["initial_state"], inp["cu"], inp["scale"])
        caches = {"cp_cache": ops.new_cp_cache(*args, cu_seqlens_cpu=inp["cu_cpu"]),
                  "inverse_cache": ops.new_inverse_cache(*args, cu_seqlens_cpu=inp["cu_cpu"])}
        o = torch.empty_like(x["v"])
        fn = lambda: ops.forward_into(o, None, *args, cu_seqlens_cpu=inp["cu_cpu"], **caches)  # noqa: E731
    elif pinned:
        cp = pinned[1] if len(pinned) > 1 else "auto"
        mode, segment = (0, 0) if cp == "auto" else (1, 0) if cp == "off" else (2, int(cp))
        o = torch.empty_like(x["v"])
        final = torch.empty(len(lengths), int(hv), 128, 128, device="cuda")
        fn = lambda: ops.forward_into(o, final, x["q"], x["k"], x["v"], x["g"], x["beta"],  # noqa: E731
                                      x["initial_state"], inp["cu"], inp["scale"], False, False, False,
                                      inp["cu_cpu"], mode, segment, kernel=KERNELS[pinned[0]])
    else:
        fn = lambda: flashgdn.chunk_gated_delta_rule(**x, scale=inp["scale"], cu_seqlens=inp["cu"],  # noqa: E731
                                                     output_final_state=True, cu_seqlens_cpu=inp["cu_cpu"])
    return fn


def kernel_times(spec: str, calls: int) -> dict[str, list[float]]:
    """name: [us per call, launches per call], CUPTI over `calls` warm eager calls."""
    fn = call_of(spec)
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    per_kernel: dict[str, float] = collections.defaultdict(float)
    launches: dict[str, int] = collections.defaultdict(int)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and event.device_time > 0:
            name = event.name
            if name.startswith("Memcpy") or name.startswith("Memset"):
                name = name.split(" ")[0]
            per_kernel[short_name(name)] += event.device_time / calls  # us
            launches[short_name(name)] += 1
    return {name: [us, launches[name] / calls] for name, us in per_kernel.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("configs", nargs="*", default=DEFAULT)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--kernel-times-json", action="store_true", help="(internal) print the kernel times as JSON")
    parser.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    parser.add_argument("--gates", choices=("bench", "model"), default="bench")
    args = parser.parse_args()
    global DTYPE, GATES
    DTYPE, GATES = args.dtype, args.gates
    if args.kernel_times_json:
        print(json.dumps({spec: kernel_times(spec, args.calls) for spec in args.configs}))
        return
    pdl = os.environ.get("FLASHGDN_PDL", "1") != "0"
    if pdl:
        child = subprocess.run([sys.executable, __file__, "--kernel-times-json", "--calls", str(args.calls),
                                "--dtype", args.dtype, "--gates", args.gates, *args.configs], env={**os.environ, "FLASHGDN_PDL": "0"}, check=True,
                               capture_output=True, text=True)
        times = json.loads(child.stdout.strip().splitlines()[-1])
    for spec in args.configs:
        whole_us = 1000 * time_graph(call_of(spec))
        per_kernel = times[spec] if pdl else kernel_times(spec, args.calls)
        total_us = sum(us for us, _ in per_kernel.values())
        print(f"{spec}: whole call {whole_us:.1f} us (graph, PDL {'on' if pdl else 'off'}), kernels {total_us:.1f} us"
              f" (PDL off), rest {whole_us - total_us:.1f} us")
        for name, (us, launches) in sorted(per_kernel.items(), key=lambda kv: -kv[1][0]):
            print(f"    {us:8.1f} us  {name} (x{launches:g})")


if __name__ == "__main__":
    main()
