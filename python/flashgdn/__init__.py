"""flashgdn: Gated Delta Network chunked-prefill kernels for NVIDIA Hopper."""

from ._lib import FlashGDNError, InvalidArgumentError, NotSupportedError, lib as _clib
from .ops import chunk_gated_delta_rule, chunk_gated_delta_rule_bwd, chunk_gated_delta_rule_fwd

__version__ = _clib.flashgdn_version().decode()
has_kernels = bool(_clib.flashgdn_has_kernels())

__all__ = ["chunk_gated_delta_rule", "chunk_gated_delta_rule_bwd", "chunk_gated_delta_rule_fwd", "FlashGDNError", "InvalidArgumentError",
           "NotSupportedError", "has_kernels"]
