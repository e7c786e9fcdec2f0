"""cupy-fmha: fused multi-head attention forward and backward for CuPy arrays.

The backward pass follows AMD Composable Kernel's FMHA backward (ck_tile ``fmha_bwd_kernel.hpp``):
``dot_do_o``, ``dq_dk_dv`` (K/V resident per CTA, Q/dO/LSE/D streamed and double-buffered) and
``convert_dq``; the forward is FlashAttention-2's algorithm (Dao, 2023).
"""

from .mask import MaskSpec, Window, parse_mask, resolve_mask

__version__ = "0.1.0"


def __getattr__(name):  # lazy: importing the package must not need CuPy or a GPU
    if name in ("attention_forward", "attention_backward", "AttentionGrads", "AttentionGradsWithBias"):
        from . import api

        return getattr(api, name)
    if name == "backward_workspace_bytes":
        from .plan import backward_workspace_bytes

        return backward_workspace_bytes
    raise AttributeError(name)


__all__ = [
    "attention_forward",
    "attention_backward",
    "AttentionGrads",
    "AttentionGradsWithBias",
    "backward_workspace_bytes",
    "MaskSpec",
    "Window",
    "parse_mask",
    "resolve_mask",
    "__version__",
]
