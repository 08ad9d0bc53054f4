"""Scaling of inter-GPU context parallelism (flashgdn.distributed) on one host: one sequence sharded
contiguously over N GPUs (one process each, NCCL, NVLink multicast off), forward and forward +
backward, beside the forward's exchange alone (the all-gather of every rank's [2, Hv, 128, 128] fp32
maps that the call makes; the backward adds an all-reduce of the final state's gradient and an
all-gather of the [Hv, 128, 128] gradients D).

  strong: the same T tokens on 1 and on N GPUs;  weak: T_rank tokens per GPU, N x T_rank in all.

Times are per call on rank 0 (CUDA events after a barrier, median of --replays after 2 warm-up
calls; collectives cannot be captured in a CUDA graph). CSV <date>_distributed_scaling_<commit>.csv:
gpus, mode, h_qk, h_v, tokens, tokens_per_gpu, fwd_ms, fwdbwd_ms, exchange_ms (empty: out of memory).

    python bench/distributed_scaling.py [--gpus N] [--replays 5] [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

import flashgdn  # noqa: E402
import flashgdn.distributed  # noqa: E402
from flashgdn.bench.timing import git_commit, median_events  # noqa: E402

# (mode, Hqk, Hv, tokens in all for strong / per GPU for weak)
CONFIGS = [("strong", 2, 8, 1 << 20), ("strong", 16, 64, 1 << 18), ("weak", 2, 8, 1 << 18), ("weak", 16, 64, 1 << 18)]


def shard_inputs(tokens, hqk, hv, rank, device):
    gen = torch.Generator(device=device).manual_seed(1000 + rank)
    q = torch.nn.functional.normalize(torch.randn(1, tokens, hqk, 128, device=device, generator=gen), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(1, tokens, hqk, 128, device=device, generator=gen), dim=-1)
    v = torch.randn(1, tokens, hv, 128, device=device, generator=gen)
    g = torch.nn.functional.logsigmoid(torch.randn(1, tokens, hv, device=device, generator=gen)) / 16
    beta = torch.sigmoid(torch.randn(1, tokens, hv, device=device, generator=gen))
    return dict(q=q.bfloat16(), k=k.bfloat16(), v=v.bfloat16(), g=g, beta=beta)


def median_ms(fn, replays):
    for _ in range(2):
        fn()
    return median_events(fn, replays, before=lambda: (dist.barrier(), torch.cuda.synchronize()))


def worker(rank, world, port, replays, out_path):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300))
    device = f"cuda:{rank}"
    rows = []
    try:
        for mode, hqk, hv, tokens in CONFIGS:
            total = tokens if mode == "strong" else tokens * world
            per_gpu = total // world
            row = [world, mode, hqk, hv, total, per_gpu, "", "", ""]
            try:
                x = shard_inputs(per_gpu, hqk, hv, rank, device)
                call = flashgdn.distributed.chunk_gated_delta_rule

                def forward():
                    with torch.no_grad():
                        call(**x, output_final_state=True)

                leaves = {n: t.clone().requires_grad_(True) for n, t in x.items()}
                do = torch.randn_like(x["v"])

                def forward_backward():
                    o, _ = call(**leaves, output_final_state=True)
                    o.backward(do)

                maps = torch.zeros(2, hv, 128, 128, device=device)
                gathered = [torch.empty_like(maps) for _ in range(world)]
                row[6] = f"{median_ms(forward, replays):.3f}"
                row[7] = f"{median_ms(forward_backward, replays):.3f}"
                row[8] = f"{median_ms(lambda: dist.all_gather(gathered, maps), replays):.3f}" if world > 1 else "0"
                del x, leaves, do, maps, gathered
            except torch.cuda.OutOfMemoryError:
                pass
            # every rank agrees on whether the row ran (a rank out of memory would desynchronise collectives)
            ok = torch.tensor([0 if row[6] == "" else 1], device=device)
            dist.all_reduce(ok, op=dist.ReduceOp.MIN)
            if ok.item() == 0:
                row[6:9] = ["", "", ""]
            torch.cuda.empty_cache()
            if rank == 0:
                rows.append(row)
                print(f"{world} GPU(s) {mode:6} ({hqk:2},{hv:2}) {total:8d} tokens: fwd {row[6] or 'oom':>8} ms  "
                      f"fwd+bwd {row[7] or 'oom':>8} ms  exchange {row[8] or '-':>7} ms", flush=True)
        if rank == 0:
            with open(out_path, "a") as f:
                f.writelines(",".join(str(v) for v in row) + "\n" for row in rows)
    finally:
        dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=torch.cuda.device_count())
    parser.add_argument("--replays", type=int, default=5)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = parser.parse_args()
    path = pathlib.Path(args.out) / f"{datetime.date.today()}_distributed_scaling_{git_commit()}.csv"
    path.write_text("gpus,mode,h_qk,h_v,tokens,tokens_per_gpu,fwd_ms,fwdbwd_ms,exchange_ms\n")
    counts = sorted({1, *(n for n in (2, 4, 8) if n <= args.gpus)})
    for world in counts:  # 1 GPU first: the baseline of both scalings
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.start_processes(worker, args=(world, port, args.replays, str(path)), nprocs=world, join=True,
                           start_method="spawn")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
