"""Adapters that run the anchor libraries on the benchmark's inputs (torch, CUDA).

Each anchor is optional: imported if installed, else reported with a one-line reason (and its
published numbers, where FlashQLA published some, stand in, labelled). Every adapter takes the dict
of inputs.make_inputs (flashgdn's layouts: q, k [1,T,Hqk,128] bf16, v [1,T,Hv,128] bf16, raw log-space
g [1,T,Hv] fp32, beta [1,T,Hv] fp32, h0 [N,Hv,K,V] fp32, int32 cu_seqlens) and returns a callable that
makes one whole call of the library. Conversions to the anchor's own layouts are done once, outside
the callable, so they are not timed. Forward callables return (o [1,T,Hv,V], final state [N,Hv,K,V]);
backward callables return (dq, dk, dv, dg, dbeta, dh0) in the input layouts, dg with respect to the raw
gate g.

The API facts each adapter relies on are listed in its docstring with their source:
../shared/research/fla_flashinfer.md and ../shared/research/flashqla.md (the project's memos), checked
against the pinned wheels' sources (fla-core 0.6.0, flash-qla 0.1.3, flashinfer-python 0.7.4;
scripts/fetch_anchors.sh).
"""

from __future__ import annotations

import inspect
import os

# FLA must run its own Triton kernels: with flash_qla installed, FLA's dispatcher would otherwise route
# chunk_gated_delta_rule to FlashQLA (fla_flashinfer.md §1.4). Set before anything imports fla.
os.environ["FLA_DISABLE_BACKEND_DISPATCH"] = "1"

import torch  # noqa: E402

NAMES = ("q", "k", "v", "g", "beta", "initial_state")


def short_reason(exc: BaseException, limit: int = 160) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _leaves(x: dict) -> dict:
    return {n: x[n].detach().clone().requires_grad_() for n in NAMES}


class Anchor:
    name = ""              # CSV column prefix
    label = ""             # printed name
    has_backward = True

    def __init__(self):
        self.available, self.reason, self.version, self.note = False, "not loaded", "", ""

    def load(self) -> bool:
        try:
            self._import()
            self.available, self.reason = True, ""
        except Exception as exc:  # noqa: BLE001 - any reason the anchor cannot run
            self.available, self.reason = False, short_reason(exc)
        return self.available

    def _import(self):
        raise NotImplementedError

    def forward(self, inp: dict):
        raise NotImplementedError

    def backward(self, inp: dict):
        raise NotImplementedError

    def forward_backward(self, inp: dict):
        raise NotImplementedError


class FLA(Anchor):
    """flash-linear-attention (fla-core 0.6.0), Triton path.

    Facts relied on (fla_flashinfer.md §1.1, §1.3, §1.4; fla-core 0.6.0 as run on the H200 by
    bench/bench_forward.py and bench/bench_backward.py up to 7c6b158):
    - fla.ops.gated_delta_rule.chunk_gated_delta_rule(q, k, v, g, beta, scale, initial_state,
      output_final_state, cu_seqlens, chunk_indices=...): q, k [B,T,H,K], v [B,T,HV,V], g the raw
      per-token log decay [B,T,HV], beta post-sigmoid, cu_seqlens a LongTensor (B == 1); returns
      (o, final state fp32 [N,HV,K,V]). v-head i reads q/k head i // (HV/H), as flashgdn.
    - chunk_gated_delta_rule_fwd (low level, 0.6.0) returns (g_cumsum, o, A, final, h0, g_input);
      chunk_gated_delta_rule_bwd takes the cumsummed g and A and returns (dq, dk, dv, db, dg, dh0, ...)
      with dg w.r.t. the raw gate (reverse cumsum inside) and dq/dk summed over each head group.
    - fla.ops.utils.index.prepare_chunk_indices(cu_seqlens, 64) builds the chunk table outside the call.
    - FLA_DISABLE_BACKEND_DISPATCH=1 pins the Triton path (set at the top of this module).
    - On Hopper with Triton >= 3.4 and < 3.7.1, chunk_bwd_dqkwg raises (FLA #640, a Triton miscompile);
      the guard reads the module global fla.ops.common.chunk_o.TRITON_ABOVE_3_7_1 at call time. It is
      bypassed in this process only, and FLA's backward numbers are then labelled "timing only".
    """
    name, label = "fla", "FLA"

    def _import(self):
        import fla
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        from fla.ops.gated_delta_rule.chunk import chunk_gated_delta_rule_bwd, chunk_gated_delta_rule_fwd
        from fla.ops.utils.index import prepare_chunk_indices

        self.chunk, self.fwd, self.bwd, self.chunk_indices = (chunk_gated_delta_rule, chunk_gated_delta_rule_fwd,
                                                              chunk_gated_delta_rule_bwd, prepare_chunk_indices)
        self.version = f"fla {getattr(fla, '__version__', '?')} (Triton, FLA_DISABLE_BACKEND_DISPATCH=1)"
        try:
            import triton
            import fla.ops.common.chunk_o as chunk_o
        except Exception:  # noqa: BLE001 - no guard to bypass
            return
        if (getattr(chunk_o, "IS_NVIDIA_HOPPER", False) and getattr(chunk_o, "TRITON_ABOVE_3_4_0", False)
                and not getattr(chunk_o, "TRITON_ABOVE_3_7_1", True)):
            chunk_o.TRITON_ABOVE_3_7_1 = True
            self.note = f"backward timing only (FLA #640 Hopper guard bypassed: triton {triton.__version__} < 3.7.1)"

    def forward(self, inp):
        x, cu64, scale = inp["x"], inp["cu"].long(), inp["scale"]
        return lambda: self.chunk(**x, scale=scale, cu_seqlens=cu64, output_final_state=True)

    def backward(self, inp):
        x, cu64, scale = inp["x"], inp["cu"].long(), inp["scale"]
        ci = self.chunk_indices(cu64, 64)
        out = self.fwd(q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], scale=scale,
                       initial_state=x["initial_state"], output_final_state=True, cu_seqlens=cu64, chunk_indices=ci)
        g_cum, A = out[0], out[2]
        del out

        def call():
            dq, dk, dv, db, dg, dh0 = self.bwd(q=x["q"], k=x["k"], v=x["v"], g=g_cum, beta=x["beta"], A=A, scale=scale,
                                               initial_state=x["initial_state"], do=inp["do"], dht=inp["dht"],
                                               cu_seqlens=cu64, chunk_indices=ci)[:6]
            return dq, dk, dv, dg, db, dh0
        return call

    def forward_backward(self, inp):
        x, cu64, scale = inp["x"], inp["cu"].long(), inp["scale"]
        ci = self.chunk_indices(cu64, 64)
        leaves = _leaves(x)

        def call():
            o, ht = self.chunk(**leaves, scale=scale, output_final_state=True, cu_seqlens=cu64, chunk_indices=ci)
            return torch.autograd.grad((o, ht), [leaves[n] for n in NAMES], (inp["do"], inp["dht"]))
        return call


class FlashQLA(Anchor):
    """FlashQLA (flash-qla 0.1.3, TileLang 0.1.15).

    Facts relied on (flashqla.md §2.1-2.4 and §7.1, checked against flash_qla 0.1.3's
    flash_qla/ops/gated_delta_rule/chunk/__init__.py):
    - flash_qla.chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None,
      output_final_state=False, use_qk_l2norm_in_kernel=False, cu_seqlens=None, ..., auto_cp=True):
      FLA's layouts (q, k [B,T,Hqk,128], v [B,T,Hv,128], raw log-space g [B,T,Hv] fp32, cumsummed inside;
      beta post-sigmoid; states [N,Hv,K,V] fp32); B == 1 with cu_seqlens (int32 or int64; its published
      benchmark passes int32); K = V = 128 only; returns (o in q's dtype, final state fp32).
    - chunk_gated_delta_rule_fwd(q, k, v, g, beta, scale, initial_state, cu_seqlens, output_final_state,
      ...) -> (g_cumsum, A, o, h, final_state, cp_cache); its positional order differs from FLA's, so
      keywords are used.
    - chunk_gated_delta_rule_bwd(q, k, v, g_cumsum, beta, A, do, dht, scale, initial_state, cu_seqlens,
      ..., cp_cache=None) -> (dq, dk, dv, db, dg, dh0): db before dg; dht fp32; dg w.r.t. the raw gate
      (reverse cumsum inside); dq/dk group-summed. Its published bwd rows time exactly this call after
      its own forward, with cp_cache None (CP pre-processing included).
    - Auto intra-card CP plans on the host and caches the plan per cu_seqlens tensor, so the warm-up
      calls before the CUDA-graph capture keep its host sync out of the captured call.
    """
    name, label = "flashqla", "FlashQLA"

    def _import(self):
        import flash_qla
        import tilelang

        self.mod = flash_qla
        self.version = f"flash_qla {flash_qla.__version__} tilelang {tilelang.__version__}"

    def forward(self, inp):
        x, cu, scale = inp["x"], inp["cu"], inp["scale"]
        return lambda: self.mod.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], scale=scale,
                                                       initial_state=x["initial_state"], output_final_state=True,
                                                       cu_seqlens=cu)

    def backward(self, inp):
        x, cu, scale = inp["x"], inp["cu"], inp["scale"]
        g_cum, A = self.mod.chunk_gated_delta_rule_fwd(q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"],
                                                       scale=scale, initial_state=x["initial_state"], cu_seqlens=cu,
                                                       output_final_state=True)[:2]

        def call():
            dq, dk, dv, db, dg, dh0 = self.mod.chunk_gated_delta_rule_bwd(
                q=x["q"], k=x["k"], v=x["v"], g=g_cum, beta=x["beta"], A=A, do=inp["do"], dht=inp["dht"],
                scale=scale, initial_state=x["initial_state"], cu_seqlens=cu)
            return dq, dk, dv, dg, db, dh0
        return call

    def forward_backward(self, inp):
        x, cu, scale = inp["x"], inp["cu"], inp["scale"]
        leaves = _leaves(x)

        def call():
            o, ht = self.mod.chunk_gated_delta_rule(*(leaves[n] for n in NAMES[:5]), scale=scale,
                                                    initial_state=leaves["initial_state"], output_final_state=True,
                                                    cu_seqlens=cu)
            return torch.autograd.grad((o, ht), [leaves[n] for n in NAMES], (inp["do"], inp["dht"]))
        return call


class FlashInfer(Anchor):
    """FlashInfer GDN prefill (flashinfer-python 0.7.4, CuTe DSL on SM90).

    Facts relied on (fla_flashinfer.md §4.2, §4.4 and §4.7, checked against flashinfer-python 0.7.4's
    flashinfer/gdn_prefill.py):
    - flashinfer.gdn_prefill.chunk_gated_delta_rule(q, k, v, g, beta, scale, initial_state,
      output_final_state, cu_seqlens, ..., use_cp="auto", ..., max_seqlen=None, ...): varlen only, no
      batch dimension: q, k [T,Hqk,D], v [T,Hv,D], contiguous; cu_seqlens int32 or int64, mandatory
      (int64 passed: the dtype the SM90 DSL wrapper documents; its kernels are compiled per dtype).
    - g is alpha, the linear-space decay exp(log gate) in (0, 1], fp32 [T, Hv] (passing FLA's log-space g
      gives NaN, flashinfer #2490); the kernel takes log2(alpha + 1e-10) itself. (0.7.4 also accepts
      gate_domain="log", but then materialises alpha with an extra kernel inside the call; alpha is
      made here, untimed, which is the kernel's native input.)
    - beta fp32, post-sigmoid, [T, Hv]. States are [N, Hv, V, K] (V-major), fp32 here; returns
      (o [T,Hv,D], final state [N,Hv,V,K]).
    - No backward and no autograd anywhere in FlashInfer GDN: bwd/fwdbwd rows have no FlashInfer time.
    - use_cp="auto" routes low-parallelism calls to its SM90 context-parallel path; max_seqlen (0.7.x) is a
      host-side bound for the CP grids (default the total length); the exact maximum is passed where the
      installed version takes it, which can only help FlashInfer.
    - alpha = exp(g) loses nothing for g >= -18 (alpha >= 1e-8); below that the 1e-10 floor only changes
      a decay that is already < 1e-8.
    """
    name, label, has_backward = "flashinfer", "FlashInfer", False

    def _import(self):
        import flashinfer
        import flashinfer.gdn_kernels as kernels
        from flashinfer.gdn_prefill import chunk_gated_delta_rule

        if getattr(kernels, "chunk_gated_delta_rule_sm90", None) is None:
            # flashinfer swallows this import's error and fails only when called: surface the reason now
            import flashinfer.gdn_kernels.delta_rule_dsl.delta_rule_sm90  # noqa: F401
            raise ImportError("flashinfer's SM90 GDN prefill kernel is unavailable")
        self.fn = chunk_gated_delta_rule
        self.takes_max_seqlen = "max_seqlen" in inspect.signature(chunk_gated_delta_rule).parameters
        self.version = f"flashinfer {flashinfer.__version__}"

    def forward(self, inp):
        x, cu, scale = inp["x"], inp["cu"].long(), inp["scale"]
        q, k, v = (x[n][0] for n in ("q", "k", "v"))                     # [T,H,D] views, contiguous
        alpha = torch.exp(x["g"][0]).contiguous()                         # linear-space gate [T,Hv]
        beta = x["beta"][0].contiguous()
        h0 = x["initial_state"].transpose(-1, -2).contiguous()           # [N,Hv,V,K]
        extra = dict(max_seqlen=max(inp["lengths"])) if self.takes_max_seqlen else {}

        def call():
            o, ht = self.fn(q, k, v, g=alpha, beta=beta, scale=scale, initial_state=h0, output_final_state=True,
                            cu_seqlens=cu, **extra)
            return o.unsqueeze(0), ht.transpose(-1, -2)
        return call


ALL = (FLA, FlashQLA, FlashInfer)


def load(names: list[str]) -> list[Anchor]:
    """Anchors by name (fla, flashqla, flashinfer), each loaded (check .available and .reason)."""
    out = []
    for cls in ALL:
        if cls.name in names:
            anchor = cls()
            anchor.load()
            out.append(anchor)
    return out
