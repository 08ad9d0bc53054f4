"""ctypes binding of flashgdn's C ABI (src/capi/flashgdn_c.h). Torch-free."""

from __future__ import annotations

import ctypes
import os
import pathlib

# flashgdn::DType
BF16, F16, F32, F64, I32, I64, U8 = range(7)
# flashgdn::StatusCode
STATUS_NAMES = {0: "ok", 1: "invalid argument", 2: "not supported", 3: "not built",
                4: "CUDA error", 5: "workspace too small"}


class Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int32), ("rank", ctypes.c_int32),
                ("sizes", ctypes.c_int64 * 4), ("strides", ctypes.c_int64 * 4)]


class Inputs(ctypes.Structure):
    _fields_ = [("batch", ctypes.c_int64), ("seqlen", ctypes.c_int64),
                ("num_qk_heads", ctypes.c_int32), ("num_v_heads", ctypes.c_int32),
                ("head_dim_k", ctypes.c_int32), ("head_dim_v", ctypes.c_int32),
                ("q", Tensor), ("k", Tensor), ("v", Tensor), ("g", Tensor), ("beta", Tensor),
                ("initial_state", Tensor),
                ("cu_seqlens", ctypes.c_void_p), ("cu_seqlens_dtype", ctypes.c_int32),
                ("num_seqs", ctypes.c_int64), ("cu_seqlens_host", ctypes.c_void_p),
                ("state_v_first", ctypes.c_int32), ("has_scale", ctypes.c_int32),
                ("scale", ctypes.c_float), ("use_qk_l2norm_in_kernel", ctypes.c_int32),
                ("context_parallel", ctypes.c_int32), ("cp_segment_chunks", ctypes.c_int64),
                ("cp_decay_threshold", ctypes.c_float), ("initial_state_indices", Tensor)]


class ForwardOutputs(ctypes.Structure):
    _fields_ = [("o", Tensor), ("final_state", Tensor), ("final_state_indices", Tensor), ("checkpoints", Tensor),
                ("checkpoint_chunks", ctypes.c_int64), ("token_states", Tensor), ("shard_phase", ctypes.c_int32),
                ("shard_maps", Tensor), ("cp_states", Tensor), ("cp_transitions", Tensor), ("inverse_cache", Tensor)]


class BackwardTensors(ctypes.Structure):
    _fields_ = [(name, Tensor) for name in
                ("d_o", "d_final_state", "dq", "dk", "dv", "dg", "dbeta", "d_initial_state")] + [
        ("shard_phase", ctypes.c_int32), ("shard_grad", Tensor), ("inverse_fp32", ctypes.c_int32),
        ("cp_states", Tensor), ("cp_transitions", Tensor), ("cp_segment_chunks", ctypes.c_int64),
        ("inverse_cache", Tensor)]


class FlashGDNError(RuntimeError):
    """A flashgdn call failed; `code` is the flashgdn::StatusCode value."""

    def __init__(self, code: int, message: str):
        super().__init__(f"flashgdn: {message} ({STATUS_NAMES.get(code, code)})")
        self.code = code
        self.message = message


class InvalidArgumentError(FlashGDNError, ValueError):
    """The arguments are wrong (shape, stride, alignment, aliasing, offsets): also a ValueError."""


class NotSupportedError(FlashGDNError, NotImplementedError):
    """Valid arguments that flashgdn does not implement (e.g. a head dim other than 128)."""


def _candidates():
    env = os.environ.get("FLASHGDN_LIBRARY")
    if env:
        yield pathlib.Path(env)
    here = pathlib.Path(__file__).resolve().parent
    yield here / "libflashgdn_c.so"
    for build in ("build", "build-release"):
        yield here.parent.parent / build / "libflashgdn_c.so"


def _load():
    tried = []
    for path in _candidates():
        tried.append(str(path))
        if path.is_file():
            lib = ctypes.CDLL(str(path))
            break
    else:
        raise ImportError("flashgdn: libflashgdn_c.so not found (tried " + ", ".join(tried) +
                          "); install with `pip install .` or set FLASHGDN_LIBRARY")
    P = ctypes.POINTER
    msg = [ctypes.c_char_p, ctypes.c_int]
    lib.flashgdn_version.restype = ctypes.c_char_p
    lib.flashgdn_has_kernels.restype = ctypes.c_int
    lib.flashgdn_forward_workspace_size.argtypes = [P(Inputs), P(ForwardOutputs), ctypes.c_int,
                                                    P(ctypes.c_size_t)] + msg
    lib.flashgdn_forward_cp_cache_shape.argtypes = [P(Inputs), P(ForwardOutputs), P(ctypes.c_int64),
                                                    P(ctypes.c_int64)] + msg
    lib.flashgdn_forward_inverse_cache_bytes.argtypes = [P(Inputs), P(ForwardOutputs), P(ctypes.c_size_t)] + msg
    lib.flashgdn_forward.argtypes = [P(Inputs), P(ForwardOutputs), ctypes.c_int, ctypes.c_void_p,
                                     ctypes.c_size_t, ctypes.c_void_p] + msg
    lib.flashgdn_backward_workspace_size.argtypes = [P(Inputs), P(BackwardTensors), P(ctypes.c_size_t)] + msg
    lib.flashgdn_backward.argtypes = [P(Inputs), P(BackwardTensors), ctypes.c_void_p, ctypes.c_size_t,
                                      ctypes.c_void_p] + msg
    lib.flashgdn_reference_forward.argtypes = [P(Inputs), P(ForwardOutputs)] + msg
    lib.flashgdn_set_timeline.argtypes = [ctypes.c_void_p] + msg
    lib.flashgdn_reference_backward.argtypes = [P(Inputs), P(BackwardTensors)] + msg
    for fn in (lib.flashgdn_forward_workspace_size, lib.flashgdn_forward_cp_cache_shape,
               lib.flashgdn_forward_inverse_cache_bytes, lib.flashgdn_forward,
               lib.flashgdn_backward_workspace_size,
               lib.flashgdn_backward,
               lib.flashgdn_reference_forward, lib.flashgdn_reference_backward, lib.flashgdn_set_timeline):
        fn.restype = ctypes.c_int
    _check_struct_sizes(lib, path)
    return lib


MIRRORS = (Tensor, Inputs, ForwardOutputs, BackwardTensors)  # in flashgdn_struct_sizes' order


def _check_struct_sizes(lib, path) -> None:
    """The ctypes mirrors against the library's structs (flashgdn_struct_sizes): a library and a binding
    from different versions must fail here, not read past a struct."""
    if not hasattr(lib, "flashgdn_struct_sizes"):
        raise ImportError(f"flashgdn: {path} predates flashgdn_struct_sizes; rebuild it with this package")
    lib.flashgdn_struct_sizes.argtypes = [ctypes.POINTER(ctypes.c_size_t), ctypes.c_int]
    lib.flashgdn_struct_sizes.restype = ctypes.c_int
    sizes = (ctypes.c_size_t * len(MIRRORS))()
    lib.flashgdn_struct_sizes(sizes, len(MIRRORS))
    for mirror, size in zip(MIRRORS, sizes):
        if ctypes.sizeof(mirror) != size:
            raise ImportError(f"flashgdn: {path} has a {size}-byte {mirror.__name__} where this package's is "
                              f"{ctypes.sizeof(mirror)} bytes: the library and the package are from different versions")


lib = _load()


def check(call, *args):
    """Run a C ABI call that ends in (msg, msg_len); raise FlashGDNError unless it returns 0."""
    buf = ctypes.create_string_buffer(1024)
    code = call(*args, buf, len(buf))
    if code != 0:
        error = {1: InvalidArgumentError, 2: NotSupportedError}.get(code, FlashGDNError)
        raise error(code, buf.value.decode(errors="replace"))
