"""Float64 oracle, in torch on the GPU (fast enough for 32k tokens): the benchmark's accuracy columns
and the GPU tests (tests/gpu/oracle.py re-exports it; test_oracle_matches_reference and
test_oracle_backward_matches_reference check it against flashgdn's C++ float64 reference, itself
checked against the naive token recurrence to 1e-12 by the CPU tests). It evaluates the chunked
form of DESIGN §1 in float64 (backward_f64: its gradients by torch autograd).
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
    # Sequences and chunks are cut with unbind/split, not indexing, so that autograd's backward of
    # the cuts (backward_f64) is one concatenation rather than a full-size zero tensor per chunk.
    if cu_seqlens is None:
        seqs = list(zip(*(x.unbind(0) for x in (q, k, v, g, beta))))  # per sequence: [T, H, ...]
    else:
        offs = cu_seqlens.tolist()
        lengths = [offs[i + 1] - offs[i] for i in range(len(offs) - 1)] + [T - offs[-1]]
        seqs = list(zip(*(x[0].split(lengths) for x in (q, k, v, g, beta))))[:-1]  # drop the padding
    outs, finals = [], []
    eye = torch.eye(CHUNK, dtype=torch.float64, device=q.device)
    for n, seq in enumerate(seqs):
        if initial_state is None:
            S = torch.zeros(Hv, K, V, dtype=torch.float64, device=q.device)
        else:
            S = initial_state[n].double()
            if state_v_first:
                S = S.transpose(-1, -2)
            S = S.clone()
        Ts = seq[0].shape[0]
        o_seq = []
        for c, (Qc, Kc, Vc, gc, bc) in enumerate(zip(*(_chunks(x) for x in seq))):
            rows = min(CHUNK, Ts - c * CHUNK)
            gc = gc.cumsum(-1)  # [Hv, 64]
            L = torch.tril(bc.unsqueeze(-1) * (Kc @ Kc.transpose(-1, -2)), diagonal=-1)
            Ar = torch.linalg.solve_triangular(eye + L, eye.expand_as(L), upper=False, unitriangular=True)
            gamma = gc[:, -1]
            G = torch.tril(torch.exp(torch.tril(gc.unsqueeze(-1) - gc.unsqueeze(-2))))
            W = Vc - torch.exp(gc).unsqueeze(-1) * (Kc @ S)
            Vd = (G * Ar * bc.unsqueeze(-2)) @ W
            O = scale * (torch.exp(gc).unsqueeze(-1) * (Qc @ S) + (G * (Qc @ Kc.transpose(-1, -2))) @ Vd)
            S = torch.exp(gamma)[:, None, None] * S + Kc.transpose(-1, -2) @ (torch.exp(gamma.unsqueeze(-1) - gc).unsqueeze(-1) * Vd)
            o_seq.append(O[:, :rows].transpose(0, 1))
        outs.append(torch.cat(o_seq) if o_seq else v.new_zeros(0, Hv, V))
        finals.append(S)
    if cu_seqlens is None:
        o = torch.stack(outs)
    else:
        o = torch.cat(outs + [v.new_zeros(T - offs[-1], Hv, V)]).unsqueeze(0)  # padding tokens: 0
    return o, torch.stack(finals) if finals else torch.zeros(0, Hv, K, V, dtype=torch.float64, device=q.device)


def _chunks(x):
    """[T, H, ...] -> list of [H, CHUNK, ...], the last one zero padded."""
    out = []
    for piece in (x.split(CHUNK) if x.shape[0] > 0 else ()):
        piece = piece.transpose(0, 1)
        rows = piece.shape[1]
        if rows < CHUNK:
            pad = piece.new_zeros(piece.shape[0], CHUNK - rows, *piece.shape[2:])
            piece = torch.cat([piece, pad], dim=1)
        out.append(piece)
    return out


def backward_f64(q, k, v, g, beta, scale, do, dht=None, initial_state=None, cu_seqlens=None, use_qk_l2norm=False,
                 state_v_first=False):
    """Gradients of sum(o * do) + sum(final_state * dht) through forward_f64, by torch autograd in
    float64: (dq, dk, dv, dg, dbeta, dh0), each float64 and shaped like its input (dg w.r.t. the raw
    gate g; dq/dk summed over each group of value heads and through the L2 norm when use_qk_l2norm;
    dh0 in initial_state's layout, None without an initial state). dht is in initial_state's layout
    ([N,Hv,V,K] with state_v_first) or None (no gradient flows into the final state)."""
    leaves = [x.detach().double().requires_grad_(True) for x in (q, k, v, g, beta)]
    h0 = None if initial_state is None else initial_state.detach().double().requires_grad_(True)
    with torch.enable_grad():
        o, final = forward_f64(*leaves, scale, h0, cu_seqlens, use_qk_l2norm, state_v_first)
        loss = (o * do.detach().double()).sum()
        if dht is not None:
            d_final = dht.detach().double()
            if state_v_first:
                d_final = d_final.transpose(-1, -2)
            loss = loss + (final * d_final).sum()
        wrt = leaves + ([h0] if h0 is not None else [])
        grads = torch.autograd.grad(loss, wrt, allow_unused=True)
    grads = [torch.zeros_like(x) if d is None else d for x, d in zip(wrt, grads)]
    return tuple(grads[:5]) + (grads[5] if h0 is not None else None,)


def rel_l2(x, ref):
    x, ref = x.double(), ref.double()
    den = ref.norm()
    return ((x - ref).norm() / den).item() if den > 0 else (x - ref).norm().item()
