"""Physical floors of one call (torch-free): the time it would take if it did nothing but move its
bytes at the measured copy bandwidth (memory floor) or nothing but its GEMMs at the measured bf16
GEMM rate (tensor-core floor). A kernel cannot beat max(memory, tensor-core); the benchmark prints
floor_fraction = max(floors) / time.

Notation: T tokens, N sequences of lengths n_i, chunks = sum(ceil(n_i / C)), C = 64, D = K = V = 128,
Hqk q/k heads, Hv v-heads; bf16 = 2 bytes, fp32 = 4 bytes; 2 FLOPs per multiply-add. The formulas
are the ones of the records in bench/results/ since 0aab96f (keep them, so records stay comparable).
"""

from __future__ import annotations

from .configs import C, D


def chunk_count(lengths: list[int]) -> int:
    return sum((n + C - 1) // C for n in lengths)


def forward_bytes(lengths: list[int], hqk: int, hv: int) -> int:
    """read q, k [T,Hqk,D] bf16, v [T,Hv,D] bf16, g, beta [T,Hv] fp32, h0 [N,Hv,D,D] fp32;
    write o [T,Hv,D] bf16, final state [N,Hv,D,D] fp32:
        bytes = T * (2*Hqk*D*2 + 2*Hv*D*2 + 2*Hv*4) + 2 * N*Hv*D*D*4"""
    T, N = sum(lengths), len(lengths)
    return T * (2 * hqk * D * 2 + 2 * hv * D * 2 + 2 * hv * 4) + 2 * N * hv * D * D * 4


def forward_flops(lengths: list[int], hqk: int, hv: int) -> int:
    """GEMMs of the chunked forward per (chunk, v-head), every product counted once:
    K Kᵀ and Q Kᵀ (C x C x D each), K S and Q S (C x D x D each), Ag W and P Vd (C x C x D each),
    Kᵀ (ρ ⊙ Vd) (D x C x D):
        flops = chunks * Hv * 2 * (4*C*C*D + 3*C*D*D)          (~10.5 MFLOP per chunk-head)
    Leaves out the chunk inverse A_r (a triangular solve) and everything elementwise."""
    del hqk  # the q/k work is counted per v-head, as the kernels do it
    return chunk_count(lengths) * hv * 2 * (4 * C * C * D + 3 * C * D * D)


def backward_bytes(lengths: list[int], hqk: int, hv: int) -> int:
    """read q, k [T,Hqk,D] bf16, v, dO [T,Hv,D] bf16, g, beta [T,Hv] fp32, h0, dht [N,Hv,D,D] fp32;
    write dq, dk [T,Hqk,D] bf16, dv [T,Hv,D] bf16, dg, dbeta [T,Hv] fp32, dh0 [N,Hv,D,D] fp32:
        bytes = T * (4*Hqk*D*2 + 3*Hv*D*2 + 4*Hv*4) + 3 * N*Hv*D*D*4"""
    T, N = sum(lengths), len(lengths)
    return T * (4 * hqk * D * 2 + 3 * hv * D * 2 + 4 * hv * 4) + 3 * N * hv * D * D * 4


def backward_flops(lengths: list[int], hqk: int, hv: int) -> int:
    """GEMMs of the chunked backward (src/reference/backward_chunked.cpp) per (chunk, v-head):
      recompute   K Kᵀ, Q Kᵀ, Ag W                                   3 x C·C·D
                  K S, Kᵀ (ρ ⊙ Vd) of the state pre-pass               2 x C·D·D
      gradients   Pgᵀ dO, dO Vdᵀ, Agᵀ dVd, dVd Wᵀ, dP K, dPᵀ Q,
                  (dM + dMᵀ) K                                         7 x C·C·D
                  K dS, dO Sᵀ, Vd dSᵀ, dU Sᵀ, Kᵀ dU, Qᵀ (Γ dO)          6 x C·D·D
                  A_rᵀ dA_r A_rᵀ                                        2 x C·C·C
        flops = chunks * Hv * 2 * (10*C*C*D + 8*C*D*D + 2*C**3)       (~28.3 MFLOP per chunk-head)"""
    del hqk
    return chunk_count(lengths) * hv * 2 * (10 * C * C * D + 8 * C * D * D + 2 * C ** 3)


def floors_ms(direction: str, lengths: list[int], hqk: int, hv: int, bandwidth: float, flops_rate: float
              ) -> tuple[float, float]:
    """(memory floor, tensor-core floor) in ms of one call of `direction`:
        memory floor = bytes / bandwidth,   tensor-core floor = FLOPs / flops_rate
    bandwidth in bytes/s (measured copy: bytes read + written per second), flops_rate in FLOP/s (measured
    bf16 GEMM). fwdbwd = fwd + bwd (each call's floors added; the forward's inputs count twice, as a
    forward followed by a backward reads them twice)."""
    if direction not in ("fwd", "bwd", "fwdbwd"):
        raise ValueError(f"direction {direction!r}")
    bytes_, flops = 0, 0
    if direction in ("fwd", "fwdbwd"):
        bytes_ += forward_bytes(lengths, hqk, hv)
        flops += forward_flops(lengths, hqk, hv)
    if direction in ("bwd", "fwdbwd"):
        bytes_ += backward_bytes(lengths, hqk, hv)
        flops += backward_flops(lengths, hqk, hv)
    return bytes_ / bandwidth * 1e3, flops / flops_rate * 1e3
