"""Inter-GPU context parallelism: a batch of sequences sharded contiguously along the tokens over
the ranks of a torch.distributed process group (rank r holds tokens [t_r, t_{r+1}) of every
sequence; shard lengths may differ).

Over its shard, the gated delta rule is an affine map of the entering state:

    S_end = M_r S_start + E_r,   M_r = prod_t e^{g_t} (I - beta_t k_t k_t^T)   [K, K],

E_r the shard's end state from a zero start. Each rank computes E_r (a forward from zero) and M_r
(a forward with V = 0 from the identity: its end state is M_r I = M_r), the ranks exchange them
(one all-reduce over a [world, 2, B, Hv, K, V] stack, which works on every backend: NCCL, and
gloo on CPU or CUDA tensors), and rank r forms its true entering state with the serial scan

    S_0 = initial_state (or 0),   S_{j+1} = E_j + M_j S_j,

then runs its shard from S_r. The result is exact (the same algebra as intra-card CP with every
head taking the exact-transition path), and differentiable: autograd flows through the three
flashgdn calls and the all-reduces (torch.distributed.nn), so the backward runs the same exchange
in reverse.

Without gradients (inference, prefill: no input requires grad, or grad mode off) a rank runs its
shard in two phases on one workspace (flashgdn::ShardPhase): phase 1 (chunk inverse, decay
windows, the state pass over the shard's segments, cp_shard_maps) gives E_r and M_r, M_r exact or
zero where the shard forgets its entering state below e^{decay_threshold}; the ranks all-gather
the maps; phase 2 (the correction from S_r and the main pass) reuses phase 1's inverse and
segment states, so a rank does the work of one intra-card CP forward on its shard, and the final
state comes from the maps without a second exchange. With gradients, E_r and M_r come from two
differentiable forward calls (M_r as the end state of V = 0 from the identity) and the shard from
a third, so that autograd can run the exchange in reverse; the two-phase backward is planned
(docs/kernel_plan.md), as is overlapping the exchange with the shard's state-free work.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn

from .ops import _check_inputs, chunk_gated_delta_rule as _local_rule, forward_into


def _stack_over_ranks(x: torch.Tensor, group, rank: int, world: int) -> torch.Tensor:
    """[world, *x.shape]: every rank's x on every rank (differentiable; exact: x plus zeros)."""
    parts = [x if i == rank else torch.zeros_like(x) for i in range(world)]
    return dist_nn.all_reduce(torch.stack(parts), op=dist.ReduceOp.SUM, group=group)


class _Tie(torch.autograd.Function):
    """x, unchanged; its backward also hands zero gradients to `others`. Every rank ties its o to the
    exchanged stacks, so that each exchange's backward all-reduce runs on every rank, also where the
    rank's own math leaves a stack unused (rank 0 uses no other rank's map, no rank uses the last
    one's): collectives must be called by all ranks, in the same order."""

    @staticmethod
    def forward(ctx, x, *others):
        ctx.specs = [(t.shape, t.dtype, t.device) for t in others]
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return (grad, *(torch.zeros(shape, dtype=dtype, device=device) for shape, dtype, device in ctx.specs))


def chunk_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                           scale: Optional[float] = None, initial_state: Optional[torch.Tensor] = None,
                           output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
                           group: Optional[dist.ProcessGroup] = None):
    """flashgdn.chunk_gated_delta_rule for sequences sharded over `group` (default: the world).

    Every rank passes its shard, [B, T_r, H, D] like the single-GPU call (B and the heads equal on
    all ranks, T_r its own), and the same scale, flags and initial_state [B, Hv, K, V] (fp32; the
    state entering rank 0's shard). Returns (o of the shard, the state after the whole sequence or
    None); the final state is the same tensor on every rank. Every rank must make the call (it
    communicates), with the same output_final_state and the same inputs requiring gradients, and
    backpropagate through its o (the backward all-reduces hang on that rank's o; a rank whose
    exchanged maps need no gradient records no backward all-reduce).
    """
    _check_inputs(q, k, v, g, beta, initial_state, None)
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    options = dict(scale=scale, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
    if world == 1:
        return _local_rule(q, k, v, g, beta, initial_state=initial_state, output_final_state=output_final_state,
                           **options)
    B, K, Hv, V = q.shape[0], q.shape[3], v.shape[2], v.shape[3]
    if K != V:
        raise ValueError(f"v: the transition M is formed as the end state from the identity, which needs "
                         f"K == V; got K={K}, V={V}")
    if initial_state is not None and tuple(initial_state.shape) != (B, Hv, K, V):
        raise ValueError(f"initial_state: expected shape {(B, Hv, K, V)}, got {tuple(initial_state.shape)}")

    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (q, k, v, g, beta, initial_state))
    if not needs_grad:
        return _two_phase_forward(q, k, v, g, beta, scale, initial_state, output_final_state,
                                  use_qk_l2norm_in_kernel, group, rank, world)

    # This shard's affine map S_end = M S_start + E, exchanged in one all-reduce: maps[j] = (E_j, M_j).
    _, shard_end = _local_rule(q, k, v, g, beta, output_final_state=True, **options)
    identity = torch.eye(K, dtype=torch.float32, device=q.device).expand(B, Hv, K, K).contiguous()
    _, transition = _local_rule(q, k, torch.zeros_like(v), g, beta, initial_state=identity, output_final_state=True,
                                **options)
    maps = _stack_over_ranks(torch.stack([shard_end, transition]), group, rank, world)

    state = None if initial_state is None else initial_state.float()
    for j in range(rank):
        state = maps[j, 0] if state is None else maps[j, 0] + maps[j, 1] @ state
    o, final = _local_rule(q, k, v, g, beta, initial_state=state, output_final_state=output_final_state, **options)
    if not output_final_state:
        return _Tie.apply(o, maps), None
    finals = _stack_over_ranks(final, group, rank, world)
    return _Tie.apply(o, maps, finals), finals[world - 1]


@torch.no_grad()
def _two_phase_forward(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                       group, rank: int, world: int):
    """The sharded forward without autograd: phase 1 (maps), one all-gather, the scan, phase 2."""
    B, Hv, K, V = q.shape[0], v.shape[2], q.shape[3], v.shape[3]
    scale = float(K ** -0.5 if scale is None else scale)
    options = dict(scale=scale, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
    maps = torch.empty(2 * B, Hv, K, K, dtype=torch.float32, device=q.device)
    workspace = forward_into(None, None, q, k, v, g, beta, None, None, shard_phase=1, shard_maps=maps, **options)
    gathered = [torch.empty_like(maps) for _ in range(world)]
    dist.all_gather(gathered, maps, group=group)
    state = None if initial_state is None else initial_state.float()
    entering = state
    for j in range(world):  # S_{j+1} = E_j + M_j S_j; rank r enters its shard with S_r
        if j == rank:
            entering = state
        state = gathered[j][:B] if state is None else gathered[j][:B] + gathered[j][B:] @ state
    o = torch.empty_like(v)
    forward_into(o, None, q, k, v, g, beta, entering, None, shard_phase=2, workspace=workspace, **options)
    return o, (state if output_final_state else None)

