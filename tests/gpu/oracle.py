"""Float64 oracle for the GPU tests, in torch on the GPU (fast enough for 32k tokens).

It evaluates the chunked form of DESIGN §1 in float64; test_oracle_matches_reference checks it
against flashgdn's C++ float64 reference (itself checked against the naive token recurrence to
1e-12 by the CPU tests), so the chain of trust ends at the naive recurrence.
"""

import torch

CHUNK = 64


def l2norm(x):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def forward_f64(q, k, v, g, beta, scale, initial_state=None, cu_seqlens=None, use_qk_l2norm=False,
                state_v_first=False):
    """Returns (o [B,T,Hv,V] float64, final_state [N,Hv,K,V] float64, K-by-V layout)."""
    q, k, v, g, beta = (x.double() for x in (q, k, v, g, beta))
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    B, T, Hqk, K = q.shape
    Hv, V = v.shape[2], v.shape[3]
    group = Hv // Hqk
    q = q.repeat_interleave(group, dim=2)
    k = k.repeat_interleave(group, dim=2)
    if cu_seqlens is None:
        spans = [(b, 0, T) for b in range(B)]
    else:
        offs = cu_seqlens.tolist()
        spans = [(0, offs[i], offs[i + 1]) for i in range(len(offs) - 1)]
    o = torch.zeros(B, T, Hv, V, dtype=torch.float64, device=q.device)
    finals = []
    eye = torch.eye(CHUNK, dtype=torch.float64, device=q.device)
    for n, (b, bos, eos) in enumerate(spans):
        if initial_state is None:
            S = torch.zeros(Hv, K, V, dtype=torch.float64, device=q.device)
        else:
            S = initial_state[n].double()
            if state_v_first:
                S = S.transpose(-1, -2)
            S = S.clone()
        for t0 in range(bos, eos, CHUNK):
            rows = min(CHUNK, eos - t0)

            def chunk(x):  # [rows, Hv, D] -> [Hv, 64, D] zero padded
                x = x[b, t0:t0 + rows].transpose(0, 1)
                pad = torch.zeros(x.shape[0], CHUNK - rows, *x.shape[2:], dtype=x.dtype, device=x.device)
                return torch.cat([x, pad], dim=1)

            Kc, Qc, Vc = chunk(k), chunk(q), chunk(v)
            gc = chunk(g.unsqueeze(-1)).squeeze(-1).cumsum(-1)   # [Hv, 64]
            bc = chunk(beta.unsqueeze(-1)).squeeze(-1)             # [Hv, 64]
            L = torch.tril(bc.unsqueeze(-1) * (Kc @ Kc.transpose(-1, -2)), diagonal=-1)
            Ar = torch.linalg.solve_triangular(eye + L, eye.expand_as(L), upper=False, unitriangular=True)
            gamma = gc[:, -1]
            G = torch.tril(torch.exp(torch.tril(gc.unsqueeze(-1) - gc.unsqueeze(-2))))
            W = Vc - torch.exp(gc).unsqueeze(-1) * (Kc @ S)
            Vd = (G * Ar * bc.unsqueeze(-2)) @ W
            O = scale * (torch.exp(gc).unsqueeze(-1) * (Qc @ S) + (G * (Qc @ Kc.transpose(-1, -2))) @ Vd)
            S = torch.exp(gamma)[:, None, None] * S + Kc.transpose(-1, -2) @ (torch.exp(gamma.unsqueeze(-1) - gc).unsqueeze(-1) * Vd)
            o[b, t0:t0 + rows] = O[:, :rows].transpose(0, 1)
        finals.append(S)
    return o, torch.stack(finals) if finals else torch.zeros(0, Hv, K, V, dtype=torch.float64, device=q.device)


def rel_l2(x, ref):
    x, ref = x.double(), ref.double()
    den = ref.norm()
    return ((x - ref).norm() / den).item() if den > 0 else (x - ref).norm().item()
