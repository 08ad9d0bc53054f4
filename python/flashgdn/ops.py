"""PyTorch binding: tensors -> the C ABI, torch.library ops with fake implementations, autograd.

CUDA tensors run the SM90 kernels; CPU tensors run the float64 reference (slow, exact).
"""

from __future__ import annotations

import ctypes
from typing import NamedTuple, Optional

import torch

from . import _lib

_DTYPE_CODES = {torch.bfloat16: _lib.BF16, torch.float16: _lib.F16, torch.float32: _lib.F32,
                torch.float64: _lib.F64, torch.int32: _lib.I32, torch.int64: _lib.I64, torch.uint8: _lib.U8}


def _tensor(t: Optional[torch.Tensor]) -> _lib.Tensor:
    out = _lib.Tensor()
    if t is None:
        return out
    # An empty tensor may have no storage; it still must not read as "absent", and no element of
    # it is ever touched, so any aligned non-null address stands in.
    out.data = t.data_ptr() if t.numel() > 0 else 256
    out.dtype = _DTYPE_CODES[t.dtype]
    out.rank = t.dim()
    for i, (size, stride) in enumerate(zip(t.shape, t.stride())):
        out.sizes[i] = size
        out.strides[i] = stride
    return out


def _check_inputs(q, k, v, g, beta, initial_state, cu_seqlens):
    """Python-side checks that map to TypeError / ValueError naming the argument."""
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    for name, t, dims in (("q", q, 4), ("k", k, 4), ("v", v, 4), ("g", g, 3), ("beta", beta, 3)):
        if t.dim() != dims:
            raise ValueError(f"{name}: expected {dims} dimensions, got shape {tuple(t.shape)}")
        if t.device != q.device:
            raise ValueError(f"{name}: on {t.device}, but q is on {q.device}")
    cuda = q.device.type == "cuda"
    if cuda:
        if q.dtype not in (torch.bfloat16, torch.float16):
            raise TypeError(f"q: dtype must be bfloat16 or float16, got {q.dtype}")
        for name, t in (("k", k), ("v", v)):
            if t.dtype != q.dtype:
                raise TypeError(f"{name}: dtype {t.dtype} differs from q's {q.dtype}")
        if g.dtype != torch.float32:
            raise TypeError(f"g: dtype must be float32, got {g.dtype}")
        if beta.dtype not in (torch.float32, torch.bfloat16):
            raise TypeError(f"beta: dtype must be float32 or bfloat16, got {beta.dtype}")
    elif q.device.type != "cpu":
        raise ValueError(f"q: flashgdn runs on CUDA (SM90) or, through the reference, on the CPU; got {q.device}")
    if q.shape != k.shape:
        raise ValueError(f"k: shape {tuple(k.shape)} differs from q's {tuple(q.shape)}")
    B, T, Hqk, K = q.shape
    if v.shape[:2] != (B, T):
        raise ValueError(f"v: shape {tuple(v.shape)} does not match q's batch and tokens {(B, T)}")
    Hv = v.shape[2]
    if Hv % Hqk != 0:
        raise ValueError(f"v: {Hv} value heads is not a multiple of the {Hqk} q/k heads")
    for name, t in (("g", g), ("beta", beta)):
        if t.shape != (B, T, Hv):
            raise ValueError(f"{name}: expected shape {(B, T, Hv)}, got {tuple(t.shape)}")
    if cu_seqlens is not None:
        if cu_seqlens.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"cu_seqlens: dtype must be int32 or int64, got {cu_seqlens.dtype}")
        if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
            raise ValueError(f"cu_seqlens: expected a 1-D tensor of at least 2 offsets, got shape {tuple(cu_seqlens.shape)}")
        if cu_seqlens.device != q.device:
            raise ValueError(f"cu_seqlens: on {cu_seqlens.device}, but q is on {q.device}")
        if B != 1:
            raise ValueError(f"q: with cu_seqlens the batch size must be 1, got {B}")
    if initial_state is not None:
        if initial_state.device != q.device:
            raise ValueError(f"initial_state: on {initial_state.device}, but q is on {q.device}")
        if cuda and initial_state.dtype not in (torch.float32, torch.bfloat16):
            raise TypeError(f"initial_state: dtype must be float32 or bfloat16, got {initial_state.dtype}")


def _num_seqs(q, cu_seqlens):
    return q.shape[0] if cu_seqlens is None else cu_seqlens.numel() - 1


def _inputs(q, k, v, g, beta, initial_state, cu_seqlens, scale, use_qk_l2norm_in_kernel, state_v_first,
            cu_seqlens_host=None, context_parallel=0, cp_segment_chunks=0, cp_decay_threshold=-10.0):
    c = _lib.Inputs()
    c.batch, c.seqlen, c.num_qk_heads, c.head_dim_k = q.shape
    c.num_v_heads, c.head_dim_v = v.shape[2], v.shape[3]
    c.q, c.k, c.v, c.g, c.beta = map(_tensor, (q, k, v, g, beta))
    c.initial_state = _tensor(initial_state)
    if cu_seqlens is not None:
        c.cu_seqlens = cu_seqlens.data_ptr()
        c.cu_seqlens_dtype = _DTYPE_CODES[cu_seqlens.dtype]
        c.num_seqs = cu_seqlens.numel() - 1
        if cu_seqlens_host is not None:  # lets the C++ side check the offsets without a device sync
            c.cu_seqlens_host = cu_seqlens_host.data_ptr()
    c.state_v_first = int(state_v_first)
    c.has_scale = 1
    c.scale = scale
    c.use_qk_l2norm_in_kernel = int(use_qk_l2norm_in_kernel)
    if not cp_decay_threshold < 0:  # the C ABI reads 0 as "the default"
        raise ValueError(f"cp_decay_threshold: must be a finite negative log-decay, got {cp_decay_threshold}")
    c.context_parallel = int(context_parallel)
    c.cp_segment_chunks = int(cp_segment_chunks)
    c.cp_decay_threshold = float(cp_decay_threshold)
    return c


def _workspace(workspace: Optional[torch.Tensor], nbytes: int, device: torch.device) -> torch.Tensor:
    """The caller's workspace (checked; the C++ call checks its size) or a new one of nbytes."""
    if workspace is None:
        return torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device)
    if workspace.device != device or workspace.dtype != torch.uint8 or not workspace.is_contiguous():
        raise ValueError(f"workspace: expected a contiguous uint8 tensor on {device}, got {workspace.dtype} on "
                         f"{workspace.device}")
    return workspace


def _state_shape(N, Hv, K, V, state_v_first):
    return (N, Hv, V, K) if state_v_first else (N, Hv, K, V)


@torch.library.custom_op("flashgdn::chunk_gated_delta_rule_fwd", mutates_args=())
def chunk_gated_delta_rule_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                               beta: torch.Tensor, initial_state: Optional[torch.Tensor],
                               cu_seqlens: Optional[torch.Tensor], scale: float, output_final_state: bool,
                               use_qk_l2norm_in_kernel: bool, state_v_first: bool,
                               cu_seqlens_cpu: Optional[torch.Tensor] = None,
                               inverse_fp32: bool = False, context_parallel: int = 0, cp_segment_chunks: int = 0,
                               cp_decay_threshold: float = -10.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Low-level forward: (o, final_state), final_state empty when not asked for. Differentiable
    (autograd) w.r.t. q, k, v, g, beta and initial_state: the backward needs only the forward's
    inputs (it recomputes the chunk states)."""
    N, Hv, K, V = _num_seqs(q, cu_seqlens), v.shape[2], q.shape[3], v.shape[3]
    o = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    final = (torch.empty(_state_shape(N, Hv, K, V, state_v_first), dtype=torch.float32, device=q.device)
             if output_final_state else torch.empty(0, dtype=torch.float32, device=q.device))
    forward_into(o, final if output_final_state else None, q, k, v, g, beta, initial_state, cu_seqlens,
                 scale, use_qk_l2norm_in_kernel, state_v_first, inverse_fp32, cu_seqlens_cpu, context_parallel,
                 cp_segment_chunks, cp_decay_threshold)
    return o, final


def forward_into(o: torch.Tensor, final_state: Optional[torch.Tensor], q, k, v, g, beta, initial_state,
                 cu_seqlens, scale: float, use_qk_l2norm_in_kernel: bool = False, state_v_first: bool = False,
                 inverse_fp32: bool = False, cu_seqlens_cpu: Optional[torch.Tensor] = None,
                 context_parallel: int = 0, cp_segment_chunks: int = 0, cp_decay_threshold: float = -10.0,
                 v_split: int = 0, initial_state_indices: Optional[torch.Tensor] = None,
                 final_state_indices: Optional[torch.Tensor] = None, checkpoints: Optional[torch.Tensor] = None,
                 checkpoint_chunks: int = 0, token_states: Optional[torch.Tensor] = None, kernel: int = 0,
                 shard_phase: int = 0, shard_maps: Optional[torch.Tensor] = None,
                 workspace: Optional[torch.Tensor] = None,
                 cp_cache: Optional["CpCache"] = None,
                 inverse_cache: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
    """Forward into caller-given outputs (any strides the C++ validation accepts); final_state may
    be None or the initial_state tensor itself (in-place update). cu_seqlens_cpu: optional host copy
    of cu_seqlens, used to validate the offsets without a device sync (and to plan intra-card
    context parallelism). context_parallel: 0 auto, 1 off, 2 on (cp_segment_chunks: segment length in
    64-token chunks, 0 = the planner's). inverse_fp32, v_split (0 automatic, 1 or 2: CTAs per
    (sequence, v-head) of the mma.sync fused kernel) and kernel (0 automatic: 4 with the bf16
    inverse, 2 with inverse_fp32, 1 when v_split is pinned; 1 mma.sync, 2 wgmma, 3 warp-specialized
    wgmma, 4 warp-specialized with the state in registers, fed by TMA) pin kernel variants for
    measurements and tests.

    State pools (serving): with initial_state_indices (int32 [N] on the device) initial_state is a
    pool [P, Hv, K, V] and sequence n starts from slot initial_state_indices[n] (-1: zero); with
    final_state_indices final_state is a pool (it may be the same tensor) and sequence n's final
    state goes to slot final_state_indices[n] (-1: not written). A slot written must not be read by
    another sequence of the call.

    Checkpoints (prefix caching): with checkpoint_chunks = n >= 1 the state after every n * 64
    tokens of each sequence goes to checkpoints [C, Hv, K, V] (fp32), row first(i) + j - 1 for the
    j-th boundary of sequence i, first(i) = sum over earlier sequences of length // (64 n);
    C = B * (T // (64 n)) in batch mode, T // (64 n) with cu_seqlens.

    token_states (decode-sized calls, at most 8 tokens per sequence on average): the state after
    every token, fp32 [B * T, Hv, K, V], row b * T + t (the packed token with cu_seqlens), so that
    rejected speculative tokens can be rolled back.

    Shard phases (a sequence sharded over devices, flashgdn.distributed; flashgdn::ShardPhase):
    shard_phase=1 writes only shard_maps, fp32 contiguous [2 N, Hv, K, K]: the shard's end state
    from zero (rows 0..N-1) and its transition (rows N..2N-1), with o and final_state None;
    shard_phase=2 then writes o (and final_state) from initial_state, reusing what phase 1 left in
    `workspace` (a uint8 device tensor of at least forward_workspace_bytes(...) bytes, the same for
    both phases, untouched in between, same inputs and stream). workspace: optional for any call
    (default: allocated per call). Returns the workspace used (None for the CPU reference), which
    phase 1 hands to phase 2.

    cp_cache (for the backward): where the call runs intra-card CP, new_cp_cache(...) of the same
    arguments, whose tensors receive the state entering every segment and the segments' transitions;
    hand it to backward_into(cp_cache=) or its fields to chunk_gated_delta_rule_bwd.

    inverse_cache (for the backward): where the call runs the chunk inverse in the backward's format,
    new_inverse_cache(...) of the same arguments, which receives A_r, Ag and the chunks' gate records;
    hand it to backward_into(inverse_cache=) or chunk_gated_delta_rule_bwd(inverse_cache=)."""
    if cu_seqlens_cpu is not None:
        cu_seqlens_cpu = cu_seqlens_cpu.to(device="cpu", dtype=torch.int64).contiguous()
    c_in = _inputs(q, k, v, g, beta, initial_state, cu_seqlens, scale, use_qk_l2norm_in_kernel, state_v_first,
                   cu_seqlens_cpu, context_parallel, cp_segment_chunks, cp_decay_threshold)
    c_in.initial_state_indices = _tensor(initial_state_indices)
    c_out = _lib.ForwardOutputs()
    c_out.o = _tensor(o)
    c_out.final_state = _tensor(final_state)
    c_out.final_state_indices = _tensor(final_state_indices)
    c_out.checkpoints = _tensor(checkpoints)
    c_out.checkpoint_chunks = int(checkpoint_chunks)
    c_out.token_states = _tensor(token_states)
    c_out.shard_phase = int(shard_phase)
    c_out.shard_maps = _tensor(shard_maps)
    if cp_cache is not None:
        c_out.cp_states, c_out.cp_transitions = _tensor(cp_cache.states), _tensor(cp_cache.transitions)
    c_out.inverse_cache = _tensor(inverse_cache)
    if q.device.type == "cpu":  # the float64 reference, on host memory
        _lib.check(_lib.lib.flashgdn_reference_forward, ctypes.byref(c_in), ctypes.byref(c_out))
        return None
    if v_split not in (0, 1, 2):
        raise ValueError(f"v_split: must be 0 (automatic), 1 or 2, got {v_split}")
    if kernel not in (0, 1, 2, 3, 4, 5):
        raise ValueError(f"kernel: must be 0 (automatic), 1 (mma.sync), 2 (wgmma), 3 (warp-specialized), "
                         f"4 (register state) or 5 (inverse inside), got {kernel}")
    if kernel in (2, 3, 4, 5) and v_split == 2:
        raise ValueError("v_split: the wgmma kernels have no V split (v_split 0 or 1)")
    variant = int(inverse_fp32) | (int(v_split) << 1) | (int(kernel) << 3)
    nbytes = ctypes.c_size_t(0)
    _lib.check(_lib.lib.flashgdn_forward_workspace_size, ctypes.byref(c_in), ctypes.byref(c_out),
               variant, ctypes.byref(nbytes))
    workspace = _workspace(workspace, nbytes.value, q.device)
    stream = torch.cuda.current_stream(q.device).cuda_stream
    _lib.check(_lib.lib.flashgdn_forward, ctypes.byref(c_in), ctypes.byref(c_out), variant,
               ctypes.c_void_p(workspace.data_ptr()), ctypes.c_size_t(workspace.numel()),
               ctypes.c_void_p(stream))
    return workspace


class CpCache(NamedTuple):
    """The forward's CP cache for its backward (flashgdn::ForwardProblem::cp_states, cp_transitions):
    fp32 [segments, Hv, K, V] segment states, fp32 [segments, Hv, K, K] transitions (the library's own
    layout) and the cut they belong to."""
    states: torch.Tensor
    transitions: torch.Tensor
    segment_chunks: int

    @staticmethod
    def backward_kwargs(cache: Optional["CpCache"]) -> dict:
        """chunk_gated_delta_rule_bwd's keyword arguments for the cache (none for None)."""
        if cache is None:
            return {}
        return dict(cp_states=cache.states, cp_transitions=cache.transitions, cp_states_segment_chunks=cache.segment_chunks)


def new_cp_cache(q, k, v, g, beta, initial_state, cu_seqlens, scale: float, use_qk_l2norm_in_kernel: bool = False,
                 state_v_first: bool = False, cu_seqlens_cpu: Optional[torch.Tensor] = None, context_parallel: int = 0,
                 cp_segment_chunks: int = 0, cp_decay_threshold: float = -10.0) -> Optional[CpCache]:
    """The CP cache of a forward with these arguments (flashgdn::forward_cp_cache_shape: host-only, no
    device sync), its tensors uninitialised, for forward_into(cp_cache=); None where that forward runs
    no intra-card CP (or on the CPU)."""
    if q.device.type != "cuda":
        return None
    segment_chunks, segments = _cp_cache_shape(q, k, v, g, beta, initial_state, cu_seqlens, scale,
                                               use_qk_l2norm_in_kernel, state_v_first, cu_seqlens_cpu,
                                               context_parallel, cp_segment_chunks, cp_decay_threshold)
    if segment_chunks == 0:
        return None
    states = torch.empty((segments, v.shape[2], q.shape[3], v.shape[3]), dtype=torch.float32, device=q.device)
    transitions = torch.empty((segments, v.shape[2], q.shape[3], q.shape[3]), dtype=torch.float32, device=q.device)
    return CpCache(states, transitions, segment_chunks)


def _cp_cache_shape(q, k, v, g, beta, initial_state, cu_seqlens, scale, use_qk_l2norm_in_kernel, state_v_first,
                    cu_seqlens_cpu, context_parallel, cp_segment_chunks, cp_decay_threshold) -> tuple[int, int]:
    """(segment_chunks, segments) of flashgdn::forward_cp_cache_shape: (0, 0) without CP."""
    if cu_seqlens_cpu is not None:
        cu_seqlens_cpu = cu_seqlens_cpu.to(device="cpu", dtype=torch.int64).contiguous()
    c_in = _inputs(q, k, v, g, beta, initial_state, cu_seqlens, scale, use_qk_l2norm_in_kernel, state_v_first,
                   cu_seqlens_cpu, context_parallel, cp_segment_chunks, cp_decay_threshold)
    segment_chunks, segments = ctypes.c_int64(0), ctypes.c_int64(0)
    _lib.check(_lib.lib.flashgdn_forward_cp_cache_shape, ctypes.byref(c_in), ctypes.byref(_lib.ForwardOutputs()),
               ctypes.byref(segment_chunks), ctypes.byref(segments))
    return int(segment_chunks.value), int(segments.value)


def new_inverse_cache(q, k, v, g, beta, initial_state, cu_seqlens, scale: float, use_qk_l2norm_in_kernel: bool = False,
                      state_v_first: bool = False, cu_seqlens_cpu: Optional[torch.Tensor] = None,
                      context_parallel: int = 0, cp_segment_chunks: int = 0,
                      cp_decay_threshold: float = -10.0) -> Optional[torch.Tensor]:
    """The inverse cache of a forward with these arguments and the default kernel and inverse
    (flashgdn::forward_inverse_cache_bytes: host-only, no device sync), uninitialised uint8, for
    forward_into(inverse_cache=); None where that forward runs no chunk inverse the backward can take
    (decode-sized calls) or on the CPU. It holds A_r and Ag (256 B a token and v-head), the chunks' gate
    records and window terms: the register-state forward's chunk inverse writes the backward's own bytes,
    the inverse-inside forward its own inverse (the gradients then within the oracle tolerances, not
    bit for bit those without the cache)."""
    if q.device.type != "cuda":
        return None
    if cu_seqlens_cpu is not None:
        cu_seqlens_cpu = cu_seqlens_cpu.to(device="cpu", dtype=torch.int64).contiguous()
    c_in = _inputs(q, k, v, g, beta, initial_state, cu_seqlens, scale, use_qk_l2norm_in_kernel, state_v_first,
                   cu_seqlens_cpu, context_parallel, cp_segment_chunks, cp_decay_threshold)
    nbytes = ctypes.c_size_t(0)
    _lib.check(_lib.lib.flashgdn_forward_inverse_cache_bytes, ctypes.byref(c_in), ctypes.byref(_lib.ForwardOutputs()),
               ctypes.byref(nbytes))
    if nbytes.value == 0:
        return None
    return torch.empty(nbytes.value, dtype=torch.uint8, device=q.device)


TIMELINE_SHAPE = (2, 128, 12)  # roles (aux, state group 0), chunks, events: src/kernels/sm90/timeline.cuh


def set_timeline(buffer: Optional[torch.Tensor]) -> None:
    """Measurement builds (-DFLASHGDN_TIMELINE=ON) only: later forward_into calls with kernel 3 or 4
    write clock64() at the phase boundaries of their CTA (0, 0, 0) into buffer (int64 cuda,
    TIMELINE_SHAPE, contiguous; None: stop, before the buffer is freed). Other builds raise
    NotSupportedError (FlashGDNError without kernels)."""
    if buffer is not None and (buffer.dtype != torch.int64 or not buffer.is_cuda or
                               tuple(buffer.shape) != TIMELINE_SHAPE or not buffer.is_contiguous()):
        raise ValueError(f"timeline: an int64 cuda tensor of shape {TIMELINE_SHAPE}, contiguous")
    _lib.check(_lib.lib.flashgdn_set_timeline, None if buffer is None else ctypes.c_void_p(buffer.data_ptr()))


@chunk_gated_delta_rule_fwd.register_fake
def _(q, k, v, g, beta, initial_state, cu_seqlens, scale, output_final_state, use_qk_l2norm_in_kernel,
      state_v_first, cu_seqlens_cpu=None, inverse_fp32=False, context_parallel=0, cp_segment_chunks=0,
      cp_decay_threshold=-10.0):
    N = q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    Hv, K, V = v.shape[2], q.shape[3], v.shape[3]
    o = v.new_empty(v.shape)
    final = (q.new_empty(_state_shape(N, Hv, K, V, state_v_first), dtype=torch.float32)
             if output_final_state else q.new_empty(0, dtype=torch.float32))
    return o, final


@torch.library.custom_op("flashgdn::chunk_gated_delta_rule_bwd", mutates_args=())
def chunk_gated_delta_rule_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                               beta: torch.Tensor, do: torch.Tensor, dht: Optional[torch.Tensor],
                               initial_state: Optional[torch.Tensor], cu_seqlens: Optional[torch.Tensor],
                               scale: float, use_qk_l2norm_in_kernel: bool, state_v_first: bool,
                               cu_seqlens_cpu: Optional[torch.Tensor] = None, context_parallel: int = 0,
                               cp_segment_chunks: int = 0, cp_decay_threshold: float = -10.0,
                               inverse_fp32: bool = False, cp_states: Optional[torch.Tensor] = None,
                               cp_transitions: Optional[torch.Tensor] = None, cp_states_segment_chunks: int = 0,
                               inverse_cache: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                          torch.Tensor]:
    """Low-level backward: (dq, dk, dv, dg, dbeta, dh0) from the forward's inputs, the gradient of o
    (do) and optionally of the final state (dht). dg is w.r.t. the raw gate g (fp32); dbeta has
    beta's dtype; dh0 is empty when there is no initial_state. dq/dk are summed over each group of
    value heads and include the L2-norm backward when use_qk_l2norm_in_kernel. inverse_fp32: the
    chunk inverse merged in split bf16 for keys past beta |k|^2 <= 2 (as the forward's).
    cp_states, cp_transitions, cp_states_segment_chunks: the forward's CP cache (the fields of
    new_cp_cache's, filled by forward_into with the same inputs and options): the backward then runs
    the forward's cut and skips rebuilding the segment states and transitions (as FlashQLA's backward
    reuses its forward's CP cache); it may add transitions to cp_transitions. inverse_cache: the
    forward's (new_inverse_cache's, filled by forward_into with the same inputs and options): the
    backward then runs no chunk inverse (as FlashQLA's and FLA's backwards take their forward's A); the
    gradients equal those without it."""
    _check_inputs(q, k, v, g, beta, initial_state, cu_seqlens)
    dq, dk, dv, dg, dbeta, dh0 = _grad_outputs(q, k, v, g, beta, initial_state)
    backward_into(dq, dk, dv, dg, dbeta, dh0 if initial_state is not None else None, q, k, v, g, beta, do, dht,
                  initial_state, cu_seqlens, scale, use_qk_l2norm_in_kernel, state_v_first, cu_seqlens_cpu,
                  context_parallel, cp_segment_chunks, cp_decay_threshold, inverse_fp32=inverse_fp32,
                  cp_cache=None if cp_states is None else CpCache(cp_states, cp_transitions, cp_states_segment_chunks),
                  inverse_cache=inverse_cache)
    return dq, dk, dv, dg, dbeta, dh0


def _grad_outputs(q, k, v, g, beta, initial_state):
    dh0 = (torch.empty_like(initial_state, memory_format=torch.contiguous_format) if initial_state is not None
           else q.new_empty(0, dtype=torch.float32))
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            torch.empty_like(k, memory_format=torch.contiguous_format),
            torch.empty_like(v, memory_format=torch.contiguous_format),
            torch.empty_like(g, memory_format=torch.contiguous_format),
            torch.empty_like(beta, memory_format=torch.contiguous_format), dh0)


@chunk_gated_delta_rule_bwd.register_fake
def _(q, k, v, g, beta, do, dht, initial_state, cu_seqlens, scale, use_qk_l2norm_in_kernel, state_v_first,
      cu_seqlens_cpu=None, context_parallel=0, cp_segment_chunks=0, cp_decay_threshold=-10.0, inverse_fp32=False,
      cp_states=None, cp_transitions=None, cp_states_segment_chunks=0, inverse_cache=None):
    return _grad_outputs(q, k, v, g, beta, initial_state)


def backward_into(dq, dk, dv, dg, dbeta, dh0, q, k, v, g, beta, do, dht, initial_state, cu_seqlens,
                  scale: float, use_qk_l2norm_in_kernel: bool = False, state_v_first: bool = False,
                  cu_seqlens_cpu: Optional[torch.Tensor] = None, context_parallel: int = 0,
                  cp_segment_chunks: int = 0, cp_decay_threshold: float = -10.0, shard_phase: int = 0,
                  shard_grad: Optional[torch.Tensor] = None,
                  workspace: Optional[torch.Tensor] = None, inverse_fp32: bool = False,
                  cp_cache: Optional[CpCache] = None,
                  inverse_cache: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
    """Backward into caller-given gradient tensors (dh0 must be given exactly when initial_state is).
    context_parallel etc. as for forward_into (the backward's own intra-card CP). inverse_fp32: the
    chunk inverse merged in split bf16 (keys past the range) instead of fp16 (beta |k|^2 <= 2; keys
    far past it overflow fp16 and the gradients come back non-finite), as forward_into's.

    Shard phases (flashgdn.distributed; flashgdn::BackwardProblem): shard_phase=1 writes only
    shard_grad, fp32 contiguous [N, Hv, K, V], the gradient that do alone sends into each
    sequence's entering state (dht, the gradients and initial_state None); shard_phase=2 is the
    backward from initial_state and dht on phase 1's workspace (same inputs, do and stream). Returns
    the workspace used (None for the CPU reference).

    cp_cache: new_cp_cache's, filled by forward_into(cp_cache=) with the same inputs and options: the
    forward's cut, segment states and transitions, reused (transitions the backward needs and the
    forward did not form are added to it). inverse_cache: new_inverse_cache's, filled by
    forward_into(inverse_cache=) with the same inputs and options: no chunk inverse runs."""
    if cu_seqlens_cpu is not None:
        cu_seqlens_cpu = cu_seqlens_cpu.to(device="cpu", dtype=torch.int64).contiguous()
    c_in = _inputs(q, k, v, g, beta, initial_state, cu_seqlens, scale, use_qk_l2norm_in_kernel, state_v_first,
                   cu_seqlens_cpu, context_parallel, cp_segment_chunks, cp_decay_threshold)
    c_grads = _lib.BackwardTensors()
    for name, t in (("d_o", do), ("d_final_state", dht), ("dq", dq), ("dk", dk), ("dv", dv), ("dg", dg),
                    ("dbeta", dbeta), ("d_initial_state", dh0), ("shard_grad", shard_grad)):
        setattr(c_grads, name, _tensor(t))
    c_grads.shard_phase = int(shard_phase)
    c_grads.inverse_fp32 = int(bool(inverse_fp32))
    if cp_cache is not None:
        c_grads.cp_states, c_grads.cp_transitions = _tensor(cp_cache.states), _tensor(cp_cache.transitions)
        c_grads.cp_segment_chunks = int(cp_cache.segment_chunks)
    c_grads.inverse_cache = _tensor(inverse_cache)
    if q.device.type == "cpu":  # the float64 reference, on host memory
        _lib.check(_lib.lib.flashgdn_reference_backward, ctypes.byref(c_in), ctypes.byref(c_grads))
        return None
    nbytes = ctypes.c_size_t(0)
    _lib.check(_lib.lib.flashgdn_backward_workspace_size, ctypes.byref(c_in), ctypes.byref(c_grads),
               ctypes.byref(nbytes))
    workspace = _workspace(workspace, nbytes.value, q.device)
    stream = torch.cuda.current_stream(q.device).cuda_stream
    _lib.check(_lib.lib.flashgdn_backward, ctypes.byref(c_in), ctypes.byref(c_grads),
               ctypes.c_void_p(workspace.data_ptr()), ctypes.c_size_t(workspace.numel()),
               ctypes.c_void_p(stream))
    return workspace


def _unit_inner(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return t if t is None or t.stride(-1) == 1 else t.contiguous()


_FWD_ARGS = ("q", "k", "v", "g", "beta", "initial_state", "cu_seqlens", "scale", "output_final_state",
             "use_qk_l2norm_in_kernel", "state_v_first", "cu_seqlens_cpu", "inverse_fp32", "context_parallel",
             "cp_segment_chunks", "cp_decay_threshold")


def _setup_context(ctx, inputs, output, caches=()):
    args = dict(zip(_FWD_ARGS, inputs))
    ctx.save_for_backward(args["q"], args["k"], args["v"], args["g"], args["beta"], args["initial_state"],
                          args["cu_seqlens"], args.get("cu_seqlens_cpu"), *caches)
    ctx.scale = args["scale"]
    ctx.use_qk_l2norm_in_kernel = args["use_qk_l2norm_in_kernel"]
    ctx.state_v_first = args["state_v_first"]
    ctx.output_final_state = args["output_final_state"]
    ctx.cp = (args.get("context_parallel", 0), args.get("cp_segment_chunks", 0), args.get("cp_decay_threshold", -10.0))
    ctx.inverse_fp32 = bool(args.get("inverse_fp32", False))


def _backward(ctx, grad_o, grad_final, cp_cache: Optional[CpCache] = None,
              inverse_cache: Optional[torch.Tensor] = None):
    q, k, v, g, beta, initial_state, cu_seqlens, cu_seqlens_cpu = ctx.saved_tensors[:8]
    if grad_o is None:
        grad_o = torch.zeros_like(v)
    dht = grad_final if ctx.output_final_state and grad_final is not None and grad_final.numel() > 0 else None
    h0 = initial_state  # the backward takes fp32 states: a bf16-stored initial state is widened
    if h0 is not None and h0.dtype != torch.float32:
        h0 = h0.float()
    if dht is not None and dht.dtype != torch.float32:
        dht = dht.float()
    dq, dk, dv, dg, dbeta, dh0 = chunk_gated_delta_rule_bwd(
        q, k, v, g, beta, _unit_inner(grad_o), _unit_inner(dht), h0, cu_seqlens, ctx.scale,
        ctx.use_qk_l2norm_in_kernel, ctx.state_v_first, cu_seqlens_cpu, *ctx.cp, inverse_fp32=ctx.inverse_fp32,
        inverse_cache=inverse_cache, **CpCache.backward_kwargs(cp_cache))
    if initial_state is not None and dh0.dtype != initial_state.dtype:
        dh0 = dh0.to(initial_state.dtype)
    needs = ctx.needs_input_grad
    grads = [dq if needs[0] else None, dk if needs[1] else None, dv if needs[2] else None,
             dg if needs[3] else None, dbeta if needs[4] else None,
             dh0 if initial_state is not None and needs[5] else None]
    return tuple(grads) + (None,) * (len(_FWD_ARGS) - len(grads))


torch.library.register_autograd("flashgdn::chunk_gated_delta_rule_fwd", _backward, setup_context=_setup_context)


@torch.library.custom_op("flashgdn::chunk_gated_delta_rule_fwd_cached", mutates_args=())
def chunk_gated_delta_rule_fwd_cached(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                                      beta: torch.Tensor, initial_state: Optional[torch.Tensor],
                                      cu_seqlens: Optional[torch.Tensor], scale: float, output_final_state: bool,
                                      use_qk_l2norm_in_kernel: bool, state_v_first: bool,
                                      cu_seqlens_cpu: Optional[torch.Tensor] = None, inverse_fp32: bool = False,
                                      context_parallel: int = 0, cp_segment_chunks: int = 0,
                                      cp_decay_threshold: float = -10.0
                                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """chunk_gated_delta_rule_fwd for eager autograd: (o, final_state, the CP cache's states and
    transitions, the inverse cache; a cache empty where the forward forms none), which its backward
    reuses. No fake implementation (the caches' sizes come from the host lengths and the kernel
    choice): under torch.compile chunk_gated_delta_rule takes chunk_gated_delta_rule_fwd, whose
    backward rebuilds them."""
    N, Hv, K, V = _num_seqs(q, cu_seqlens), v.shape[2], q.shape[3], v.shape[3]
    o = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    final = (torch.empty(_state_shape(N, Hv, K, V, state_v_first), dtype=torch.float32, device=q.device)
             if output_final_state else None)
    plan = (q, k, v, g, beta, initial_state, cu_seqlens, scale, use_qk_l2norm_in_kernel, state_v_first, cu_seqlens_cpu,
            context_parallel, cp_segment_chunks, cp_decay_threshold)
    cache = new_cp_cache(*plan)
    inverse = None if inverse_fp32 else new_inverse_cache(*plan)
    forward_into(o, final, q, k, v, g, beta, initial_state, cu_seqlens, scale, use_qk_l2norm_in_kernel,
                 state_v_first, inverse_fp32, cu_seqlens_cpu, context_parallel, cp_segment_chunks, cp_decay_threshold,
                 cp_cache=cache, inverse_cache=inverse)
    def empty(dtype=torch.float32):  # a fresh one each: a custom op's outputs may not alias each other
        return q.new_empty(0, dtype=dtype)
    return (o, empty() if final is None else final, empty() if cache is None else cache.states,
            empty() if cache is None else cache.transitions, empty(torch.uint8) if inverse is None else inverse)


def _setup_context_cached(ctx, inputs, output):
    # the caches' tensors are saved as they are: the backward's kernels add transitions to the CP cache
    # through raw pointers, after they are unpacked, which the saved-tensor version check does not see
    _setup_context(ctx, inputs, output[:2], caches=output[2:])
    ctx.mark_non_differentiable(*output[2:])


def _backward_cached(ctx, grad_o, grad_final, _grad_states, _grad_transitions, _grad_inverse):
    q, k, v, g, beta, initial_state, cu_seqlens, cu_seqlens_cpu, states, transitions, inverse = ctx.saved_tensors
    inverse_cache = inverse if inverse.numel() > 0 else None
    if states.numel() == 0:
        return _backward(ctx, grad_o, grad_final, inverse_cache=inverse_cache)
    segment_chunks, segments = _cp_cache_shape(q, k, v, g, beta, initial_state, cu_seqlens, ctx.scale,
                                               ctx.use_qk_l2norm_in_kernel, ctx.state_v_first, cu_seqlens_cpu, *ctx.cp)
    if segments != states.shape[0]:
        raise RuntimeError(f"flashgdn: the forward kept a CP cache of {states.shape[0]} segments, the cut now has "
                           f"{segments}")
    return _backward(ctx, grad_o, grad_final, CpCache(states, transitions, segment_chunks), inverse_cache)


torch.library.register_autograd("flashgdn::chunk_gated_delta_rule_fwd_cached", _backward_cached,
                                setup_context=_setup_context_cached)


def chunk_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                           beta: torch.Tensor, scale: Optional[float] = None,
                           initial_state: Optional[torch.Tensor] = None, output_final_state: bool = False,
                           use_qk_l2norm_in_kernel: bool = False, cu_seqlens: Optional[torch.Tensor] = None,
                           state_v_first: bool = False, auto_cp: Optional[bool] = None,
                           cp_segment_chunks: int = 0, cp_decay_threshold: float = -10.0, **kwargs):
    """Gated delta rule, chunked prefill. Drop-in for fla.ops.gated_delta_rule.chunk_gated_delta_rule.

    q, k: [B, T, Hqk, K]; v: [B, T, Hv, V]; g (log-space gate, fp32) and beta: [B, T, Hv];
    initial_state: [N, Hv, K, V] fp32 or bf16 ([N, Hv, V, K] with state_v_first); cu_seqlens: [N + 1] offsets of
    packed sequences (then B == 1); cu_seqlens_cpu (keyword): an optional host copy of cu_seqlens that
    lets flashgdn check the offsets and plan without a device sync. Returns (o [B, T, Hv, V] in v's
    dtype, final_state or None).

    Intra-card context parallelism (long sequences cut into segments run in parallel): auto_cp None
    (default) lets the planner decide, for the forward and the backward each with its own cost model
    (batch mode, or varlen with cu_seqlens_cpu), False turns it off (bitwise-reproducible runs),
    True forces it in both directions (cp_segment_chunks: segment length in 64-token chunks, 0 =
    the planner's). cp_decay_threshold: log-decay below which a head's segment needs no exact
    transition (error <= e^threshold of the state's norm).

    Range: the chunk inverse (I + strictly-lower beta K K^T)^-1 of the forward and the backward is
    formed with fp16 products by default, which needs beta_t |k_t|^2 <= 2 (the delta rule's
    non-expanding range; it holds with use_qk_l2norm_in_kernel or unit keys and beta in (0, 2]).
    Keys far longer can overflow fp16 there, and o and the gradients then hold Inf / NaN (never
    finite and wrong); inverse_fp32=True (keyword) runs the split-bf16 inverse in both directions
    instead, for any keys.

    With gradients wanted (eager mode), the forward keeps what its backward would rebuild, as
    FlashQLA's does: where it runs CP, the CP cache (the segment states and transitions, fp32: 128 KiB
    a segment and v-head), and where it runs the chunk inverse in the backward's format, the inverse
    cache (A_r and Ag: 256 B a token and v-head; the gradients equal those without it);
    forward_cache=False (keyword) keeps nothing and the backward rebuilds them.
    """
    for key in kwargs:
        if key not in ("head_first", "cu_seqlens_cpu", "inverse_fp32", "forward_cache"):
            raise TypeError(f"chunk_gated_delta_rule: unexpected keyword argument '{key}'")
    if kwargs.get("head_first"):
        raise ValueError("head_first: the [B, H, T, D] layout is not supported; pass [B, T, H, D]")
    _check_inputs(q, k, v, g, beta, initial_state, cu_seqlens)
    if scale is None:
        scale = q.shape[-1] ** -0.5
    cu_seqlens_cpu = kwargs.get("cu_seqlens_cpu")
    if cu_seqlens_cpu is not None and not isinstance(cu_seqlens_cpu, torch.Tensor):
        cu_seqlens_cpu = torch.tensor(cu_seqlens_cpu, dtype=torch.int64)
    context_parallel = 0 if auto_cp is None else (2 if auto_cp else 1)
    args = (q, k, v, g, beta, initial_state, cu_seqlens, float(scale), bool(output_final_state),
            bool(use_qk_l2norm_in_kernel), bool(state_v_first), cu_seqlens_cpu, bool(kwargs.get("inverse_fp32", False)),
            context_parallel, int(cp_segment_chunks), float(cp_decay_threshold))
    wants_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                                 for t in (q, k, v, g, beta, initial_state))
    if wants_grad and q.is_cuda and kwargs.get("forward_cache", True) and not torch.compiler.is_compiling():
        o, final, *_ = chunk_gated_delta_rule_fwd_cached(*args)
    else:
        o, final = chunk_gated_delta_rule_fwd(*args)
    return o, (final if output_final_state else None)
