"""Inter-GPU context parallelism: a batch of sequences sharded contiguously along the tokens over
the ranks of a torch.distributed process group (rank r holds tokens [t_r, t_{r+1}) of every
sequence; shard lengths may differ).

Over its shard, the gated delta rule is an affine map of the entering state:

    S_end = M_r S_start + E_r,   M_r = prod_t e^{g_t} (I - beta_t k_t k_t^T)   [K, K],

E_r the shard's end state from a zero start. Forward, in two phases on one workspace
(flashgdn::ShardPhase): phase 1 (chunk inverse, decay windows, the state pass over the shard's
segments, cp_shard_maps) gives E_r and M_r, M_r exact or zero where the shard forgets its entering
state below e^{decay_threshold}; the ranks all-gather the maps and each forms its entering state
with the serial scan

    S_0 = initial_state (or 0),   S_{j+1} = E_j + M_j S_j;

phase 2 (the correction from S_r and the main pass) reuses phase 1's inverse and segment states,
so a rank does about the work of one intra-card CP forward on its shard. The final state comes
from the maps, without a second exchange.

Backward (autograd, _ShardedRule): the gradient leaving shard r is the reverse scan

    dS_out_{R-1} = dht (summed over ranks),   dS_out_{j-1} = M_j^T dS_out_j + D_j,

D_j = the gradient reaching shard j's entering state from its own o alone (the backward with
dht = 0, which does not depend on the states). Also in two phases on one workspace: phase 1
(chunk inverse, windows, the forward state pass, the dS* pass over the shard's segments,
cp_grad_shard_maps) gives D_r; the ranks all-gather the D's; phase 2 (the forward correction
from S_r, the pass that saves the chunk states, the reverse correction from dS_out_r, the fused
backward) gives the shard's input gradients (and, on rank 0, the initial state's). Overlapping
the exchanges with the shard's state-free work is planned.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from .ops import _check_inputs, _grad_outputs, backward_into, chunk_gated_delta_rule as _local_rule, forward_into


def chunk_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                           scale: Optional[float] = None, initial_state: Optional[torch.Tensor] = None,
                           output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
                           group: Optional[dist.ProcessGroup] = None):
    """flashgdn.chunk_gated_delta_rule for sequences sharded over `group` (default: the world).

    Every rank passes its shard, [B, T_r, H, D] like the single-GPU call (B and the heads equal on
    all ranks, T_r its own), and the same scale, flags and initial_state [B, Hv, K, V] (fp32; the
    state entering rank 0's shard). Returns (o of the shard, the state after the whole sequence or
    None); the final state is the same tensor on every rank. Every rank must make the call (it
    communicates), with the same output_final_state, and, when gradients are needed, run the
    backward of the call (its backward communicates too: run it on every rank, in the same order
    of calls); the final state's gradient is summed over the ranks.
    """
    _check_inputs(q, k, v, g, beta, initial_state, None)
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    options = dict(scale=scale, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
    if world == 1:
        return _local_rule(q, k, v, g, beta, initial_state=initial_state, output_final_state=output_final_state,
                           **options)
    B, K, Hv, V = q.shape[0], q.shape[3], v.shape[2], v.shape[3]
    if K != V:
        raise ValueError(f"v: the transition M [K, K] travels beside E [K, V], which needs K == V; got K={K}, "
                         f"V={V}")
    if initial_state is not None and tuple(initial_state.shape) != (B, Hv, K, V):
        raise ValueError(f"initial_state: expected shape {(B, Hv, K, V)}, got {tuple(initial_state.shape)}")
    if initial_state is not None and initial_state.dtype != torch.float32:
        raise ValueError(f"initial_state: the sharded call takes fp32 states, got {initial_state.dtype}")
    scale = float(K ** -0.5 if scale is None else scale)
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (q, k, v, g, beta, initial_state))
    if not needs_grad:
        o, final, _, _ = _two_phase_forward(q, k, v, g, beta, scale, initial_state, use_qk_l2norm_in_kernel,
                                            group, rank, world)
        return o, (final if output_final_state else None)
    o, final = _ShardedRule.apply(q, k, v, g, beta, initial_state, scale, use_qk_l2norm_in_kernel, group)
    return o, (final if output_final_state else None)


@torch.no_grad()
def _two_phase_forward(q, k, v, g, beta, scale: float, initial_state, use_qk_l2norm_in_kernel, group, rank: int,
                       world: int):
    """Phase 1 (maps), one all-gather, the scan, phase 2. Returns (o, the final state after all
    shards, the state entering this shard (None: zero), every rank's M [world, B, Hv, K, K])."""
    B, Hv, K = q.shape[0], v.shape[2], q.shape[3]
    options = dict(scale=scale, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
    maps = torch.empty(2 * B, Hv, K, K, dtype=torch.float32, device=q.device)
    workspace = forward_into(None, None, q, k, v, g, beta, None, None, shard_phase=1, shard_maps=maps, **options)
    gathered = torch.empty(world, 2 * B, Hv, K, K, dtype=torch.float32, device=q.device)
    dist.all_gather(list(gathered.unbind(0)), maps, group=group)
    # S_{j+1} = E_j + M_j S_j, in float64 (whatever the TF32 setting); rank r enters its shard with S_r
    state = None if initial_state is None else initial_state.double()
    entering = None
    for j in range(world):
        if j == rank and state is not None:
            entering = state.float()
        e_j = gathered[j, :B].double()
        state = e_j if state is None else e_j + gathered[j, B:].double() @ state
    state = state.float()
    o = torch.empty_like(v)
    forward_into(o, None, q, k, v, g, beta, entering, None, shard_phase=2, workspace=workspace, **options)
    return o, state, entering, gathered[:, B:]


class _ShardedRule(torch.autograd.Function):
    """The sharded call with its exchange-aware backward (see the module text)."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta, initial_state, scale, use_qk_l2norm_in_kernel, group):
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        o, final, entering, transitions = _two_phase_forward(q, k, v, g, beta, scale, initial_state,
                                                             use_qk_l2norm_in_kernel, group, rank, world)
        ctx.save_for_backward(q, k, v, g, beta, entering, transitions)
        ctx.options = dict(scale=scale, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
        ctx.group, ctx.rank, ctx.world = group, rank, world
        ctx.has_initial_state = initial_state is not None
        return o, final

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do, dfinal):
        q, k, v, g, beta, entering, transitions = ctx.saved_tensors
        group, rank, world = ctx.group, ctx.rank, ctx.world
        scale, l2norm = ctx.options["scale"], ctx.options["use_qk_l2norm_in_kernel"]
        B, Hv, K, V = q.shape[0], v.shape[2], q.shape[3], v.shape[3]
        do = torch.zeros_like(v) if do is None else do.contiguous()
        # Every rank returned the same final state: its gradient is the sum of the ranks' gradients.
        dht = torch.zeros(B, Hv, K, V, dtype=torch.float32, device=q.device)
        if dfinal is not None:
            dht.copy_(dfinal)  # contiguous fp32 whatever the incoming gradient's layout
        dist.all_reduce(dht, group=group)
        if entering is None:  # rank 0 without an initial state: the shard starts at zero
            entering = torch.zeros(B, Hv, K, V, dtype=torch.float32, device=q.device)
        # Phase 1: D_r, the gradient reaching this shard's entering state from its own o
        own = torch.empty(B, Hv, K, V, dtype=torch.float32, device=q.device)
        workspace = backward_into(None, None, None, None, None, None, q, k, v, g, beta, do, None, None, None, scale,
                                  l2norm, shard_phase=1, shard_grad=own)
        reaching = torch.empty(world, B, Hv, K, V, dtype=torch.float32, device=q.device)
        dist.all_gather(list(reaching.unbind(0)), own, group=group)
        d_out = dht.double()  # dS_out_{j-1} = M_j^T dS_out_j + D_j, from the last shard back, in float64
        for j in range(world - 1, rank, -1):
            d_out = transitions[j].double().transpose(-1, -2) @ d_out + reaching[j].double()
        # Phase 2: the shard's backward from S_r and dS_out_r
        dq, dk, dv, dg, dbeta, dh0 = _grad_outputs(q, k, v, g, beta, entering)
        backward_into(dq, dk, dv, dg, dbeta, dh0, q, k, v, g, beta, do, d_out.float().contiguous(), entering, None, scale,
                      l2norm, shard_phase=2, workspace=workspace)
        d_initial = None
        if ctx.has_initial_state:
            d_initial = dh0 if rank == 0 else torch.zeros_like(dh0)
        return dq, dk, dv, dg, dbeta, d_initial, None, None, None
