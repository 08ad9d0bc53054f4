"""A GDN forward on a real problem through the PyTorch API: 2 x 8192 tokens packed, (Hqk, Hv) =
(16, 32) as in Qwen3.5 35B/9B/4B, bf16, initial state in, final state out. Checks one v-head of
the first sequence against flashgdn's float64 reference (CPU tensors run the reference).

    pip install . && python examples/forward.py        (needs torch and an SM90 GPU)
"""

import torch
import torch.nn.functional as F

import flashgdn


def main():
    if not torch.cuda.is_available():
        raise SystemExit("examples/forward.py needs a CUDA device (SM90); the C++ example "
                         "build/examples/gdn_forward runs the reference on a CPU-only machine")
    torch.manual_seed(0)
    lengths, hqk, hv, d = [8192, 8192], 16, 32, 128
    T = sum(lengths)
    cu = torch.tensor([0, lengths[0], T], dtype=torch.int32, device="cuda")
    q = F.normalize(torch.randn(1, T, hqk, d, device="cuda"), dim=-1).bfloat16()
    k = F.normalize(torch.randn(1, T, hqk, d, device="cuda"), dim=-1).bfloat16()
    v = torch.randn(1, T, hv, d, device="cuda").bfloat16()
    g = F.logsigmoid(torch.randn(1, T, hv, device="cuda")) / 16
    beta = torch.sigmoid(torch.randn(1, T, hv, device="cuda"))
    h0 = torch.randn(len(lengths), hv, d, d, device="cuda")

    o, final = flashgdn.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                               cu_seqlens=cu)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        flashgdn.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu)
    end.record()
    end.synchronize()
    print(f"flashgdn {flashgdn.__version__}: o {tuple(o.shape)} {o.dtype}, final state {tuple(final.shape)}, "
          f"{start.elapsed_time(end) / 10:.3f} ms per call")

    n = 2048  # the reference on the first 2048 tokens of sequence 0, v-head 0
    ref_o, ref_state = flashgdn.chunk_gated_delta_rule(
        q[:, :n, :1].cpu().float(), k[:, :n, :1].cpu().float(), v[:, :n, :1].cpu().float(),
        g[:, :n, :1].cpu(), beta[:, :n, :1].cpu(), initial_state=h0[:1, :1].cpu(), output_final_state=True)
    sub_o, _ = flashgdn.chunk_gated_delta_rule(q[:, :n, :1], k[:, :n, :1], v[:, :n, :1], g[:, :n, :1],
                                               beta[:, :n, :1], initial_state=h0[:1, :1], output_final_state=True)
    err = ((sub_o.cpu().float() - ref_o).norm() / ref_o.norm()).item()
    print(f"relative L2 error of o against the float64 reference (2048 tokens, one head): {err:.2e}")
    if not err < 5e-3:
        raise SystemExit("error above the 0.5% bar")


if __name__ == "__main__":
    main()
