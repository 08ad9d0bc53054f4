"""Forward benchmark: DESIGN §5's table on the H200, flashgdn beside FLA (Triton) in one process.

Each row: whole-call time by CUDA-graph replay (median of many replays), the memory floor (bytes
of inputs and outputs over the measured copy bandwidth) and the tensor-core floor (FLOPs of the
chunked algorithm over the measured bf16 GEMM rate), FlashQLA's published numbers beside them, and
the relative L2 error of each library against the float64 oracle on one sampled v-head.

    python bench/bench_forward.py [--quick] [--out DIR] [--filter hv=32]
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import pathlib
import statistics
import subprocess
import sys

import torch
import torch.nn.functional as F

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "gpu"))

import flashgdn  # noqa: E402
from oracle import forward_f64, rel_l2  # noqa: E402

HEADS = [("397B/122B TP8", 2, 8), ("397B/122B TP4", 4, 16), ("397B/122B TP2", 8, 32), ("397B/122B TP1", 16, 64),
         ("35B/9B/4B TP1", 16, 32), ("27B TP2", 8, 24), ("27B TP1", 16, 48), ("2B/0.8B TP1", 16, 16),
         ("Sym h32", 32, 32)]
MIXES = ["1x32768", "1x16384", "1x8192", "1x4096", "1x2048", "28672+4096", "24576+8192", "16384+16384",
         "8192+24576", "4096+28672", "12288+4096", "4096+4096", "6144+2048", "2048+6144", "1024+7168",
         "8192x4", "4096x8", "2048x4", "1024x8"]
QUICK_MIXES = ["1x32768", "1x8192", "16384+16384", "8192x4", "1024x8"]
QUICK_HEADS = [HEADS[0], HEADS[2], HEADS[4]]


def lengths_of(mix: str) -> list[int]:
    """'1x32768': one sequence of 32768; '8192x4': four of 8192; '28672+4096': two sequences."""
    if "+" in mix:
        return [int(x) for x in mix.split("+")]
    a, b = (int(x) for x in mix.split("x"))
    return [b] if a == 1 else [a] * b


def published() -> dict:
    table = {}
    path = ROOT / "bench" / "flashqla_published_h200.csv"  # copy of ../shared/data (see bench/notes.md)
    if path.is_file():
        with open(path) as f:
            for row in csv.DictReader(f):
                table[(row["direction"], row["seqlens"], int(row["h_qk"]), int(row["h_v"]))] = row
    return table


def make_inputs(lengths, hqk, hv, device="cuda"):
    """DESIGN §5 / FlashQLA's recipe: packed varlen, 25% of v-heads with g == 0."""
    T, K = sum(lengths), 128
    q = F.normalize(torch.randn(1, T, hqk, K, device=device), dim=-1).bfloat16()
    k = F.normalize(torch.randn(1, T, hqk, K, device=device), dim=-1).bfloat16()
    v = torch.randn(1, T, hv, K, device=device).bfloat16()
    g = F.logsigmoid(torch.randn(1, T, hv, device=device)) / 16
    g[:, :, torch.randperm(hv, device=device)[: hv // 4]] = 0
    beta = torch.sigmoid(torch.randn(1, T, hv, device=device))
    h0 = torch.randn(len(lengths), hv, K, K, device=device)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32, device=device)
    return dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0), cu


def time_graph(fn, replays=30) -> float:
    """Median milliseconds of one replay of a CUDA graph holding one call of fn."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def measure_ceilings() -> tuple[float, float]:
    """Copy bandwidth (bytes/s, read + write) and bf16 GEMM rate (FLOP/s), measured here."""
    x = torch.randn(1 << 29, device="cuda")  # 2 GiB of fp32
    y = torch.empty_like(x)
    ms = time_graph(lambda: y.copy_(x), replays=10)
    bandwidth = 2 * x.numel() * x.element_size() / (ms * 1e-3)
    del x, y
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = time_graph(lambda: a @ b, replays=10)
    return bandwidth, 2 * 8192**3 / (ms * 1e-3)


def floors(lengths, hqk, hv, bandwidth, flops_rate) -> tuple[float, float]:
    T, N, D = sum(lengths), len(lengths), 128
    bytes_ = T * (2 * hqk * D * 2 + 2 * hv * D * 2 + 2 * hv * 4) + 2 * N * hv * D * D * 4
    chunks = sum((n + 63) // 64 for n in lengths)
    # per chunk-head: KK^T, QK^T (64x64x128), K.S and Q.S (64x128x128), Ag.W and P.Vd (64x64x128),
    # K^T.Vd (128x64x128)
    flops = chunks * hv * 2 * (2 * 64 * 64 * D + 2 * 64 * D * D + 2 * 64 * 64 * D + D * 64 * D)
    return bytes_ / bandwidth * 1e3, flops / flops_rate * 1e3


def load_fla():
    os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk
        return fla_chunk
    except Exception as exc:  # noqa: BLE001 - report any reason the anchor cannot run
        print(f"FLA not available: {exc!r}")
        return None


def commit() -> str:
    """The commit measured: FLASHGDN_COMMIT (the device copy has no .git), else git's HEAD."""
    if os.environ.get("FLASHGDN_COMMIT"):
        return os.environ["FLASHGDN_COMMIT"]
    try:
        head = subprocess.check_output(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], text=True,
                                       stderr=subprocess.DEVNULL).strip()
        dirty = subprocess.check_output(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                                        text=True, stderr=subprocess.DEVNULL).strip()
        return head + ("-dirty" if dirty else "")
    except Exception:  # noqa: BLE001
        return "unknown"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a subset of the sequence mixes")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    parser.add_argument("--filter", default="", help="e.g. hv=32 or mix=1x32768")
    args = parser.parse_args()

    torch.manual_seed(0)
    bandwidth, flops_rate = measure_ceilings()
    print(f"measured ceilings: copy {bandwidth / 1e12:.2f} TB/s, bf16 GEMM {flops_rate / 1e12:.0f} TFLOP/s")
    fla_chunk = load_fla()
    pub = published()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.date.today().isoformat()
    path = out / f"{stamp}_forward_{commit()}{'_quick' if args.quick else ''}.csv".replace("+", "_")
    writer = None
    csv_file = open(path, "w", newline="")  # written row by row: an interrupted run keeps its rows
    device, sha = torch.cuda.get_device_name(), commit()
    mixes = QUICK_MIXES if args.quick else MIXES
    for model, hqk, hv in (QUICK_HEADS if args.quick else HEADS):
        for mix in mixes:
            if args.filter:
                key, value = args.filter.split("=")
                if {"hv": str(hv), "hqk": str(hqk), "mix": mix}.get(key) != value:
                    continue
            lengths = lengths_of(mix)
            x, cu = make_inputs(lengths, hqk, hv)
            scale = 128 ** -0.5
            ours = lambda: flashgdn.chunk_gated_delta_rule(**x, scale=scale, cu_seqlens=cu, output_final_state=True)
            t_ours = time_graph(ours)
            o_ours, _ = ours()
            # oracle on v-head 0 (its q/k head is 0) of the first sequence
            n0 = lengths[0]
            head = dict(q=x["q"][:, :n0, :1], k=x["k"][:, :n0, :1], v=x["v"][:, :n0, :1], g=x["g"][:, :n0, :1],
                        beta=x["beta"][:, :n0, :1], initial_state=x["initial_state"][:1, :1])
            ref_o, _ = forward_f64(**head, scale=scale)
            err_ours = rel_l2(o_ours[:, :n0, :1], ref_o)
            t_fla = err_fla = None
            if fla_chunk is not None:
                cu64 = cu.long()
                fla = lambda: fla_chunk(**x, scale=scale, cu_seqlens=cu64, output_final_state=True)
                try:
                    t_fla = time_graph(fla)
                    o_fla, _ = fla()
                    err_fla = rel_l2(o_fla[:, :n0, :1], ref_o)
                except Exception as exc:  # noqa: BLE001
                    print(f"FLA failed on {mix} ({hqk},{hv}): {exc!r}")
            mem_ms, tc_ms = floors(lengths, hqk, hv, bandwidth, flops_rate)
            p = pub.get(("fwd", mix, hqk, hv), {})
            row = dict(direction="fwd", model=model, seqlens=mix, h_qk=hqk, h_v=hv, tokens=sum(lengths),
                       flashgdn_ms=round(t_ours, 4), fla_ms=None if t_fla is None else round(t_fla, 4),
                       flashqla_published_ms=p.get("flashqla_ms"), flashinfer_published_ms=p.get("flashinfer_ms"),
                       fla_published_ms=p.get("fla_ms"), memory_floor_ms=round(mem_ms, 4),
                       tensor_floor_ms=round(tc_ms, 4), floor_fraction=round(max(mem_ms, tc_ms) / t_ours, 3),
                       err_flashgdn=f"{err_ours:.2e}", err_fla=None if err_fla is None else f"{err_fla:.2e}")
            row.update(commit=sha, device=device)
            if writer is None:
                writer = csv.DictWriter(csv_file, fieldnames=list(row.keys()))
                writer.writeheader()
            writer.writerow(row)
            csv_file.flush()
            print(f"{model:16s} {hqk:2d}/{hv:2d} {mix:12s} ours {t_ours:7.3f} ms  fla "
                  f"{'-' if t_fla is None else f'{t_fla:7.3f}'} ms  flashqla(pub) {p.get('flashqla_ms', '-')}  "
                  f"floor {max(mem_ms, tc_ms):.3f} ms  err {err_ours:.1e}/{'-' if err_fla is None else f'{err_fla:.1e}'}",
                  flush=True)
            del x, cu
    csv_file.close()
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
