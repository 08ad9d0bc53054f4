"""Intra-card context parallelism (auto-CP), forward and backward, on the GPU: CP forced on with
short segments so that every code path runs (decay windows, exact transitions M, the serial
corrections, varlen segment tables, in-place states), against the float64 oracle and against the
same call without CP."""

import pytest
import torch

import flashgdn
from flashgdn.bench.timing import capture_graph
from flashgdn.ops import forward_into

from conftest import REGIMES, make_inputs, packed_varlen
from oracle import rel_l2
from test_forward import check

AUTO, OFF, ON = 0, 1, 2


def run(x, mode, segment_chunks=0, cu_seqlens=None, cu_seqlens_cpu=None, l2norm=False, threshold=-10.0,
        final=None, state_v_first=False):
    """Forward into NaN-filled outputs with the given CP mode; returns (o, final_state)."""
    q, v = x["q"], x["v"]
    N = q.shape[0] if cu_seqlens is None else cu_seqlens.numel() - 1
    o = torch.full_like(v, float("nan"))
    if final is None:
        final = torch.full((N, v.shape[2], 128, 128), float("nan"), device=q.device)
    forward_into(o, final, q, x["k"], v, x["g"], x["beta"], x["initial_state"], cu_seqlens, q.shape[-1] ** -0.5,
                 l2norm, state_v_first, False, cu_seqlens_cpu, mode, segment_chunks, threshold)
    return o, final


@pytest.mark.parametrize("regime", REGIMES)
@pytest.mark.parametrize("with_h0", [True, False])
def test_regimes_forced_on(seed, regime, with_h0):
    """Segments of 4 chunks over 4133 tokens (17 segments, the last partial), every gate regime:
    g == 0 heads take the exact-M path, strong decay the shortest windows."""
    x = make_inputs(1, 4133, 2, 4, regime=regime, initial_state=with_h0)
    o, final = run(x, ON, segment_chunks=4)
    err_o, err_s = check(x, o, final)
    o_ref, final_ref = run(x, OFF)
    # Both are within 0.5% of the oracle with independent bf16 roundings: their gap is up to ~sqrt(2) x.
    print(f"vs oracle o={err_o:.2e} state={err_s:.2e}; vs no CP o={rel_l2(o, o_ref):.2e} "
          f"state={rel_l2(final, final_ref):.2e}")
    assert rel_l2(o, o_ref) <= 1e-2 and rel_l2(final, final_ref) <= 1e-2


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("host_copy", [False, True])
def test_varlen(seed, index_dtype, host_copy):
    """Sequences shorter than a segment, empty ones, odd boundaries, padding past cu_seqlens[-1];
    without the host copy the segment count is a device-side bound."""
    x, cu = packed_varlen(2, 4, index_dtype=index_dtype)
    o, final = run(x, ON, segment_chunks=3, cu_seqlens=cu, cu_seqlens_cpu=cu.cpu() if host_copy else None)
    check(x, o, final, cu_seqlens=cu)
    assert (o[:, int(cu[-1]):] == 0).all(), "padding tokens must be written as zeros"
    if x["initial_state"] is not None:  # empty sequences: final state = initial state
        for n in (0, 8):
            assert torch.equal(final[n], x["initial_state"][n])


def test_batch_mode_and_gva(seed):
    x = make_inputs(3, 2000, 2, 8, regime="model")
    o, final = run(x, ON, segment_chunks=5)
    check(x, o, final)


def test_state_v_first_fp16_bf16_beta(seed):
    x = make_inputs(1, 2500, 2, 4, regime="mixed", dtype=torch.float16)
    x["initial_state"] = x["initial_state"].transpose(-1, -2).contiguous()  # [N, Hv, V, K]
    x["beta"] = x["beta"].bfloat16()
    o, final = run(x, ON, segment_chunks=4, state_v_first=True)
    check(x, o, final, state_v_first=True)
    h0 = x["initial_state"].clone()  # in place, V-first
    o, final = run(x, ON, segment_chunks=4, state_v_first=True, final=x["initial_state"])
    check(dict(x, initial_state=h0), o, final, state_v_first=True)


def test_in_place_state(seed):
    """final_state aliasing initial_state: the last segment's CTA writes the state the first
    segment's reads, so the correction copies h0 before the main pass."""
    x = make_inputs(1, 3000, 2, 4, regime="weak")
    h0 = x["initial_state"].clone()
    expected = dict(x, initial_state=h0.clone())
    o, final = run(x, ON, segment_chunks=4, final=x["initial_state"])
    assert final.data_ptr() == x["initial_state"].data_ptr()
    check(expected, o, final)


def test_unnormalised_keys(seed):
    """Keys not L2-normalised: the window bound includes max(1, |1 - beta |k|^2|), so the result
    stays exact to tolerance (and the in-kernel L2 norm takes the normalised-keys path)."""
    x = make_inputs(1, 3000, 2, 4, regime="strong", normalize=False)
    x["k"] = (x["k"].float() * 0.15).to(x["k"].dtype)  # |k|^2 ~ 2.9: beta |k|^2 > 2 for many tokens
    x["q"] = (x["q"].float() * 0.15).to(x["q"].dtype)
    o, final = run(x, ON, segment_chunks=4)
    check(x, o, final)
    y = make_inputs(1, 3000, 2, 4, regime="model", normalize=False)
    o, final = run(y, ON, segment_chunks=4, l2norm=True)
    check(y, o, final, l2norm=True)


def test_truncation_error_bounded(seed):
    """Weak gates (about -3 per chunk): with a loose threshold (-0.5, windows of one chunk that keep
    up to e^-0.5 of the dropped state) the truncation shows; with the default (-10: the whole 4-chunk
    segment, exact M) it does not: the window rule, not luck, keeps CP exact."""
    x = make_inputs(1, 4096, 2, 4, regime="weak")
    o_ref, _ = run(x, OFF)
    o_tight, _ = run(x, ON, segment_chunks=4)
    o_loose, _ = run(x, ON, segment_chunks=4, threshold=-0.5)
    tight, loose = rel_l2(o_tight, o_ref), rel_l2(o_loose, o_ref)
    print(f"CP vs no CP: threshold -10: {tight:.2e}, threshold -0.5: {loose:.2e}")
    assert tight <= 1e-2
    assert loose > max(2e-3, 5 * tight)


def test_auto_plan(seed):
    """The planner's choice (one long sequence, few heads: CP on) is correct whatever it picks."""
    x = make_inputs(1, 32768, 1, 2, regime="mixed")
    o, final = run(x, AUTO)
    check(x, o, final)
    o2, final2 = flashgdn.chunk_gated_delta_rule(**x, output_final_state=True, auto_cp=False)
    print(f"auto vs off: o {rel_l2(o, o2):.2e} state {rel_l2(final, final2):.2e}")
    assert not torch.equal(o, o2), "the planner kept CP off for 1 x 32768 tokens x 2 heads"


def test_python_switch_and_bad_arguments(seed):
    x = make_inputs(1, 1000, 2, 4, regime="weak")
    o_on, f_on = flashgdn.chunk_gated_delta_rule(**x, output_final_state=True, auto_cp=True, cp_segment_chunks=2)
    check(x, o_on, f_on)
    with pytest.raises(ValueError, match="cp_segment_chunks"):
        flashgdn.chunk_gated_delta_rule(**x, auto_cp=True, cp_segment_chunks=-1)
    for threshold in (1.0, 0.0, float("nan")):
        with pytest.raises(ValueError, match="cp_decay_threshold"):
            flashgdn.chunk_gated_delta_rule(**x, auto_cp=True, cp_decay_threshold=threshold)


def test_cuda_graph(seed):
    x = make_inputs(2, 2000, 2, 4, regime="mixed")
    static = {k: v.clone() for k, v in x.items()}
    graph, (o, final) = capture_graph(lambda: flashgdn.chunk_gated_delta_rule(
        **static, output_final_state=True, auto_cp=True, cp_segment_chunks=4))
    fresh = make_inputs(2, 2000, 2, 4, regime="model")
    for key in static:
        static[key].copy_(fresh[key])
    o.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    check(fresh, o, final)


# ── Backward CP ─────────────────────────────────────────────────────────────────────────────────

from test_backward import GRADS, check as check_grads, poisoned_grads, upstream  # noqa: E402
from flashgdn.ops import backward_into  # noqa: E402


def shard_phases(x, mode, segment_chunks=0, cu_seqlens=None, cu_seqlens_cpu=None):
    """Phase 1 (maps) then phase 2 (finish, from x's initial state) on one workspace, outputs
    NaN-filled first; returns (maps [2N, Hv, 128, 128], o, final_state)."""
    q, v = x["q"], x["v"]
    N = q.shape[0] if cu_seqlens is None else cu_seqlens.numel() - 1
    scale = q.shape[-1] ** -0.5
    maps = torch.full((2 * N, v.shape[2], 128, 128), float("nan"), device=q.device)
    options = dict(cu_seqlens_cpu=cu_seqlens_cpu, context_parallel=mode, cp_segment_chunks=segment_chunks)
    workspace = forward_into(None, None, q, x["k"], v, x["g"], x["beta"], None, cu_seqlens, scale,
                             shard_phase=1, shard_maps=maps, **options)
    o = torch.full_like(v, float("nan"))
    final = torch.full((N, v.shape[2], 128, 128), float("nan"), device=q.device)
    forward_into(o, final, q, x["k"], v, x["g"], x["beta"], x["initial_state"], cu_seqlens, scale,
                 shard_phase=2, workspace=workspace, **options)
    return maps, o, final


def shard_maps_f64(x, cu_seqlens=None):
    """E and M of every (sequence, v-head) from the float64 reference (exact M): [2N, Hv, 128, 128]."""
    xs = {n: x[n].double().cpu() for n in ("q", "k", "v", "g", "beta")}
    N = x["q"].shape[0] if cu_seqlens is None else cu_seqlens.numel() - 1
    maps = torch.empty(2 * N, x["v"].shape[2], 128, 128)
    cu = None if cu_seqlens is None else cu_seqlens.cpu().long()
    forward_into(None, None, xs["q"], xs["k"], xs["v"], xs["g"], xs["beta"], None, cu, x["q"].shape[-1] ** -0.5,
                 shard_phase=1, shard_maps=maps)
    return maps


def check_shard_maps(maps, ref, N):
    """E to the state tolerance; M against its largest possible size (the identity's norm), since
    the kernels zero it where a segment forgets its entering state (the reference keeps ~e^-10)."""
    assert torch.isfinite(maps).all(), "shard_maps has unwritten elements"
    maps = maps.cpu().double()
    err_e = rel_l2(maps[:N], ref[:N].double())
    identity_norm = (ref[N:].shape[0] * ref.shape[1] * 128) ** 0.5
    err_m = ((maps[N:] - ref[N:].double()).norm() / identity_norm).item()
    print(f"shard maps: E {err_e:.2e}, M {err_m:.2e} (of the identity's norm)")
    assert err_e <= 1e-2 and err_m <= 1e-2, f"E {err_e:.2e} M {err_m:.2e}"


@pytest.mark.parametrize("regime", REGIMES)
def test_shard_phases(seed, regime):
    """Inter-GPU CP's two phases on one GPU: the shard's maps (E, M) against the float64 reference,
    then the finish phase from an initial state against the oracle, with forced segments of 4
    chunks (windows and exact transitions across 6 segments, the last partial)."""
    x = make_inputs(2, 1500, 2, 4, regime=regime)
    maps, o, final = shard_phases(x, ON, segment_chunks=4)
    check_shard_maps(maps, shard_maps_f64(x), 2)
    print(check(x, o, final))


def test_shard_phases_one_segment_and_varlen(seed):
    """The planner's cut (here one segment per sequence: a short call), and varlen shards with an
    empty sequence (E = 0, M = I) and a one-token one, with and without the host lengths."""
    x = make_inputs(1, 300, 2, 4, regime="mixed")
    maps, o, final = shard_phases(x, AUTO)
    check_shard_maps(maps, shard_maps_f64(x), 1)
    check(x, o, final)
    lengths = [0, 700, 1, 65, 1300]
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32, device="cuda")
    x = make_inputs(1, sum(lengths) + 9, 2, 4, regime="mixed", N=len(lengths))
    for host in (cu.cpu(), None):
        maps, o, final = shard_phases(x, ON, segment_chunks=3, cu_seqlens=cu, cu_seqlens_cpu=host)
        check_shard_maps(maps, shard_maps_f64(x, cu), len(lengths))
        check(x, o, final, cu_seqlens=cu)
        assert (maps[0] == 0).all() and torch.equal(maps[len(lengths)], torch.eye(128, device="cuda").expand(4, -1, -1))


def run_backward(x, do, dht, mode, segment_chunks=0, cu_seqlens=None, cu_seqlens_cpu=None, threshold=-10.0):
    grads = poisoned_grads(x)
    backward_into(*(grads[n] for n in GRADS), *(x[n] for n in ("q", "k", "v", "g", "beta")), do, dht,
                  x["initial_state"], cu_seqlens, x["q"].shape[-1] ** -0.5, False, False, cu_seqlens_cpu, mode,
                  segment_chunks, threshold)
    return grads


GAP_TOL = dict(dq=1e-2, dk=1e-2, dv=1e-2, dg=2e-2, dbeta=2e-2, dh0=1e-2)


def assert_close_to_no_cp(grads, ref):
    """CP and no CP within the oracle tolerances of each other. (Under strong decay they can agree bit
    for bit: what a window leaves out is below fp32 rounding; test_backward_truncation_shows proves
    that the backward's CP path runs.)"""
    diffs = {n: rel_l2(grads[n], ref[n]) for n in GRADS if grads[n] is not None}
    print("CP vs no CP:", " ".join(f"{n}={e:.2e}" for n, e in diffs.items()))
    over = {n: e for n, e in diffs.items() if e > GAP_TOL[n]}
    assert not over, f"CP vs no CP over tolerance: {over}"


def backward_shard_phases(x, do, dht, mode, segment_chunks=0, cu_seqlens=None, cu_seqlens_cpu=None):
    """The backward's phase 1 (D) then phase 2 (from x's initial state and dht) on one workspace,
    outputs NaN-filled first; returns (D [N, Hv, 128, 128], the gradients)."""
    q, v = x["q"], x["v"]
    N = q.shape[0] if cu_seqlens is None else cu_seqlens.numel() - 1
    inputs = [x[n] for n in ("q", "k", "v", "g", "beta")]
    options = dict(cu_seqlens_cpu=cu_seqlens_cpu, context_parallel=mode, cp_segment_chunks=segment_chunks)
    reaching = torch.full((N, v.shape[2], 128, 128), float("nan"), device=q.device)
    workspace = backward_into(None, None, None, None, None, None, *inputs, do, None, None, cu_seqlens,
                              q.shape[-1] ** -0.5, shard_phase=1, shard_grad=reaching, **options)
    grads = poisoned_grads(x)
    backward_into(*(grads[n] for n in GRADS), *inputs, do, dht, x["initial_state"], cu_seqlens, q.shape[-1] ** -0.5,
                  shard_phase=2, workspace=workspace, **options)
    return reaching, grads


def shard_grad_f64(x, do, cu_seqlens=None):
    """D of every (sequence, v-head) from the float64 reference: [N, Hv, 128, 128]."""
    xs = [x[n].double().cpu() for n in ("q", "k", "v", "g", "beta")]
    N = x["q"].shape[0] if cu_seqlens is None else cu_seqlens.numel() - 1
    reaching = torch.empty(N, x["v"].shape[2], 128, 128)
    backward_into(None, None, None, None, None, None, *xs, do.double().cpu(), None, None,
                  None if cu_seqlens is None else cu_seqlens.cpu().long(), x["q"].shape[-1] ** -0.5, shard_phase=1,
                  shard_grad=reaching)
    return reaching.to(x["q"].device)


@pytest.mark.parametrize("regime", ["zero", "strong", "mixed"])
def test_backward_shard_phases(seed, regime):
    """Inter-GPU CP's backward phases on one GPU: D against the float64 reference, then every
    gradient of the finish phase (from an initial state and dht) against the oracle, with forced
    segments of 4 chunks; and varlen shards with an empty sequence (D = 0, dh0 = dht)."""
    x = make_inputs(2, 1500, 2, 4, regime=regime)
    do, dht = upstream(x)
    reaching, grads = backward_shard_phases(x, do, dht, ON, segment_chunks=4)
    assert torch.isfinite(reaching).all(), "shard_grad has unwritten elements"
    err = rel_l2(reaching, shard_grad_f64(x, do))
    print(f"shard grad D {err:.2e};", check_grads(x, grads, do, dht))
    assert err <= 1e-2, f"D rel L2 {err:.2e}"
    lengths = [0, 700, 1, 1300]
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32, device="cuda")
    x = make_inputs(1, sum(lengths) + 9, 2, 4, regime=regime, N=len(lengths))
    do, dht = upstream(x, cu_seqlens=cu)
    reaching, grads = backward_shard_phases(x, do, dht, ON, segment_chunks=3, cu_seqlens=cu, cu_seqlens_cpu=cu.cpu())
    err = rel_l2(reaching, shard_grad_f64(x, do, cu))
    print(f"varlen: shard grad D {err:.2e};", check_grads(x, grads, do, dht, cu_seqlens=cu))
    assert err <= 1e-2 and (reaching[0] == 0).all() and torch.equal(grads["dh0"][0], dht[0])


def test_backward_auto_plan(seed):
    """The backward's planner (its own cost model) on one long sequence with few heads cuts it, and
    the gradients agree with no CP within the oracle tolerances. (Mixed gates: head 0 has g == 0,
    so the exact-M path rounds differently from the serial pass: a cut shows as a difference.)"""
    x = make_inputs(1, 16384, 1, 2, regime="mixed")
    do, dht = upstream(x)
    ref = run_backward(x, do, dht, OFF)
    auto = run_backward(x, do, dht, AUTO)
    assert_close_to_no_cp(auto, ref)
    assert any(not torch.equal(auto[n], ref[n]) for n in GRADS if auto[n] is not None), "the planner did not cut"


def test_backward_truncation_shows(seed):
    """As test_truncation_error_bounded for the backward, with gates a quarter of "weak" (about -0.8 per
    chunk): a loose threshold (-0.5, one-chunk windows) drops about e^-0.8 of the carried state gradient,
    the default (-10) keeps all but e^-10. (At full "weak" gates the loose error, ~3e-3, was within 5x of
    CP's rounding difference, ~6e-4, on some seeds.)"""
    x = make_inputs(1, 4096, 2, 4, regime="weak")
    x["g"] = x["g"] / 4
    do, dht = upstream(x)
    ref = run_backward(x, do, dht, OFF)
    tight = run_backward(x, do, dht, ON, segment_chunks=4)
    loose = run_backward(x, do, dht, ON, segment_chunks=4, threshold=-0.5)
    err_tight, err_loose = rel_l2(tight["dk"], ref["dk"]), rel_l2(loose["dk"], ref["dk"])
    print(f"dk, CP vs no CP: threshold -10: {err_tight:.2e}, threshold -0.5: {err_loose:.2e}")
    assert err_tight <= 1e-2
    assert err_loose > max(2e-3, 5 * err_tight)


@pytest.mark.parametrize("regime", REGIMES)
@pytest.mark.parametrize("with_dht", [True, False])
@pytest.mark.parametrize("with_h0", [True, False])
def test_backward_regimes_forced_on(seed, regime, with_dht, with_h0):
    """Backward CP over 17 segments: leading windows, the dS* pass, the reverse correction with
    M^T where a head has no window (g == 0 heads; with dht also through the last segment)."""
    x = make_inputs(1, 4133, 2, 4, regime=regime, initial_state=with_h0)
    do, dht = upstream(x, with_dht)
    grads = run_backward(x, do, dht, ON, segment_chunks=4)
    check_grads(x, grads, do, dht)
    assert_close_to_no_cp(grads, run_backward(x, do, dht, OFF))


@pytest.mark.parametrize("decay_at", ["start", "end"])
def test_backward_window_direction(seed, decay_at):
    """Gates zero except one strongly decaying chunk at the start (or the end) of every 4-chunk
    segment: the backward's leading window is that one chunk in the first case (the forward's
    trailing window the whole segment), and the other way round in the second, so a window taken
    from the wrong end would drop undecayed state and break the result."""
    x = make_inputs(1, 4096, 2, 4, regime="zero")
    chunk = torch.arange(4096, device="cuda") // 64
    decaying = (chunk % 4 == 0) if decay_at == "start" else (chunk % 4 == 3)
    x["g"][0, decaying] = -0.5  # -32 per chunk
    do, dht = upstream(x)
    grads = run_backward(x, do, dht, ON, segment_chunks=4)
    check_grads(x, grads, do, dht)
    assert_close_to_no_cp(grads, run_backward(x, do, dht, OFF))
    o, final = run(x, ON, segment_chunks=4)
    check(x, o, final)


@pytest.mark.parametrize("cols", ["16", "32"])
def test_windows_and_transitions_interleaved(seed, cols, monkeypatch):
    """Within one head, segments with a window and segments with the exact transition M alternate:
    head h decays strongly in segment j when (j + h) % 3 == 0 and not at all otherwise, so the
    corrections see runs of M steps (prefetched one after another), M steps right after a window
    step (their start read from the copy's source) and windows after M steps, forward and backward,
    at both slice widths (FLASHGDN_CP_SLICE_COLS)."""
    monkeypatch.setenv("FLASHGDN_CP_SLICE_COLS", cols)
    x = make_inputs(1, 4133, 2, 4, regime="zero")
    segment = torch.arange(4133, device="cuda") // 256  # 4-chunk segments
    for h in range(4):
        x["g"][0, (segment + h) % 3 == 0, h] = -0.5  # -32 per chunk: one-chunk windows
    o, final = run(x, ON, segment_chunks=4)
    check(x, o, final)
    o_ref, final_ref = run(x, OFF)
    assert rel_l2(o, o_ref) <= 1e-2 and rel_l2(final, final_ref) <= 1e-2
    do, dht = upstream(x)
    grads = run_backward(x, do, dht, ON, segment_chunks=4)
    check_grads(x, grads, do, dht)
    assert_close_to_no_cp(grads, run_backward(x, do, dht, OFF))


@pytest.mark.parametrize("cols", ["16", "32"])
def test_corrections_past_one_flag_block(seed, cols, monkeypatch):
    """More segments in one sequence than the corrections hold apply-M flags for at once (4096,
    cp_kernels.cu's kFlagSteps): 4101 one-chunk segments with windows and exact transitions
    interleaved as above, so runs of M steps and copies cross the flag blocks' boundary (one block
    boundary forward, one backward); CP against no CP, forward and backward, at both slice widths."""
    monkeypatch.setenv("FLASHGDN_CP_SLICE_COLS", cols)
    chunks = 4101
    x = make_inputs(1, 64 * chunks, 1, 2, regime="zero")
    segment = torch.arange(64 * chunks, device="cuda") // 64
    for h in range(2):
        x["g"][0, (segment + h) % 3 == 0, h] = -0.5
    o, final = run(x, ON, segment_chunks=1)
    o_ref, final_ref = run(x, OFF)
    print(f"vs no CP o={rel_l2(o, o_ref):.2e} state={rel_l2(final, final_ref):.2e}")
    assert rel_l2(o, o_ref) <= 1e-2 and rel_l2(final, final_ref) <= 1e-2
    do, dht = upstream(x)
    assert_close_to_no_cp(run_backward(x, do, dht, ON, segment_chunks=1), run_backward(x, do, dht, OFF))


def test_backward_variants(seed):
    """V-first states, fp16, bf16 beta, int64 offsets, in-kernel L2 norm (windows read the
    normalised keys) under backward CP."""
    lengths = [0, 700, 1300, 5]
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int64, device="cuda")
    x = make_inputs(1, int(cu[-1]) + 9, 2, 4, regime="mixed", dtype=torch.float16, normalize=False, N=len(lengths))
    x["initial_state"] = x["initial_state"].transpose(-1, -2).contiguous()
    x["beta"] = x["beta"].bfloat16()
    do, dht = upstream(x)
    grads = poisoned_grads(x)
    backward_into(*(grads[n] for n in GRADS), *(x[n] for n in ("q", "k", "v", "g", "beta")), do, dht,
                  x["initial_state"], cu, 128 ** -0.5, True, True, cu.cpu(), ON, 3)
    check_grads(x, grads, do, dht, cu_seqlens=cu, l2norm=True, state_v_first=True)


@pytest.mark.parametrize("host_copy", [False, True])
def test_backward_varlen(seed, host_copy):
    x, cu = packed_varlen(2, 4)
    do, dht = upstream(x)
    grads = run_backward(x, do, dht, ON, segment_chunks=3, cu_seqlens=cu,
                         cu_seqlens_cpu=cu.cpu() if host_copy else None)
    check_grads(x, grads, do, dht, cu_seqlens=cu)
    for name in ("dq", "dk", "dv", "dg", "dbeta"):
        assert (grads[name][:, int(cu[-1]):] == 0).all(), f"{name}: padding tokens must get zero gradients"


def test_backward_batch_gva_and_autograd(seed):
    x = make_inputs(2, 1500, 2, 8, regime="model")
    do, dht = upstream(x)
    grads = run_backward(x, do, dht, ON, segment_chunks=5)
    check_grads(x, grads, do, dht)
    leaves = {n: t.clone().requires_grad_(True) for n, t in x.items()}
    o, final = flashgdn.chunk_gated_delta_rule(**leaves, output_final_state=True, auto_cp=True, cp_segment_chunks=5)
    ((o.float() * do.float()).sum() + (final * dht).sum()).backward()
    check_grads(x, {g: leaves[n].grad for g, n in zip(GRADS, ("q", "k", "v", "g", "beta", "initial_state"))}, do, dht)


@pytest.mark.parametrize("cols", ["16", "32"])
def test_correction_slice_widths(seed, cols, monkeypatch):
    """Both slice widths of the corrections (FLASHGDN_CP_SLICE_COLS forces 16 or 32 state columns a CTA;
    without it 16 where the chains fit one wave, as in the other tests here): forward and backward over
    17 segments with mixed gates (g == 0 heads take every M step, others copies) from an initial state
    and dht, against the oracle and no CP; then varlen with empty sequences (dh0 = dht)."""
    monkeypatch.setenv("FLASHGDN_CP_SLICE_COLS", cols)
    x = make_inputs(1, 4133, 2, 4, regime="mixed", initial_state=True)
    o, final = run(x, ON, segment_chunks=4)
    check(x, o, final)
    o_ref, final_ref = run(x, OFF)
    assert rel_l2(o, o_ref) <= 1e-2 and rel_l2(final, final_ref) <= 1e-2
    do, dht = upstream(x, True)
    grads = run_backward(x, do, dht, ON, segment_chunks=4)
    check_grads(x, grads, do, dht)
    assert_close_to_no_cp(grads, run_backward(x, do, dht, OFF))
    lengths = [0, 700, 1, 1300, 0]
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32, device="cuda")
    x = make_inputs(1, sum(lengths), 2, 4, regime="mixed", N=len(lengths), initial_state=True)
    o, final = run(x, ON, segment_chunks=3, cu_seqlens=cu, cu_seqlens_cpu=cu.cpu())
    check(x, o, final, cu_seqlens=cu)
    do, dht = upstream(x, True, cu_seqlens=cu)
    grads = run_backward(x, do, dht, ON, segment_chunks=3, cu_seqlens=cu, cu_seqlens_cpu=cu.cpu())
    check_grads(x, grads, do, dht, cu_seqlens=cu)
    assert torch.equal(grads["dh0"][0], dht[0]) and torch.equal(grads["dh0"][4], dht[4])


def test_correction_slice_width_override_reaches_the_launch(seed, monkeypatch):
    """FLASHGDN_CP_SLICE_COLS goes to the corrections' launch: a value other than 16 or 32 fails the
    call with an error naming the kernel (so the 16 and 32 of the tests above are the widths that
    ran). The backward fails at its forward recompute's cp_correction, before cp_grad_correction,
    which takes its width from the same function."""
    x = make_inputs(1, 1000, 2, 4, regime="mixed")
    monkeypatch.setenv("FLASHGDN_CP_SLICE_COLS", "24")
    with pytest.raises(RuntimeError, match="cp_correction"):
        run(x, ON, segment_chunks=4)
    do, dht = upstream(x)
    with pytest.raises(RuntimeError, match="correction"):  # its CP pre-pass runs cp_correction first
        run_backward(x, do, dht, ON, segment_chunks=4)
    monkeypatch.delenv("FLASHGDN_CP_SLICE_COLS")
    o, final = run(x, ON, segment_chunks=4)
    check(x, o, final)


# ---- the forward's CP cache, reused by the backward (BackwardProblem::cp_states, cp_transitions) ----

from conftest import kernels_launched  # noqa: E402
from flashgdn.ops import CpCache, new_cp_cache  # noqa: E402


def forward_with_cache(x, mode, segment_chunks=0, cu_seqlens=None, cu_seqlens_cpu=None, threshold=-10.0):
    """The forward with its CP cache (NaN-filled first, so that a segment state it does not write
    shows; without the host lengths the rows are a bound, the unused ones stay NaN); returns
    (o, the CpCache)."""
    q, v = x["q"], x["v"]
    args = (q, x["k"], v, x["g"], x["beta"], x["initial_state"], cu_seqlens, q.shape[-1] ** -0.5)
    options = dict(cu_seqlens_cpu=cu_seqlens_cpu, context_parallel=mode, cp_segment_chunks=segment_chunks,
                   cp_decay_threshold=threshold)
    cache = new_cp_cache(*args, **options)
    assert cache is not None, "this forward runs CP: it must have a cache"
    cache.states.fill_(float("nan"))
    cache.transitions.fill_(float("nan"))
    o = torch.full_like(v, float("nan"))
    forward_into(o, None, *args, cp_cache=cache, **options)
    if cu_seqlens is None or cu_seqlens_cpu is not None:
        assert torch.isfinite(cache.states).all(), "cp_states has segment states the forward did not write"
    return o, cache


def backward_with_cache(x, do, dht, cache, cu_seqlens=None, cu_seqlens_cpu=None, threshold=-10.0):
    grads = poisoned_grads(x)
    backward_into(*(grads[n] for n in GRADS), *(x[n] for n in ("q", "k", "v", "g", "beta")), do, dht,
                  x["initial_state"], cu_seqlens, x["q"].shape[-1] ** -0.5, False, False, cu_seqlens_cpu,
                  cp_decay_threshold=threshold, cp_cache=cache)
    return grads


@pytest.mark.parametrize("regime", ["zero", "strong", "mixed", "model"])
@pytest.mark.parametrize("with_dht", [True, False])
@pytest.mark.parametrize("with_h0", [True, False])
def test_backward_with_forward_cp_cache(seed, regime, with_dht, with_h0):
    """The backward given the forward's segment states and transitions (17 segments of 4 chunks):
    the gradients against the oracle and within the oracle tolerances of the backward that rebuilds
    them with the same cut (with dht the rebuild's state update is hi + lo, the forward's plain:
    close, not equal); the forward's o unchanged by keeping the cache; and both tensors are read:
    NaN states give non-finite gradients, NaN transitions too where heads have no window (g == 0)
    and nothing where every head has one (strong decay)."""
    x = make_inputs(1, 4133, 2, 4, regime=regime, initial_state=with_h0)
    do, dht = upstream(x, with_dht)
    o, cache = forward_with_cache(x, ON, segment_chunks=4)
    assert cache.segment_chunks == 4 and cache.states.shape == (17, 4, 128, 128)
    assert cache.transitions.shape == (17, 4, 128, 128)
    assert torch.equal(o, run(x, ON, segment_chunks=4)[0]), "keeping the cache changed the forward's o"

    grads = backward_with_cache(x, do, dht, cache)
    check_grads(x, grads, do, dht)
    assert_close_to_no_cp(grads, run_backward(x, do, dht, ON, segment_chunks=4))
    bad = backward_with_cache(x, do, dht, cache._replace(states=torch.full_like(cache.states, float("nan"))))
    assert not torch.isfinite(bad["dk"]).all(), "the backward did not read the given segment states"
    bad = backward_with_cache(x, do, dht, cache._replace(transitions=torch.full_like(cache.transitions, float("nan"))))
    if regime in ("zero", "mixed"):
        assert not torch.isfinite(bad["dk"]).all(), "the backward did not read the given transitions"
    elif regime == "strong":
        assert all(torch.equal(bad[n], grads[n]) for n in GRADS if grads[n] is not None), "windows need no M"


@pytest.mark.parametrize("host_copy", [False, True])
def test_backward_with_forward_cp_cache_varlen(seed, host_copy):
    """Varlen with empty, short and long sequences; without the host copy the segment count is a
    bound, and the cut is the forced one of the forward."""
    x, cu = packed_varlen(2, 4)
    do, dht = upstream(x, cu_seqlens=cu)
    host = cu.cpu() if host_copy else None
    _, cache = forward_with_cache(x, ON, segment_chunks=3, cu_seqlens=cu, cu_seqlens_cpu=host)
    grads = backward_with_cache(x, do, dht, cache, cu_seqlens=cu, cu_seqlens_cpu=host)
    check_grads(x, grads, do, dht, cu_seqlens=cu)
    assert_close_to_no_cp(grads, run_backward(x, do, dht, ON, segment_chunks=3, cu_seqlens=cu, cu_seqlens_cpu=host))
    for name in ("dq", "dk", "dv", "dg", "dbeta"):
        assert (grads[name][:, int(cu[-1]):] == 0).all(), f"{name}: padding tokens must get zero gradients"


def test_backward_with_forward_cp_cache_auto_plan_and_launches(seed):
    """The planner's own cut (one long sequence, few heads): the forward's cache has it, and the
    backward given it launches no forward correction, where the backward without it does."""
    x = make_inputs(1, 16384, 1, 2, regime="mixed")
    do, dht = upstream(x)
    _, cache = forward_with_cache(x, AUTO)
    grads = backward_with_cache(x, do, dht, cache)
    check_grads(x, grads, do, dht)
    assert_close_to_no_cp(grads, run_backward(x, do, dht, OFF))
    with_cache = kernels_launched(lambda: backward_with_cache(x, do, dht, cache))
    rebuilt = kernels_launched(lambda: run_backward(x, do, dht, ON, segment_chunks=cache.segment_chunks))
    assert not any("cp_correction_kernel" in name for name in with_cache), sorted(with_cache)
    assert any("cp_correction_kernel" in name for name in rebuilt), sorted(rebuilt)


def test_cp_cache_bad_arguments(seed):
    """Clear errors: a cache for a forward without CP, a cache of the wrong size, one tensor without
    the other, a cut without the cache, the wrong dtype, and a cache given to a shard phase."""
    x = make_inputs(1, 2000, 2, 4, regime="weak")
    q, v = x["q"], x["v"]
    args = (q, x["k"], v, x["g"], x["beta"], x["initial_state"], None, q.shape[-1] ** -0.5)
    assert new_cp_cache(*args, context_parallel=OFF) is None
    o = torch.empty_like(v)
    one = torch.empty(1, 4, 128, 128, device="cuda")
    with pytest.raises(flashgdn.InvalidArgumentError, match="cp_states: this call runs no intra-card CP"):
        forward_into(o, None, *args, context_parallel=OFF, cp_cache=CpCache(one, one.clone(), 4))
    cache = new_cp_cache(*args, context_parallel=ON, cp_segment_chunks=4)
    assert cache.states.shape == (8, 4, 128, 128) and cache.segment_chunks == 4
    forced = dict(context_parallel=ON, cp_segment_chunks=4)
    with pytest.raises(flashgdn.InvalidArgumentError, match="cp_states: 7 segments given"):
        forward_into(o, None, *args, **forced, cp_cache=CpCache(cache.states[:7], cache.transitions[:7], 4))
    with pytest.raises(flashgdn.InvalidArgumentError, match="cp_transitions: 7 segments, cp_states has 8"):
        forward_into(o, None, *args, **forced, cp_cache=cache._replace(transitions=cache.transitions[:7]))
    with pytest.raises(flashgdn.InvalidArgumentError, match="cp_states: dtype must be float32"):
        forward_into(o, None, *args, **forced, cp_cache=cache._replace(states=cache.states.bfloat16()))
    with pytest.raises(flashgdn.InvalidArgumentError, match="cp_states: the CP cache is cp_states and cp_transitions"):
        forward_into(o, None, *args, **forced, cp_cache=cache._replace(transitions=None))
    forward_into(o, None, *args, **forced, cp_cache=cache)
    do, dht = upstream(x)
    grads = poisoned_grads(x)
    outs = [grads[n] for n in GRADS]
    with pytest.raises(flashgdn.InvalidArgumentError, match="cp_states: give both"):
        backward_into(*outs, *args[:5], do, dht, *args[5:], cp_cache=cache._replace(segment_chunks=0))
    with pytest.raises(flashgdn.InvalidArgumentError, match="segments given, a cut of cp_segment_chunks 3"):
        backward_into(*outs, *args[:5], do, dht, *args[5:], cp_cache=cache._replace(segment_chunks=3))
    with pytest.raises(flashgdn.NotSupportedError, match="cp_states: not with shard phases"):
        backward_into(None, None, None, None, None, None, *args[:5], do, None, None, None, args[7], shard_phase=1,
                      shard_grad=torch.empty(1, 4, 128, 128, device="cuda"), cp_cache=cache)


def test_autograd_keeps_the_forward_cp_cache(seed):
    """chunk_gated_delta_rule under eager autograd keeps its forward's CP cache: the backward launches no
    forward correction (with forward_cache=False it rebuilds the states and does), and the gradients match
    the oracle either way."""
    from test_backward import INPUTS

    x = make_inputs(1, 16384, 1, 2, regime="mixed")
    do, dht = upstream(x)
    for keep in (True, False):
        leaves = {n: t.clone().requires_grad_(True) for n, t in x.items()}
        o, final = flashgdn.chunk_gated_delta_rule(**leaves, output_final_state=True, forward_cache=keep)
        grads = []
        launched = kernels_launched(
            lambda: grads.extend(torch.autograd.grad((o, final), [leaves[n] for n in INPUTS], (do, dht))))
        check_grads(x, dict(zip(GRADS, grads)), do, dht)
        corrected = any("cp_correction_kernel" in name for name in launched)
        assert corrected != keep, f"forward_cache={keep}: backward kernels {sorted(launched)}"
