"""Timing, ceilings and provenance of a benchmark run (torch, CUDA).

Timing (DESIGN §5): the whole call (all launches of one forward or backward) captured once in a CUDA
graph after warm-up calls and replayed; each replay timed with CUDA events; the median is reported.
Where a library cannot be captured (a host sync inside, say), the same median over plain calls timed
with CUDA events is reported instead, and the CSV's timing column says so.
"""

from __future__ import annotations

import os
import statistics
import subprocess

import torch


def median_events(run, replays: int, before=None) -> float:
    """Median over `replays` calls of run() timed with CUDA events (ms); before(), when given, runs
    untimed ahead of each call (e.g. a barrier across ranks)."""
    times = []
    for _ in range(replays):
        if before is not None:
            before()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def capture_graph(fn, warmup: int = 1):
    """(graph, outputs): a CUDA graph holding one call of fn, and that call's outputs (static tensors
    the replays overwrite). Warm-up calls run on a side stream first, so that lazy initialisation,
    compilation, autotuning and caches happen outside the capture."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = fn()
    return graph, outputs


def time_graph(fn, replays: int = 30, warmup: int = 2) -> float:
    """Median ms of one replay of a CUDA graph holding one call of fn (capture_graph)."""
    graph, _ = capture_graph(fn, warmup)
    graph.replay()
    try:
        return median_events(graph.replay, replays)
    finally:
        del graph


def time_events(fn, replays: int = 30, warmup: int = 2) -> float:
    """Median ms of plain calls of fn, each between two CUDA events, after warm-up calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    return median_events(fn, replays)


def time_call(fn, replays: int = 30, warmup: int = 2) -> tuple[float, str]:
    """(median ms, "graph" or "events"): CUDA-graph replay where the call can be captured, else events."""
    try:
        return time_graph(fn, replays, warmup), "graph"
    except Exception as exc:  # noqa: BLE001 - capture refused: fall back to events
        reason = type(exc).__name__
    try:
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - a failed capture may leave an error behind; the events run shows it
        pass
    return time_events(fn, replays, warmup), f"events ({reason} under graph capture)"


def _copy_rate() -> float:
    x = torch.randn(1 << 29, device="cuda")  # 2 GiB of fp32
    y = torch.empty_like(x)
    ms = time_graph(lambda: y.copy_(x), replays=10)
    return 2 * x.numel() * x.element_size() / (ms * 1e-3)


def _gemm_rate() -> float:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = time_graph(lambda: a @ b, replays=10)
    return 2 * 8192 ** 3 / (ms * 1e-3)


def measure_ceilings() -> tuple[float, float]:
    """(copy bandwidth in bytes/s counting read + write, bf16 GEMM rate in FLOP/s), measured here:
    a 2 GiB fp32 copy_ and an 8192^3 bf16 matmul, each the median of 10 graph replays."""
    bandwidth, rate = _copy_rate(), _gemm_rate()
    torch.cuda.empty_cache()
    return bandwidth, rate


def git_commit(root=None) -> str:
    """The commit measured: FLASHGDN_COMMIT (a device copy has no .git), else git's HEAD of the current
    directory (with -dirty when tracked files differ), else "unknown"."""
    if os.environ.get("FLASHGDN_COMMIT"):
        return os.environ["FLASHGDN_COMMIT"]
    try:
        cwd = str(root) if root else None
        head = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True, cwd=cwd,
                                       stderr=subprocess.DEVNULL).strip()
        dirty = subprocess.check_output(["git", "status", "--porcelain", "--untracked-files=no"], text=True,
                                        cwd=cwd, stderr=subprocess.DEVNULL).strip()
        return head + ("-dirty" if dirty else "")
    except Exception:  # noqa: BLE001
        return "unknown"


def versions(anchor_versions: dict[str, str]) -> str:
    """'flashgdn 0.1.0 torch 2.11.0+cu130 cuda 13.0 triton 3.6.0 fla 0.6.0 ...' for the CSV."""
    import flashgdn

    parts = [f"flashgdn {flashgdn.__version__}", f"torch {torch.__version__}", f"cuda {torch.version.cuda}"]
    try:
        import triton
        parts.append(f"triton {triton.__version__}")
    except Exception:  # noqa: BLE001
        pass
    parts += [f"{name} {v}" for name, v in anchor_versions.items() if v]
    return " ".join(parts)
