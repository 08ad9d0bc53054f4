"""The forward's inverse cache, reused by the backward (ForwardProblem::inverse_cache,
BackwardProblem::inverse_cache): the forward's chunk inverse writes A_r, Ag, the gate records and the
window terms in the backward's format, and the backward given them runs no chunk inverse. The
gradients must equal those of the backward that forms them itself, bit for bit (same kernel, same
inputs), and the forward's o must not change."""

import pytest
import torch

import flashgdn
from flashgdn.ops import backward_into, forward_into, new_cp_cache, new_inverse_cache

from conftest import kernels_launched, make_inputs, packed_varlen
from test_backward import GRADS, check as check_grads, poisoned_grads, upstream

AUTO, OFF, ON = 0, 1, 2


def call_args(x, cu_seqlens=None):
    q = x["q"]
    return (q, x["k"], x["v"], x["g"], x["beta"], x["initial_state"], cu_seqlens, q.shape[-1] ** -0.5)


def forward_filling_cache(x, cu_seqlens=None, cu_seqlens_cpu=None, mode=AUTO, segment_chunks=0, cp_cache=None):
    """The forward with its inverse cache (poisoned first: 0xFF bytes are NaN in fp16, bf16 and fp32,
    so that a region the forward does not write shows in the backward); returns (o, cache)."""
    args = call_args(x, cu_seqlens)
    options = dict(cu_seqlens_cpu=cu_seqlens_cpu, context_parallel=mode, cp_segment_chunks=segment_chunks)
    cache = new_inverse_cache(*args, **options)
    assert cache is not None, "this forward runs the register-state kernel: it must have an inverse cache"
    assert cache.dtype == torch.uint8 and cache.dim() == 1
    cache.fill_(0xFF)
    o = torch.full_like(x["v"], float("nan"))
    forward_into(o, None, *args, cp_cache=cp_cache, inverse_cache=cache, **options)
    return o, cache


def forward_plain(x, cu_seqlens=None, cu_seqlens_cpu=None, mode=AUTO, segment_chunks=0):
    o = torch.full_like(x["v"], float("nan"))
    forward_into(o, None, *call_args(x, cu_seqlens), cu_seqlens_cpu=cu_seqlens_cpu, context_parallel=mode,
                 cp_segment_chunks=segment_chunks)
    return o


def backward(x, do, dht, cu_seqlens=None, cu_seqlens_cpu=None, mode=AUTO, segment_chunks=0, inverse_cache=None,
             cp_cache=None):
    grads = poisoned_grads(x)
    backward_into(*(grads[n] for n in GRADS), *(x[n] for n in ("q", "k", "v", "g", "beta")), do, dht,
                  x["initial_state"], cu_seqlens, x["q"].shape[-1] ** -0.5, False, False, cu_seqlens_cpu, mode,
                  segment_chunks, cp_cache=cp_cache, inverse_cache=inverse_cache)
    return grads


def assert_same_grads(got, want, what):
    for name in GRADS:
        if want[name] is None:
            continue
        assert torch.equal(got[name], want[name]), f"{what}: {name} differs from the backward without the cache"


@pytest.mark.parametrize("regime", ["zero", "strong", "mixed", "model"])
@pytest.mark.parametrize("with_dht", [True, False])
@pytest.mark.parametrize("with_h0", [True, False])
def test_gradients_equal_without_the_cache(seed, regime, with_dht, with_h0):
    """Batch mode without CP (2 x 1000, (2,4): the register-state kernel): o unchanged by filling the
    cache, the gradients bit for bit those of the backward without it, within the oracle's
    tolerance, and the cache is read (a poisoned one gives non-finite gradients)."""
    x = make_inputs(2, 1000, 2, 4, regime=regime, initial_state=with_h0)
    do, dht = upstream(x, with_dht)
    o, cache = forward_filling_cache(x, mode=OFF)
    assert torch.equal(o, forward_plain(x, mode=OFF)), "filling the inverse cache changed the forward's o"
    grads = backward(x, do, dht, mode=OFF, inverse_cache=cache)
    check_grads(x, grads, do, dht)
    assert_same_grads(grads, backward(x, do, dht, mode=OFF), regime)
    poisoned = backward(x, do, dht, mode=OFF, inverse_cache=torch.full_like(cache, 0xFF))
    assert not torch.isfinite(poisoned["dk"]).all(), "the backward did not read the inverse cache"


@pytest.mark.parametrize("forward_mode", [OFF, ON])
def test_with_cp(seed, forward_mode):
    """CP in the backward (segments of 4 chunks over 4133 tokens): the cache's window terms serve its
    decay windows whether or not the forward ran CP; with the forward's CP cache too, nothing of the
    forward's pre-processing runs again."""
    x = make_inputs(1, 4133, 2, 4, regime="mixed")
    do, dht = upstream(x)
    cut = dict(mode=ON, segment_chunks=4)
    cp_cache = None
    if forward_mode == ON:
        args = call_args(x)
        cp_cache = new_cp_cache(*args, context_parallel=ON, cp_segment_chunks=4)
        o, cache = forward_filling_cache(x, cp_cache=cp_cache, **cut)
        assert torch.equal(o, forward_plain(x, **cut)), "filling the inverse cache changed the forward's o"
    else:
        _, cache = forward_filling_cache(x, mode=OFF)
    grads = backward(x, do, dht, inverse_cache=cache, cp_cache=cp_cache, **cut)
    check_grads(x, grads, do, dht)
    assert_same_grads(grads, backward(x, do, dht, cp_cache=cp_cache, **cut), f"forward mode {forward_mode}")
    launched = kernels_launched(lambda: backward(x, do, dht, inverse_cache=cache, cp_cache=cp_cache, **cut))
    assert not any("chunk_inverse_kernel" in name for name in launched), sorted(launched)


@pytest.mark.parametrize("host_copy", [False, True])
def test_varlen(seed, host_copy):
    """Empty, short and long sequences and padding; without the host copy the chunk count is a bound
    (the cache's size follows it: the forward and the backward must agree on the host copy)."""
    x, cu = packed_varlen(2, 4)
    do, dht = upstream(x, cu_seqlens=cu)
    host = cu.cpu() if host_copy else None
    _, cache = forward_filling_cache(x, cu_seqlens=cu, cu_seqlens_cpu=host, mode=OFF)
    grads = backward(x, do, dht, cu_seqlens=cu, cu_seqlens_cpu=host, mode=OFF, inverse_cache=cache)
    check_grads(x, grads, do, dht, cu_seqlens=cu)
    assert_same_grads(grads, backward(x, do, dht, cu_seqlens=cu, cu_seqlens_cpu=host, mode=OFF), "varlen")
    for name in ("dq", "dk", "dv", "dg", "dbeta"):
        assert (grads[name][:, int(cu[-1]):] == 0).all(), f"{name}: padding tokens must get zero gradients"


def test_bad_arguments(seed):
    """Clear errors: no cache where the forward forms no reusable inverse (the inverse-inside kernel,
    the fp32 inverse), a cache of the wrong size, dtype, alignment or rank, a cache given to a
    backward with inverse_fp32 or a shard phase."""
    x = make_inputs(2, 1000, 2, 4, regime="weak")
    args = call_args(x)
    cache = new_inverse_cache(*args, context_parallel=OFF)
    o = torch.empty_like(x["v"])
    with pytest.raises(flashgdn.InvalidArgumentError, match="inverse_cache: this call runs no chunk inverse"):
        forward_into(o, None, *args, context_parallel=OFF, kernel=5, inverse_cache=cache)
    with pytest.raises(flashgdn.InvalidArgumentError, match="inverse_cache: this call runs no chunk inverse"):
        forward_into(o, None, *args, inverse_fp32=True, context_parallel=OFF, inverse_cache=cache)
    with pytest.raises(flashgdn.InvalidArgumentError, match="bytes given, this problem's cache has"):
        forward_into(o, None, *args, context_parallel=OFF, inverse_cache=cache[:-256])
    with pytest.raises(flashgdn.InvalidArgumentError, match="inverse_cache: dtype must be uint8"):
        forward_into(o, None, *args, context_parallel=OFF, inverse_cache=cache.view(torch.int32))
    with pytest.raises(flashgdn.InvalidArgumentError, match="256-byte aligned"):
        forward_into(o, None, *args, context_parallel=OFF, inverse_cache=cache[16:])
    with pytest.raises(flashgdn.InvalidArgumentError, match="inverse_cache: expected a 1-D uint8 buffer"):
        forward_into(o, None, *args, context_parallel=OFF, inverse_cache=cache.view(2, -1))
    forward_into(o, None, *args, context_parallel=OFF, inverse_cache=cache)
    do, dht = upstream(x)
    outs = [poisoned_grads(x)[n] for n in GRADS]
    with pytest.raises(flashgdn.InvalidArgumentError, match="bytes given, this problem's cache has"):
        backward_into(*outs, *args[:5], do, dht, *args[5:], inverse_cache=cache[:-256])
    with pytest.raises(flashgdn.NotSupportedError, match="inverse_cache: holds the fp16-merged chunk inverse"):
        backward_into(*outs, *args[:5], do, dht, *args[5:], inverse_fp32=True, inverse_cache=cache)
    with pytest.raises(flashgdn.NotSupportedError, match="inverse_cache: not with shard phases"):
        backward_into(None, None, None, None, None, None, *args[:5], do, None, None, None, args[7], shard_phase=1,
                      shard_grad=torch.empty(2, 4, 128, 128, device="cuda"), inverse_cache=cache)
    # many (sequence, v-head) items without CP: the inverse-inside kernel, which forms no cache
    y = make_inputs(8, 1024, 16, 16, regime="weak")
    assert new_inverse_cache(*call_args(y), context_parallel=OFF) is None


def test_autograd_keeps_the_inverse_cache(seed):
    """chunk_gated_delta_rule under eager autograd keeps its forward's inverse cache: the backward
    launches no chunk inverse (with forward_cache=False it does), and the gradients are the same bits."""
    from test_backward import INPUTS

    x = make_inputs(2, 1000, 2, 4, regime="mixed")
    do, dht = upstream(x)
    results = {}
    for keep in (True, False):
        leaves = {n: t.clone().requires_grad_(True) for n, t in x.items()}
        o, final = flashgdn.chunk_gated_delta_rule(**leaves, output_final_state=True, auto_cp=False,
                                                   forward_cache=keep)
        grads = []
        launched = kernels_launched(
            lambda: grads.extend(torch.autograd.grad((o, final), [leaves[n] for n in INPUTS], (do, dht))))
        results[keep] = dict(zip(GRADS, grads))
        inverted = any("chunk_inverse_kernel" in name for name in launched)
        assert inverted != keep, f"forward_cache={keep}: backward kernels {sorted(launched)}"
    check_grads(x, results[True], do, dht)
    assert_same_grads(results[True], results[False], "autograd")
