"""Varlen batches longest first (ForwardParams::sequence_order): without CP and with more items (N Hv) than
SMs, the per-item kernels (v4, v5, the backward's pre-pass and dS pass) take the sequences in decreasing
length, v-heads fastest. Only which CTA runs an item changes, so o, the final states, checkpoints and
every gradient must equal the natural order's (FLASHGDN_SEQUENCE_ORDER=natural) bit for bit, and the
float64 oracle within tolerance; the kernels' grids (torch.profiler) show that the order was applied at
all: (1, Hv, N) by default, (N, Hv, 1) under natural. The batches mix empty, 1-, 63-, 64-, 65-token and
thousands-token sequences (the order's unit test: tests/gpu_unit/sequence_test.cu; the runtime's choice:
tests/cpu/test_sequence_order.cpp)."""

import pytest
import torch

import flashgdn
from flashgdn.ops import backward_into, forward_into, new_inverse_cache

from conftest import kernel_grids, make_inputs, packed_varlen
from test_backward import GRADS, check as check_grads, poisoned_grads, upstream
from test_forward import check as check_forward
from test_inverse_cache import fused_forwards, keeps as is_keeping

OFF = 1  # context_parallel: CP off (CP items keep the natural order)

# (lengths, Hqk, Hv): N Hv past the H200's 132 SMs
BATCHES = {
    # the backward table's 8k_8seq cut at (16, 32): its worst row
    "8k_8seq_16_32": ((161, 1928, 3157, 563, 1244, 229, 177, 733), 16, 32),
    "edges_8_32": ((1, 63, 64, 65, 0, 2900, 129, 1, 1500, 64, 0, 700), 8, 32),
    "40seq_16_64": ((3000, 1, 64, 63, 65, 0, 17, 128, 129, 900, 2, 64, 300, 5, 1100, 0, 63, 64, 65, 40,
                     1, 2048, 77, 64, 640, 1, 130, 64, 0, 255, 256, 257, 9, 64, 1000, 3, 64, 64, 511, 12), 16, 64),
}

V4, V5, DS_PASS = "fused_forward_rs_kernel", "fused_forward_inv_kernel", "backward_ds_pass_kernel"


def per_item_grids(fn):
    """{(name, grid)} of the per-item kernels fn() launches: v4 (the backward's pre-pass too), v5 and the
    dS pass."""
    return {(name, grid) for name, grid in kernel_grids(fn) if any(k in name for k in (V4, V5, DS_PASS))}


def assert_grids(grids, kernels, N, Hv, ordered):
    """Each of `kernels` launched, and every per-item kernel on the ordered grid (1, Hv, N) (ordered) or
    the natural one (N, Hv, 1): the order was applied, or not (equal results alone cannot tell)."""
    want = (1, Hv, N) if ordered else (N, Hv, 1)
    for kernel in kernels:
        assert any(kernel in name for name, _ in grids), f"{kernel} not launched: {sorted(grids)}"
    for name, grid in grids:
        assert grid == want, f"{name}: grid {grid}, want {want} ({'longest first' if ordered else 'natural order'})"


@pytest.fixture
def order(monkeypatch):
    """order("natural") forces the natural order for the calls after it; order(None) restores the default."""
    def set_order(value):
        if value is None:
            monkeypatch.delenv("FLASHGDN_SEQUENCE_ORDER", raising=False)
        else:
            monkeypatch.setenv("FLASHGDN_SEQUENCE_ORDER", value)
    return set_order


def run_forward(x, cu, kernel, cu_cpu=None, **options):
    N, Hv = cu.numel() - 1, x["v"].shape[2]
    o = torch.full_like(x["v"], float("nan"))
    final = torch.full((N, Hv, 128, 128), float("nan"), device="cuda")
    forward_into(o, final, x["q"], x["k"], x["v"], x["g"], x["beta"], x["initial_state"], cu, 128 ** -0.5,
                 cu_seqlens_cpu=cu_cpu, context_parallel=OFF, kernel=kernel, **options)
    return o, final


@pytest.mark.parametrize("kernel", [4, 5])
@pytest.mark.parametrize("batch", list(BATCHES))
def test_forward_bitwise(seed, order, batch, kernel):
    """The kernel's grid shows the order applied ((1, Hv, N); (N, Hv, 1) under natural), and o and the
    final states equal the natural order's."""
    lengths, hqk, hv = BATCHES[batch]
    x, cu = packed_varlen(hqk, hv, regime="model", lengths=lengths)
    runs = {}
    order("natural")
    grids = per_item_grids(lambda: runs.update(want=run_forward(x, cu, kernel)))
    assert_grids(grids, [V4 if kernel == 4 else V5], len(lengths), hv, ordered=False)
    order(None)
    grids = per_item_grids(lambda: runs.update(got=run_forward(x, cu, kernel)))
    assert_grids(grids, [V4 if kernel == 4 else V5], len(lengths), hv, ordered=True)
    got, want = runs["got"], runs["want"]
    for name, a, b in zip(("o", "final_state"), got, want):
        assert torch.equal(a, b), f"{name} differs from the natural order's"
    print(check_forward(x, *got, cu_seqlens=cu))
    assert (got[0][:, int(cu[-1]):] == 0).all(), "padding tokens must be written as zeros"


@pytest.mark.parametrize("kernel", [0, 4, 5])
def test_forward_host_copy_pools_and_checkpoints(seed, order, kernel):
    """With the host copy of cu_seqlens (auto kernel: the choice follows it), state pools read and
    written in place and checkpoints every 2 chunks: all equal to the natural order's."""
    lengths, hqk, hv = BATCHES["edges_8_32"]
    N = len(lengths)
    x, cu = packed_varlen(hqk, hv, regime="mixed", lengths=lengths)
    T = x["q"].shape[1]
    read = torch.tensor([(3 * n + 1) % (N + 2) if n % 4 else -1 for n in range(N)], dtype=torch.int32, device="cuda")
    write = torch.tensor([(3 * n + 1) % (N + 2) if n % 5 else -1 for n in range(N)], dtype=torch.int32,
                         device="cuda")
    pool = torch.randn(N + 2, hv, 128, 128, device="cuda")

    def run():
        state = pool.clone()
        ckpt = torch.full((T // 128, hv, 128, 128), float("nan"), device="cuda")
        o = torch.full_like(x["v"], float("nan"))
        forward_into(o, state, x["q"], x["k"], x["v"], x["g"], x["beta"], state, cu, 128 ** -0.5,
                     cu_seqlens_cpu=cu.cpu(), context_parallel=OFF, initial_state_indices=read,
                     final_state_indices=write, checkpoints=ckpt, checkpoint_chunks=2, kernel=kernel)
        return o, state, ckpt

    order("natural")
    want = run()
    order(None)
    got = run()
    for name, a, b in zip(("o", "pool", "checkpoints"), got, want):
        assert torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)), f"{name} differs from the natural order's"
    assert torch.isfinite(got[0]).all()


@pytest.mark.parametrize("keeps", [False, True])
def test_v5_bitwise(seed, order, keeps):
    """v5 under the order on the launcher's one-item grid (1, Hv, N), plain and keeping the inverse cache
    (keeps: the fused_forward_inv_kernel<..., true> build, checked by name): o and the final states, or o
    and the cache's bytes, equal the natural order's (grid (N, Hv)) bit for bit."""
    lengths, hqk, hv = BATCHES["edges_8_32"]
    x, cu = packed_varlen(hqk, hv, regime="model", lengths=lengths)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], x["initial_state"], cu, 128 ** -0.5)

    def run():
        if not keeps:
            return run_forward(x, cu, 5)
        cache = new_inverse_cache(*args, context_parallel=OFF)
        assert cache is not None
        cache.fill_(0xFF)
        o = torch.full_like(x["v"], float("nan"))
        forwards = fused_forwards(lambda: forward_into(o, None, *args, context_parallel=OFF, inverse_cache=cache,
                                                       kernel=5))
        assert len(forwards) == 1 and is_keeping(next(iter(forwards))), sorted(forwards)
        return o, cache

    order("natural")
    want = run()
    order(None)
    got = run()
    for name, a, b in zip(("o", "inverse cache" if keeps else "final_state"), got, want):
        assert torch.equal(a, b), f"{name} differs from the natural order's"
    if not keeps:
        print(check_forward(x, *got, cu_seqlens=cu))


def run_backward(x, do, dht, cu, inverse_cache=None):
    grads = poisoned_grads(x)
    backward_into(*(grads[n] for n in GRADS), *(x[n] for n in ("q", "k", "v", "g", "beta")), do, dht,
                  x["initial_state"], cu, 128 ** -0.5, context_parallel=OFF, inverse_cache=inverse_cache)
    return grads


def assert_same(got, want, what):
    for name in GRADS:
        if want[name] is not None:
            assert torch.equal(got[name], want[name]), f"{what}: {name} differs from the natural order's"


@pytest.mark.parametrize("with_dht", [True, False])
@pytest.mark.parametrize("batch", list(BATCHES))
def test_backward_bitwise(seed, order, batch, with_dht):
    """The pre-pass's and the dS pass's grids show the order applied, and every gradient equals the
    natural order's."""
    lengths, hqk, hv = BATCHES[batch]
    x, cu = packed_varlen(hqk, hv, regime="model", lengths=lengths)
    do, dht = upstream(x, with_dht=with_dht, cu_seqlens=cu)
    runs = {}
    order("natural")
    grids = per_item_grids(lambda: runs.update(want=run_backward(x, do, dht, cu)))
    assert_grids(grids, [V4, DS_PASS], len(lengths), hv, ordered=False)
    order(None)
    grids = per_item_grids(lambda: runs.update(got=run_backward(x, do, dht, cu)))
    assert_grids(grids, [V4, DS_PASS], len(lengths), hv, ordered=True)
    got, want = runs["got"], runs["want"]
    assert_same(got, want, batch)
    check_grads(x, got, do, dht, cu_seqlens=cu)
    for name in ("dq", "dk", "dv", "dg", "dbeta"):
        assert (got[name][:, int(cu[-1]):] == 0).all(), f"{name}: padding tokens must get zero gradients"


def test_backward_with_inverse_cache_bitwise(seed, order):
    """The backward given the forward's inverse cache runs its pre-pass right after the chunk table and
    the order (item_tables_pending: no early start): gradients equal the natural order's and the
    backward's without the cache. The forward is pinned to v4 (kernel 4, checked by name): only v4's
    cache gives the uncached backward's bits (v5's gives gradients within tolerance), so the last
    comparison must not follow the automatic kernel choice."""
    lengths, hqk, hv = BATCHES["8k_8seq_16_32"]
    x, cu = packed_varlen(hqk, hv, regime="model", lengths=lengths)
    do, dht = upstream(x, cu_seqlens=cu)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], x["initial_state"], cu, 128 ** -0.5)

    def forward_and_backward():
        cache = new_inverse_cache(*args, context_parallel=OFF)
        assert cache is not None, "a forward without CP forms a reusable inverse"
        cache.fill_(0xFF)
        o = torch.full_like(x["v"], float("nan"))
        forwards = fused_forwards(lambda: forward_into(o, None, *args, context_parallel=OFF, inverse_cache=cache,
                                                       kernel=4))
        assert len(forwards) == 1 and V4 in next(iter(forwards)), sorted(forwards)
        return o, run_backward(x, do, dht, cu, inverse_cache=cache)

    order("natural")
    want_o, want = forward_and_backward()
    order(None)
    got_o, got = forward_and_backward()
    assert torch.equal(got_o, want_o), "o differs from the natural order's"
    assert_same(got, want, "with the inverse cache")
    assert_same(got, run_backward(x, do, dht, cu), "with the inverse cache vs without")
    check_grads(x, got, do, dht, cu_seqlens=cu)


@pytest.mark.parametrize("value", ["NATURAL", "off", "0"])
def test_unknown_order_value_fails(seed, order, value):
    """FLASHGDN_SEQUENCE_ORDER takes "natural", "longest" or nothing: any other value fails the forward
    and the backward with an invalid-argument error naming it (a misspelt switch must not measure the
    default twice), batch mode too, where no order applies."""
    lengths, hqk, hv = BATCHES["edges_8_32"]
    x, cu = packed_varlen(hqk, hv, regime="model", lengths=lengths)
    do, dht = upstream(x, cu_seqlens=cu)
    order(value)
    with pytest.raises(flashgdn.InvalidArgumentError, match="FLASHGDN_SEQUENCE_ORDER"):
        run_forward(x, cu, 4)
    with pytest.raises(flashgdn.InvalidArgumentError, match="FLASHGDN_SEQUENCE_ORDER"):
        run_backward(x, do, dht, cu)
    batch = make_inputs(2, 200, 2, 4)
    o = torch.empty_like(batch["v"])
    with pytest.raises(flashgdn.InvalidArgumentError, match="FLASHGDN_SEQUENCE_ORDER"):
        forward_into(o, None, *(batch[n] for n in ("q", "k", "v", "g", "beta", "initial_state")), None, 128 ** -0.5)
