"""The ctypes layer of the Python package (python/flashgdn/_lib.py) against the C ABI, without
torch: a small varlen problem in float64 through flashgdn_reference_forward, compared with a
pure-Python token recurrence, an invalid argument reported with its name, the measurement-only
timeline refused, and the ctypes mirrors' sizes against flashgdn_struct_sizes. Catches any drift
between the ctypes struct mirrors and src/capi/flashgdn_c.h. Run by ctest with FLASHGDN_LIBRARY
pointing at the built libflashgdn_c.so."""

import ctypes
import importlib.util
import math
import pathlib
import random
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("flashgdn_lib", ROOT / "python" / "flashgdn" / "_lib.py")
_lib = importlib.util.module_from_spec(spec)
spec.loader.exec_module(_lib)

K = V = 8
HQK, HV = 1, 2
LENGTHS = [0, 70, 5]
T = sum(LENGTHS) + 3  # 3 padding tokens
N = len(LENGTHS)


def f64_tensor(values, sizes):
    array = (ctypes.c_double * len(values))(*values)
    t = _lib.Tensor()
    t.data = ctypes.addressof(array)
    t.dtype = _lib.F64
    t.rank = len(sizes)
    stride = 1
    for i in reversed(range(len(sizes))):
        t.sizes[i] = sizes[i]
        t.strides[i] = stride
        stride *= sizes[i]
    return t, array


def naive(q, k, v, g, beta, h0, scale):
    """Token recurrence per (sequence, v-head); returns o [T][HV][V], final [N][HV][K][V]."""
    o = [[[0.0] * V for _ in range(HV)] for _ in range(T)]
    final = []
    bos = 0
    for n, length in enumerate(LENGTHS):
        heads = []
        for h in range(HV):
            hk = h // (HV // HQK)
            S = [row[:] for row in h0[n][h]]
            for t in range(bos, bos + length):
                decay = math.exp(g[t][h])
                kt, qt = k[t][hk], q[t][hk]
                for i in range(K):
                    for j in range(V):
                        S[i][j] *= decay
                r = [v[t][h][j] - sum(S[i][j] * kt[i] for i in range(K)) for j in range(V)]
                for i in range(K):
                    for j in range(V):
                        S[i][j] += beta[t][h] * kt[i] * r[j]
                o[t][h] = [scale * sum(S[i][j] * qt[i] for i in range(K)) for j in range(V)]
            heads.append(S)
        final.append(heads)
        bos += length
    return o, final


def main():
    sizes = (ctypes.c_size_t * len(_lib.MIRRORS))()
    assert _lib.lib.flashgdn_struct_sizes(sizes, len(sizes)) == len(_lib.MIRRORS)
    mirrored = [ctypes.sizeof(m) for m in _lib.MIRRORS]
    assert mirrored == list(sizes), f"ctypes mirrors {mirrored} against the C structs {list(sizes)}"
    rng = random.Random(20261129)

    def unit(n):
        x = [rng.gauss(0, 1) for _ in range(n)]
        s = math.sqrt(sum(e * e for e in x))
        return [e / s for e in x]

    q = [[unit(K) for _ in range(HQK)] for _ in range(T)]
    k = [[unit(K) for _ in range(HQK)] for _ in range(T)]
    v = [[[rng.gauss(0, 1) for _ in range(V)] for _ in range(HV)] for _ in range(T)]
    g = [[-rng.random() / 4 for _ in range(HV)] for _ in range(T)]
    beta = [[1 / (1 + math.exp(-rng.gauss(0, 1))) for _ in range(HV)] for _ in range(T)]
    h0 = [[[[rng.gauss(0, 1) for _ in range(V)] for _ in range(K)] for _ in range(HV)] for _ in range(N)]
    scale = 0.25  # exact in the float the C ABI carries

    flat = lambda nested: [x for a in nested for b in a for x in (b if isinstance(b, list) else [b])]
    c = _lib.Inputs()
    c.batch, c.seqlen, c.num_qk_heads, c.num_v_heads, c.head_dim_k, c.head_dim_v = 1, T, HQK, HV, K, V
    keep = []
    for name, values, sizes in (("q", flat(q), [1, T, HQK, K]), ("k", flat(k), [1, T, HQK, K]),
                                ("v", flat(v), [1, T, HV, V]), ("g", flat(g), [1, T, HV]),
                                ("beta", flat(beta), [1, T, HV]),
                                ("initial_state", [x for a in h0 for b in a for r in b for x in r], [N, HV, K, V])):
        t, array = f64_tensor(values, sizes)
        setattr(c, name, t)
        keep.append(array)
    cu = (ctypes.c_int64 * (N + 1))(*[sum(LENGTHS[:i]) for i in range(N + 1)])
    c.cu_seqlens, c.cu_seqlens_dtype, c.num_seqs = ctypes.addressof(cu), _lib.I64, N
    c.has_scale, c.scale = 1, scale
    out = _lib.ForwardOutputs()
    out.o, o_array = f64_tensor([float("nan")] * (T * HV * V), [1, T, HV, V])
    out.final_state, final_array = f64_tensor([float("nan")] * (N * HV * K * V), [N, HV, K, V])
    _lib.check(_lib.lib.flashgdn_reference_forward, ctypes.byref(c), ctypes.byref(out))

    ref_o, ref_final = naive(q, k, v, g, beta, h0, scale)
    ref_o_flat = [x for a in ref_o for b in a for x in b]
    ref_final_flat = [x for a in ref_final for b in a for r in b for x in r]
    worst = max(max(abs(a - b) for a, b in zip(o_array, ref_o_flat)),
                max(abs(a - b) for a, b in zip(final_array, ref_final_flat)))
    assert worst < 1e-10, f"C ABI reference differs from the Python recurrence by {worst:.3e}"

    c.num_v_heads = 3  # not a multiple of... and v's shape no longer matches
    try:
        _lib.check(_lib.lib.flashgdn_reference_forward, ctypes.byref(c), ctypes.byref(out))
    except _lib.InvalidArgumentError as error:
        assert "v" in error.message or "num_v_heads" in error.message, error.message
    else:
        raise AssertionError("an invalid problem was accepted")

    # The timeline exists only in measurement builds (-DFLASHGDN_TIMELINE=ON): here it is refused,
    # with the reason (not supported with kernels, not built without).
    try:
        _lib.check(_lib.lib.flashgdn_set_timeline, None)
    except _lib.FlashGDNError as error:
        assert error.code in (2, 3) and "timeline" in error.message, error.message
    else:
        raise AssertionError("flashgdn_set_timeline succeeded in a build without the timeline")
    print(f"c_abi_check: ok (max abs difference {worst:.2e}); flashgdn {_lib.lib.flashgdn_version().decode()}")


if __name__ == "__main__":
    sys.exit(main())
