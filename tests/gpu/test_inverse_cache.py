"""The forward's inverse cache, reused by the backward (ForwardProblem::inverse_cache,
BackwardProblem::inverse_cache): the forward writes A_r, Ag, the gate records and the window terms in
the backward's format, and the backward given them runs no chunk inverse; the forward's o must not
change.

The register-state forward (v4) writes them by the backward's own chunk inverse: the gradients must
equal those of the backward that forms them itself, bit for bit. The inverse-inside forward (v5,
without CP) writes its own X (K K^T by wgmma, beta applied before the fp16 rounding, recursive
doubling) and Ag formed from it: other bytes, so its gradients are checked against the float64
oracle at DESIGN's tolerances, and their difference from the uncached backward's is bounded by
V5_BOUND, the tolerance itself. Both backward calls round every operand alike but A_r and Ag (and the
pre-pass's chunk states formed from Ag), and the two fp16 inverses differ by independent roundings of
the same size (2^-11 relative a merge; the warpgroup inverse's unit test bounds v5's error by 2e-3 of
max |X|). Measured on the H200 (session 37, 2 x 1000 (2,4)): with g = 0 in bf16 (every chunk folded,
where the inverse's rounding is the largest share of the error) the two backwards differ by 2.5e-3 to
5.0e-3 in every gradient, in fp16 by at most 6.8e-4; with decaying gates by at most 7.3e-4 (bf16) and
6.8e-5 (fp16). A half-tolerance bound failed once at 5.04e-3 (dk): the difference is of the size of
each backward's own error there, which the oracle check bounds; V5_BOUND catches a cache that is wrong
by more than that (a region misplaced or stale gives differences of order 1)."""

import math

import pytest
import torch

import flashgdn
from flashgdn.ops import backward_into, forward_into, new_cp_cache, new_inverse_cache

from conftest import kernels_launched, make_inputs, packed_varlen
from oracle import rel_l2
from test_backward import GRADS, TOL, check as check_grads, poisoned_grads, upstream

AUTO, OFF, ON = 0, 1, 2
V4, V5 = 4, 5  # forward_into's kernel: register state, inverse inside
V5_BOUND = dict(TOL)


def call_args(x, cu_seqlens=None):
    q = x["q"]
    return (q, x["k"], x["v"], x["g"], x["beta"], x["initial_state"], cu_seqlens, q.shape[-1] ** -0.5)


def forward_filling_cache(x, cu_seqlens=None, cu_seqlens_cpu=None, mode=AUTO, segment_chunks=0, cp_cache=None,
                          kernel=0):
    """The forward with its inverse cache (poisoned first: 0xFF bytes are NaN in fp16, bf16 and fp32,
    so that a region the forward does not write shows in the backward); kernel: forward_into's (0: the
    automatic choice). Returns (o, cache)."""
    args = call_args(x, cu_seqlens)
    options = dict(cu_seqlens_cpu=cu_seqlens_cpu, context_parallel=mode, cp_segment_chunks=segment_chunks)
    cache = new_inverse_cache(*args, **options)
    assert cache is not None, "this forward is not decode-sized: it must have an inverse cache"
    assert cache.dtype == torch.uint8 and cache.dim() == 1
    cache.fill_(0xFF)
    o = torch.full_like(x["v"], float("nan"))
    forward_into(o, None, *args, cp_cache=cp_cache, inverse_cache=cache, kernel=kernel, **options)
    return o, cache


def forward_plain(x, cu_seqlens=None, cu_seqlens_cpu=None, mode=AUTO, segment_chunks=0, kernel=0):
    o = torch.full_like(x["v"], float("nan"))
    forward_into(o, None, *call_args(x, cu_seqlens), cu_seqlens_cpu=cu_seqlens_cpu, context_parallel=mode,
                 cp_segment_chunks=segment_chunks, kernel=kernel)
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


def assert_close_grads(got, want, what):
    """v5's cache: each gradient within V5_BOUND (relative L2) of the backward without the cache."""
    diffs = {name: rel_l2(got[name], want[name]) for name in GRADS if want[name] is not None}
    print(f"{what}: rel L2 from the uncached backward:", " ".join(f"{n}={e:.2e}" for n, e in diffs.items()))
    over = {n: e for n, e in diffs.items() if e > V5_BOUND[n]}
    assert not over, f"{what}: " + ", ".join(f"{n} {e:.2e} > {V5_BOUND[n]:.1e}" for n, e in over.items())


def fused_forwards(fn):
    """The fused forward kernels fn() launches (their demangled names)."""
    return {name for name in kernels_launched(fn) if "fused_forward" in name}


def keeps(name):
    """Whether a fused_forward_inv_kernel<Elem, kKeepsInverse> name (demangled, or mangled: Lb1E) is the
    keeping build."""
    compact = name.replace(" ", "")
    if "fused_forward_inv_kernel<" not in compact:
        return "Lb1E" in compact
    return compact.split("fused_forward_inv_kernel<", 1)[1].split(">", 1)[0].endswith(",true")


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


# ---- the inverse-inside forward (v5) keeping the cache ------------------------------------------------


@pytest.mark.parametrize("regime", ["zero", "strong", "model"])  # folded chunks (bf16), unfolded, both
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("with_dht", [True, False])
@pytest.mark.parametrize("with_h0", [True, False])
def test_v5_gradients_within_tolerance(seed, regime, dtype, with_dht, with_h0):
    """Batch mode without CP, v5 pinned (2 x 1000 (2,4): partial last chunks): o the same bits as the
    plain v5 forward's, the backward given v5's cache launches no chunk inverse, its gradients within
    the oracle's tolerance and within V5_BOUND of the uncached backward's. g = 0 folds every bf16 chunk
    (v5's state groups form no Ag there: the aux's store is the only one), strong decay none (fp16
    never folds).

    fp16's dh0 under strong decay with no dht (from the first tokens through gates of ~e^-11 a token)
    was 5.37e-2 off at rms 2.1e-7 with or without the cache (bench/dh0_strong_decay.py, session 37):
    the dS pass's gated fp16 operands in the subnormal range, shifted by a power of two since
    (backward_ds_pass.cuh gate_shift; test_backward.py test_dh0_strong_decay)."""
    x = make_inputs(2, 1000, 2, 4, regime=regime, dtype=dtype, initial_state=with_h0)
    do, dht = upstream(x, with_dht)
    o, cache = forward_filling_cache(x, mode=OFF, kernel=V5)
    assert torch.equal(o, forward_plain(x, mode=OFF, kernel=V5)), "keeping the inverse cache changed v5's o"
    grads = {}
    launched = kernels_launched(lambda: grads.update(backward(x, do, dht, mode=OFF, inverse_cache=cache)))
    assert not any("chunk_inverse_kernel" in name for name in launched), sorted(launched)
    check_grads(x, grads, do, dht)
    assert_close_grads(grads, backward(x, do, dht, mode=OFF), f"v5 {regime} {dtype}")


@pytest.mark.parametrize("host_copy", [False, True])
def test_v5_varlen(seed, host_copy):
    """v5 pinned on packed varlen (empty, 1-token, chunk-edge and long sequences, padding): every
    sequence's rows at its packed tokens (a 0xFF byte left unwritten is NaN in the gradients)."""
    x, cu = packed_varlen(2, 4)
    do, dht = upstream(x, cu_seqlens=cu)
    host = cu.cpu() if host_copy else None
    o, cache = forward_filling_cache(x, cu_seqlens=cu, cu_seqlens_cpu=host, mode=OFF, kernel=V5)
    assert torch.equal(o, forward_plain(x, cu_seqlens=cu, cu_seqlens_cpu=host, mode=OFF, kernel=V5))
    grads = backward(x, do, dht, cu_seqlens=cu, cu_seqlens_cpu=host, mode=OFF, inverse_cache=cache)
    check_grads(x, grads, do, dht, cu_seqlens=cu)
    assert_close_grads(grads, backward(x, do, dht, cu_seqlens=cu, cu_seqlens_cpu=host, mode=OFF), "v5 varlen")
    for name in ("dq", "dk", "dv", "dg", "dbeta"):
        assert (grads[name][:, int(cu[-1]):] == 0).all(), f"{name}: padding tokens must get zero gradients"


def test_v5_cache_under_backward_cp(seed):
    """The backward under CP (segments of 4 chunks) given v5's cache: its decay windows come from the
    window terms v5 wrote (the forward ran no CP)."""
    x = make_inputs(1, 4133, 2, 4, regime="mixed")
    do, dht = upstream(x)
    cut = dict(mode=ON, segment_chunks=4)
    _, cache = forward_filling_cache(x, mode=OFF, kernel=V5)
    grads = {}
    launched = kernels_launched(lambda: grads.update(backward(x, do, dht, inverse_cache=cache, **cut)))
    assert not any("chunk_inverse_kernel" in name for name in launched), sorted(launched)
    check_grads(x, grads, do, dht)
    assert_close_grads(grads, backward(x, do, dht, **cut), "v5 cache, backward CP")


def cache_regions(cache, x):
    """The cache of batch-mode inputs x as inverse_cache_layout lays it out (runtime/common.h): A_r's fp16
    rows and Ag [B T, Hv, 64], the gate records fp32 [chunks, Hv, 128], the window terms fp32 [chunks, Hv]."""
    B, T, Hv = x["v"].shape[0], x["v"].shape[1], x["v"].shape[2]
    chunks = B * ((T + 63) // 64)

    def align(n):
        return (n + 255) // 256 * 256

    rows_bytes = B * T * Hv * 64 * 2
    gated, gates = align(rows_bytes), 2 * align(rows_bytes)
    windows = gates + align(chunks * Hv * 128 * 4)
    assert cache.numel() == windows + align(chunks * Hv * 4), "inverse_cache_layout changed: update cache_regions"
    return (cache[:rows_bytes].view(torch.float16).view(B * T, Hv, 64),
            cache[gated:gated + rows_bytes].view(x["q"].dtype).view(B * T, Hv, 64),
            cache[gates:gates + chunks * Hv * 128 * 4].view(torch.float32).view(chunks, Hv, 128),
            cache[windows:windows + chunks * Hv * 4].view(torch.float32).view(chunks, Hv))


def inverse_f64(x):
    """Float64 X = (I + StrictLower(diag(beta) K K^T))^{-1} and Ag = G (.) X (.) 1 beta^T per (chunk,
    v-head), rows in the cache's order [B T, Hv, 64] (a partial chunk padded with k = beta = g = 0,
    its rows past the end dropped), the window terms [chunks, Hv] and the gate records [chunks, Hv, 128]
    (gcum in log2 units, then beta) with each gcum entry's bound for an fp32 sum of its 64 terms."""
    B, T, Hqk, Hv = x["k"].shape[0], x["k"].shape[1], x["k"].shape[2], x["v"].shape[2]
    C = (T + 63) // 64
    pad = C * 64 - T
    k = torch.nn.functional.pad(x["k"].double(), (0, 0, 0, 0, 0, pad))
    k = k.repeat_interleave(Hv // Hqk, dim=2).view(B, C, 64, Hv, 128).permute(0, 1, 3, 2, 4)  # [B, C, Hv, 64, 128]
    beta = torch.nn.functional.pad(x["beta"].double(), (0, 0, 0, pad)).view(B, C, 64, Hv).permute(0, 1, 3, 2)
    g = torch.nn.functional.pad(x["g"].double(), (0, 0, 0, pad)).view(B, C, 64, Hv).permute(0, 1, 3, 2)
    kk = k @ k.transpose(-1, -2)
    eye = torch.eye(64, dtype=torch.float64, device=k.device)
    inv = torch.linalg.inv(eye + torch.tril(beta[..., :, None] * kk, diagonal=-1))
    gcum = g.cumsum(-1)
    lower = torch.tril(torch.ones(64, 64, dtype=torch.bool, device=k.device))
    gate = torch.exp((gcum[..., :, None] - gcum[..., None, :]).masked_fill(~lower, float("-inf")))
    ag = gate * inv * beta[..., None, :]
    norms = torch.diagonal(kk, dim1=-2, dim2=-1)
    windows = g.sum(-1) + torch.log(torch.clamp((1 - beta * norms).abs(), min=1)).sum(-1)  # [B, C, Hv]

    def rows(t):  # [B, C, Hv, 64, 64] -> [B T, Hv, 64]
        return t.permute(0, 1, 3, 2, 4).reshape(B, C * 64, Hv, 64)[:, :T].reshape(B * T, Hv, 64)

    log2e = 1.0 / math.log(2.0)
    records = torch.cat([gcum * log2e, beta], -1).reshape(B * C, Hv, 128)
    sum_bound = 64 * 2.0**-24 * (g.abs().cumsum(-1) * log2e)  # 64 roundings of at most the partial sums' size
    record_bounds = torch.cat([sum_bound, torch.zeros_like(beta)], -1).reshape(B * C, Hv, 128)
    return rows(inv), rows(ag), windows.reshape(B * C, Hv), (records, record_bounds)


@pytest.mark.parametrize("regime", ["zero", "strong", "model"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cache_contents(seed, regime, dtype):
    """What v4 and v5 write, region by region, against float64 (2 x 1000 (2,4), partial last chunks):
    A_r's rows within 3e-3 of max |X| (chunk_inverse_test's bound for fp16 merges; warpgroup_inverse_test
    holds v5's to 2e-3; zeros above the diagonal exactly), Ag within that plus two unit roundoffs of each
    entry, the window terms within 1e-4; the gate records' betas exact and their gcum within an fp32
    sum's rounding. v4's come from the chunk inverse, v5's from chunk_gates_kernel: the same source
    lines (store_chunk_gates) compiled into two kernels, whose records differed in last bits on the H200
    (session 37; the compiler is free to contract the log2 scaling into the sums differently); the
    backward given a cache reads the records its forward ran on."""
    x = make_inputs(2, 1000, 2, 4, regime=regime, dtype=dtype)
    inv, ag, windows, (records, record_bounds) = inverse_f64(x)
    regions = {}
    for kernel in (V4, V5):
        _, cache = forward_filling_cache(x, mode=OFF, kernel=kernel)
        regions[kernel] = cache_regions(cache, x)
        got_rows, got_ag, got_records, got_windows = regions[kernel]
        upper = ~torch.tril(torch.ones(64, 64, dtype=torch.bool, device=inv.device))
        t = torch.arange(x["v"].shape[1], device=inv.device).repeat(x["v"].shape[0]) % 64  # row within its chunk
        above = upper[t][:, None, :].expand_as(inv)
        assert (got_rows[above] == 0).all() and (got_ag[above] == 0).all(), f"kernel {kernel}: nonzero above diagonal"
        bound = 3e-3 * inv.abs().max().item()
        err = (got_rows.double() - inv).abs()
        assert err.max().item() <= bound, f"kernel {kernel}: A_r rows off by {err.max().item():.3e} > {bound:.3e}"
        ulp = 2.0**-7 if dtype == torch.bfloat16 else 2.0**-10  # twice the unit roundoff
        err_ag = (got_ag.double() - ag).abs() - ulp * ag.abs()
        assert err_ag.max().item() <= bound, f"kernel {kernel}: Ag off by {err_ag.max().item():.3e} (past rounding)"
        assert torch.allclose(got_windows.double(), windows, rtol=1e-4, atol=1e-4), f"kernel {kernel}: window terms"
        err_records = (got_records.double() - records).abs() - record_bounds
        assert err_records.max().item() <= 0, f"kernel {kernel}: gate records off by {err_records.max().item():.3e}"


def test_v5_default_forward_unchanged(seed):
    """A v5 forward without a cache request runs the kernel without the cache's stores (the
    kKeepsInverse = false build) and the keeping one the other, with the same o and final state bit for
    bit; at 4 x 520 (2,16) (64 items) the automatic choice is v5, with or without the request."""
    x = make_inputs(4, 520, 2, 16, regime="model")
    args = call_args(x)
    results = {}
    for keep in (False, True):
        cache = new_inverse_cache(*args) if keep else None
        o, final = torch.full_like(x["v"], float("nan")), torch.full_like(x["initial_state"], float("nan"))
        forwards = fused_forwards(lambda: forward_into(o, final, *args, inverse_cache=cache))
        assert len(forwards) == 1 and "fused_forward_inv_kernel" in next(iter(forwards)), sorted(forwards)
        assert keeps(next(iter(forwards))) == keep, sorted(forwards)
        results[keep] = (o, final)
    assert torch.equal(results[True][0], results[False][0]), "o"
    assert torch.equal(results[True][1], results[False][1]), "final state"


def test_bad_arguments(seed):
    """Clear errors: no cache where the forward forms no reusable inverse (the inverse-inside kernel
    under CP, the fp32 inverse), a cache of the wrong size, dtype, alignment or rank, a cache given to
    a backward with inverse_fp32 or a shard phase."""
    x = make_inputs(2, 1000, 2, 4, regime="weak")
    args = call_args(x)
    cache = new_inverse_cache(*args, context_parallel=OFF)
    o = torch.empty_like(x["v"])
    with pytest.raises(flashgdn.InvalidArgumentError, match="inverse_cache: this call runs no chunk inverse"):
        forward_into(o, None, *args, context_parallel=ON, cp_segment_chunks=4, kernel=V5, inverse_cache=cache)
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
    # decode-sized calls (8 tokens a sequence) form no inverse at all
    y = make_inputs(4, 8, 2, 4, regime="weak")
    assert new_inverse_cache(*call_args(y)) is None


@pytest.mark.parametrize("kernel", [V4, V5])
def test_autograd_keeps_the_inverse_cache(seed, kernel):
    """chunk_gated_delta_rule under eager autograd keeps its forward's inverse cache: the backward
    launches no chunk inverse (with forward_cache=False it does); the gradients are the same bits after
    v4 (2 x 1000 (2,4): 8 items), within V5_BOUND after v5 (the automatic choice at 4 x 520 (2,16): 64
    items, over 40% of the SMs)."""
    from test_backward import INPUTS

    x = make_inputs(2, 1000, 2, 4, regime="mixed") if kernel == V4 else make_inputs(4, 520, 2, 16, regime="model")
    do, dht = upstream(x)
    results = {}
    for keep in (True, False):
        leaves = {n: t.clone().requires_grad_(True) for n, t in x.items()}
        outputs = []
        forwards = fused_forwards(lambda: outputs.extend(flashgdn.chunk_gated_delta_rule(
            **leaves, output_final_state=True, auto_cp=False, forward_cache=keep)))
        o, final = outputs
        assert forwards and all(("fused_forward_inv_kernel" in n) == (kernel == V5) for n in forwards), sorted(forwards)
        grads = []
        launched = kernels_launched(
            lambda: grads.extend(torch.autograd.grad((o, final), [leaves[n] for n in INPUTS], (do, dht))))
        results[keep] = dict(zip(GRADS, grads))
        inverted = any("chunk_inverse_kernel" in name for name in launched)
        assert inverted != keep, f"forward_cache={keep}: backward kernels {sorted(launched)}"
    check_grads(x, results[True], do, dht)
    if kernel == V4:
        assert_same_grads(results[True], results[False], "autograd")
    else:
        assert_close_grads(results[True], results[False], "autograd (v5)")
