"""Public API: attention forward and backward on CuPy arrays.

Forward: FlashAttention-2 (Dao, 2023). Backward: the three-kernel pipeline of AMD Composable
Kernel's FMHA backward (ck_tile ``fmha_bwd_kernel.hpp``): ``dot_do_o`` (D = rowsum(dO * O)),
``dq_dk_dv`` (K/V resident per CTA, Q/dO/LSE/D streamed; dQ added into an fp32 workspace, or
with ``deterministic=True`` stored into one slab per key block) and ``convert_dq`` (sum the slabs
and cast dQ; also sums dK/dV over each GQA group).

Each public function reads as three steps: resolve the arguments into a frozen plan
(:mod:`cupy_fmha.plan`, which runs every check through :mod:`cupy_fmha.validate`), build each
kernel pass's parameter struct (:mod:`cupy_fmha.params`, mirroring ``kernels/params.cuh``), and
launch. Batch mode (``bshd``/``bhsd``) and group mode (``thd``) share that path.

Arrays: CuPy arrays; NumPy arrays (copied to the current device); any object with
``__dlpack__`` (PyTorch tensors, JAX arrays: taken without a copy through ``cupy.from_dlpack``).
dtypes: float16 and bfloat16 (CuPy 14's native ``bfloat16``, i.e. ``ml_dtypes.bfloat16``; or,
for older CuPy, ``uint16`` arrays of raw bf16 bits with ``dtype="bfloat16"``). Every output
comes back in the inputs' dtype (uint16 bits for uint16 inputs), as a CuPy array.

Group mode (variable-length sequences, ``layout="thd"`` with ``cu_seqlens_q``/``cu_seqlens_k``):
sequences are packed along the token axis, q [total_q, nhead_q, d], k/v [total_k, nhead_k, d/dv];
each sequence is its own attention problem (masks and ALiBi use its own lengths; an elementwise
bias, broadcastable to [batch, nhead_q, max_seqlen_q, max_seqlen_k], is read at sequence b's
local positions, the top-left corner of plane b, and dBias comes back in the bias's shape, 0
where no sequence reaches). The kernels get max_seqlen_q/max_seqlen_k as their sequence lengths
(the row pitch of lse, D, the dQ workspace, all [batch, nhead_q, max_seqlen_q], and of the dS
workspace [batch, nhead_q, max_seqlen_q, max_seqlen_k]) and move every token-indexed pointer by
``cu_seqlens[b]`` rows; see ``kernels/varlen.cuh``.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from . import device
from . import launch as L
from . import params as P
from .compile import get_function
from .dbias import reduce_dbias
from .plan import BIAS_KIND, BwdPlan, FwdPlan, dbias_stored_directly, plan_backward, plan_forward
from .spec import dropout_mask_spec
from .validate import _BF16, check_out

__all__ = ["attention_forward", "attention_backward", "AttentionGrads", "AttentionGradsWithBias"]

LOG2E = 1.4426950408889634


class AttentionGrads(NamedTuple):
    """Gradients of the attention inputs, in the inputs' layout and dtype.

    dq: like q; dk: like k (nhead_k heads: summed over each GQA group); dv: like v.
    """

    dq: object
    dk: object
    dv: object


class AttentionGradsWithBias(NamedTuple):
    """What :func:`attention_backward` returns with ``return_dbias=True``: the three gradients of
    :class:`AttentionGrads` plus ``dbias``, the gradient of the elementwise bias with the bias's
    own shape and dtype, a fresh CuPy array.

    dq: like q; dk: like k; dv: like v; dbias: like bias.
    """

    dq: object
    dk: object
    dv: object
    dbias: object


# --------------------------------------------------------------------------- the device

_GPU_ERROR: list = []  # the reason no GPU is usable, once known


def _cupy():
    """CuPy, after checking once that a CUDA device is usable.

    Raises:
        RuntimeError: CuPy is missing or no GPU is usable (with the reason).
    """
    try:
        import cupy
    except Exception as exc:  # pragma: no cover - depends on the machine
        raise RuntimeError(
            "cupy-fmha's GPU API needs CuPy and a CUDA GPU; install cupy-fmha[cuda13] (or [cuda12]),"
            " or use cupy_fmha.reference for the NumPy implementation"
        ) from exc
    if not _GPU_ERROR:
        try:
            n = cupy.cuda.runtime.getDeviceCount()
            _GPU_ERROR.append("" if n > 0 else "no CUDA device found")
        except Exception as exc:  # noqa: BLE001 - CUDA runtime errors of every kind
            _GPU_ERROR.append(device.runtime_problem(exc))
    if _GPU_ERROR[0]:
        raise RuntimeError(f"cupy_fmha: no usable CUDA GPU ({_GPU_ERROR[0]}); "
                           "cupy_fmha.reference runs the same functions on the CPU")
    return cupy


_CC: dict = {}


def _cc(cp):
    """The current device's key for the backends (:func:`cupy_fmha.spec.backend_for`): its compute
    capability as an int (e.g. 90), or on ROCm (cupy-rocm) its gfx target (e.g. ``"gfx942"``)."""
    dev = cp.cuda.Device()
    cc = _CC.get(dev.id)
    if cc is None:
        from .backends import rocm

        if rocm.is_hip(cp):
            cc = _CC[dev.id] = rocm.device_target(cp, dev.id)
        else:
            cc = _CC[dev.id] = int(dev.compute_capability)
    return cc


_NATIVE_BF16: list = []


def _native_bf16(cp) -> bool:
    """Whether this CuPy holds ``bfloat16`` arrays (CuPy 14 and newer)."""
    if not _NATIVE_BF16:
        try:
            cp.empty(0, dtype=_BF16)
            _NATIVE_BF16.append(True)
        except Exception:  # noqa: BLE001 - older CuPy: TypeError / ValueError
            _NATIVE_BF16.append(False)
    return _NATIVE_BF16[0]


# --------------------------------------------------------------------------- arrays


def _adopt(name: str, a):
    """A CuPy array for an object with ``__dlpack__`` that is neither a CuPy nor a NumPy array
    (PyTorch, JAX): zero-copy through ``cupy.from_dlpack``. Anything else is returned as it is,
    for the checks to judge."""
    if a is None or isinstance(a, np.ndarray) or not hasattr(a, "__dlpack__"):
        return a
    cp = _cupy()
    if isinstance(a, cp.ndarray):
        return a
    try:
        return cp.from_dlpack(a)
    except Exception as exc:  # noqa: BLE001 - a host tensor, an unsupported dtype, ...
        try:
            return np.from_dlpack(a)
        except Exception:  # noqa: BLE001
            raise TypeError(f"{name}: could not take this {type(a).__module__}.{type(a).__name__} through "
                            f"DLPack ({exc})") from exc


def _to_device(cp, name: str, a):
    """CuPy array on the current device holding ``a``; NumPy is copied (bf16 as CuPy's native
    bfloat16, or as uint16 bits on a CuPy without it)."""
    if isinstance(a, cp.ndarray):
        if a.device.id != cp.cuda.Device().id:
            raise ValueError(f"{name}: array is on GPU {a.device.id}, but the current device is "
                             f"{cp.cuda.Device().id}; use `with cupy.cuda.Device({a.device.id}):`")
        return a
    a = np.asarray(a)
    if a.dtype == _BF16 and not _native_bf16(cp):
        a = a.view(np.uint16)
    return cp.asarray(a)


def _aligned(a) -> bool:
    """cp.async moves 16-byte chunks: rows and the base must be 16-byte aligned."""
    item = a.itemsize
    return a.data.ptr % 16 == 0 and all((s // item) % 8 == 0 for s in a.strides[:-1])


def _broadcast(a) -> bool:
    """A zero stride along a dimension longer than 1 (a broadcast view): the TMA engine's tensor
    maps need positive strides."""
    return any(int(s) == 0 and int(n) > 1 for n, s in zip(a.shape, a.strides))


def _prep(cp, name: str, a, tma: bool = False):
    """``a`` on the device as the kernels read it: a copy where its last stride is not 1, a stride
    is negative (a reversed view), its rows are not 16-byte aligned, or (``tma``: the kernel reads
    it through tensor maps) it is a broadcast view; else ``a`` itself."""
    a = _to_device(cp, name, a)
    if (a.strides[-1] != a.itemsize or any(int(s) < 0 for s in a.strides) or not _aligned(a)
            or (tma and _broadcast(a))):
        a = cp.ascontiguousarray(a)  # a copy; the caller's array is untouched
        if not _aligned(a):  # e.g. an odd-sized leading view: pad-free copy fixes alignment
            a = a.copy()
    return a


def _ptr(a) -> int:
    """Device address of a CuPy array (0 for None or an empty array)."""
    return 0 if a is None or a.size == 0 else a.data.ptr


def _tensor(a, layout: str) -> tuple[int, int, int, int]:
    """``TensorArg`` (pointer, batch / head / sequence strides in elements) of a q-like array in
    ``layout``; group mode (``thd``): batch stride 0, rows are packed tokens."""
    return (_ptr(a), *_tensor_strides(a.strides, a.itemsize, layout))


def _tensor_strides(strides, itemsize: int, layout: str) -> tuple[int, int, int]:
    """The (batch, head, sequence) element strides of :func:`_tensor`: what a ``TensorArg`` holds
    besides the pointer (``cupy_fmha.jax`` resolves them once per traced shape)."""
    st = strides
    if layout == "thd":
        return (0, st[1] // itemsize, st[0] // itemsize)
    if layout == "bshd":
        return (st[0] // itemsize, st[2] // itemsize, st[1] // itemsize)
    return (st[0] // itemsize, st[1] // itemsize, st[2] // itemsize)


def _workspace_tensor(a, group_mode: bool) -> tuple[int, int, int, int]:
    """``TensorArg`` of a contiguous fp32 [batch, heads, rows, d] workspace (batch stride 0 in
    group mode, where the rows are packed tokens)."""
    _, h, rows, d = a.shape
    return (_ptr(a), 0 if group_mode else h * rows * d, rows * d, d)


def _launch(cp, spec, launch, struct, values, prefix: tuple = ()):
    """Launch ``spec`` with its params struct (dtype ``struct``, ``values`` nested tuples in field
    order): by value, or flattened for the kernels of ``params.FLAT_ABI``; ``prefix``: arguments
    before it (the tensor maps of the warp-specialized backward)."""
    if L.empty_grid(launch):  # group mode with nothing to do (e.g. every sequence empty)
        return
    fn = get_function(spec)
    if launch.smem > 48 * 1024:
        _allow_smem(fn, launch.smem)
    flat, cpointer = spec.source in P.FLAT_ABI, _cupy_function(cp, "CPointer")
    args = P.pointer_args(struct, values, flat, cpointer) if cpointer else P.kernel_args(struct, values, flat)
    fn(launch.grid, launch.block, prefix + args, shared_mem=launch.smem)


_SMEM_ALLOWED: dict = {}


def _allow_smem(fn, smem: int) -> None:
    """Raise ``fn``'s dynamic shared-memory limit to ``smem`` bytes, asking the driver only the
    first time for each function and size (the attribute read is a driver call per launch
    otherwise). The entry holds ``fn``, so its id is not reused while cached."""
    hit = _SMEM_ALLOWED.get(id(fn))
    if hit is not None and hit[0] is fn and hit[1] >= smem:
        return
    if fn.max_dynamic_shared_size_bytes < smem:
        fn.max_dynamic_shared_size_bytes = smem
    if len(_SMEM_ALLOWED) > 1024:
        _SMEM_ALLOWED.clear()
    _SMEM_ALLOWED[id(fn)] = (fn, smem)


@functools.lru_cache(maxsize=256)
def _tile_map(name, ptr, batch, heads, n_rows, d, sb, sh, ss, box_rows, d_pad, swizzle=0) -> np.ndarray:
    """One tensor map of :func:`_maps`, encoded once per address, shape and strides: the driver
    call through cuda-bindings costs tens of microseconds, and training loops hand the same
    buffers back call after call. The arrays are shared: never written.

    ``swizzle`` 0: the column-blocked 5-D view (batch, d / 8, rows, heads, 8) with one box per
    tile (d_pad / 8 column blocks of box_rows rows). 128: the tensor itself as (batch, rows, heads,
    d) with 128-byte swizzle and boxes of box_rows rows x 64 columns, one per 64-column slab of
    the tile; columns past d (d_pad > d) are zero-filled by TMA like rows past the tensor."""
    from .backends import tma

    if n_rows == 0 or batch == 0:  # nothing to load (the kernel issues no copy from it)
        return np.zeros(1, np.dtype((np.void, 128)))
    # a size-1 axis may carry any stride (NumPy/CuPy give 0 for x[None]); TMA wants a positive
    # multiple of 16
    sb, sh, ss = (x if n > 1 else 8 for x, n in ((sb, batch), (sh, heads), (ss, n_rows)))
    if swizzle:
        args = tma.tile_map_args(name, ptr, (batch, n_rows, heads, d), (2 * sb, 2 * ss, 2 * sh, 2),
                                 (1, box_rows, 1, 64), swizzle)
    else:
        shape = (batch, d // 8, n_rows, heads, 8)
        strides = (2 * sb, 16, 2 * ss, 2 * sh, 2)
        args = tma.tile_map_args(name, ptr, shape, strides, (1, d_pad // 8, box_rows, 1, 8), 0)
    return tma.encode_tile_map(args)


_CUPY_FUNCTION: dict = {}


def _cupy_function(cp, name: str):
    """A class of CuPy's kernel-argument machinery (``cupy.cuda.function.CPointer`` or its
    ``CNumpyArray``), or None where this CuPy (or a test's stand-in) has none."""
    if getattr(cp, "__name__", "") != "cupy":
        return None
    if name not in _CUPY_FUNCTION:
        try:
            from cupy.cuda import function
        except Exception:  # pragma: no cover - other CuPy versions
            function = None
        _CUPY_FUNCTION[name] = getattr(function, name, None)
    return _CUPY_FUNCTION[name]


_BY_VALUE: dict = {}


def _by_value(cp, a):
    """``a`` (a cached one-element NumPy array, e.g. a tensor map) as CuPy's by-value kernel
    argument, wrapped once: for a NumPy array CuPy builds that wrapper on every launch, reading
    ``__array_interface__`` (2.9 us per argument on the H200 host: the ws backward's four maps
    cost 11 us per call; wrapped, 1.7 us for all four; bench/NOTES.md step 23). The entry holds
    ``a``, so its id is not reused while it is cached."""
    hit = _BY_VALUE.get(id(a))
    if hit is not None and hit[0] is a:
        return hit[1]
    wrap = _cupy_function(cp, "CNumpyArray")
    w = a if wrap is None else wrap(a)
    if len(_BY_VALUE) > 1024:  # _tile_map keeps 256 maps; older entries are dropped wholesale
        _BY_VALUE.clear()
    _BY_VALUE[id(a)] = (a, w)
    return w


def _maps(cp, boxes, tensors) -> tuple:
    """The TMA tensor maps of a warp-specialized kernel as kernel arguments: ``boxes`` from the
    plan (:func:`cupy_fmha.launch.tma_boxes`), ``tensors`` the ``TensorArg`` tuples (pointer and
    element strides) of the same tensors, each read as a column-blocked 5-D view (batch,
    hdim / 8, rows, heads, 8), one box per tile, or with a swizzle as the 4-D tensor in boxes of 64
    columns (:func:`_tile_map`, cupy_fmha/backends/tma.py)."""
    return tuple(_by_value(cp, _tile_map(name, ptr, batch, heads, n_rows, d, sb, sh, ss, box_rows, d_pad, swizzle))
                 for (name, batch, heads, n_rows, d, box_rows, d_pad, swizzle), (ptr, sb, sh, ss)
                 in zip(boxes, tensors))


# --------------------------------------------------------------------------- feature groups


def _seq(plan, cu_q, cu_k) -> tuple:
    """``SeqArg``: batch mode null offsets and the lengths; group mode the offsets and max lengths."""
    return _seq_arg(plan, _ptr(cu_q), _ptr(cu_k))


def _seq_arg(plan, cu_q_ptr: int, cu_k_ptr: int) -> tuple:
    """``SeqArg`` from the offsets' device addresses (0 in batch mode)."""
    return (cu_q_ptr, cu_k_ptr, plan.rows_q, plan.rows_k)


def _mask(plan) -> tuple:
    return (*plan.window, 0)


def _alibi(cp, plan, alibi_slopes) -> tuple:
    """(``AlibiArg``, the device slopes); zeros without ALiBi."""
    if plan.alibi_sb is None:
        return (0, 0), None
    slopes = cp.ascontiguousarray(_to_device(cp, "alibi_slopes", alibi_slopes))
    return _alibi_arg(plan, _ptr(slopes)), slopes


def _alibi_arg(plan, ptr: int) -> tuple:
    """``AlibiArg`` from the contiguous slopes' device address; zeros without ALiBi."""
    return (0, 0) if plan.alibi_sb is None else (ptr, plan.alibi_sb)


def _bias_strides(shape, strides, itemsize) -> tuple[int, int, int, int]:
    """Element strides of a bias viewed as [batch, nhead_q, seqlen_q, seqlen_k]: missing leading
    dimensions and every dimension of size 1 (broadcast) get stride 0; others keep theirs (any
    sign), so no copy is needed whatever the bias's layout."""
    st = [0 if int(n) == 1 else int(s) // itemsize for n, s in zip(shape, strides)]
    return tuple([0] * (4 - len(st)) + st)


def _bias(cp, plan, bias) -> tuple:
    """(``BiasArg``, the device bias) for a checked bias; zeros (kind 0) without one."""
    if plan.bias_dtype is None:
        return (0, 0, 0, 0, 0, 0, 0), None
    dev = _to_device(cp, "bias", bias)
    # an empty bias (group mode: max_seqlen_q or max_seqlen_k 0) is never read: a null pointer
    return _bias_arg(plan, _ptr(dev), dev.shape, dev.strides, dev.itemsize), dev


def _bias_arg(plan, ptr: int, shape, strides, itemsize: int) -> tuple:
    """``BiasArg`` of a checked bias at device address ``ptr`` (0 when empty) with this shape and
    byte strides; zeros (kind 0) without a bias."""
    if plan.bias_dtype is None:
        return (0, 0, 0, 0, 0, 0, 0)
    return (ptr, *_bias_strides(shape, strides, itemsize), BIAS_KIND[plan.bias_dtype], 0)


def _bias_tma_ready(ptr: int, bias_arg: tuple, itemsize: int) -> bool:
    """Whether the bias of ``bias_arg`` (``BiasArg``: element strides, 0 along broadcast
    dimensions) at device address ``ptr`` meets the TMA unit's rules as the warp-specialized
    kernels read it (:func:`_bias_map`): 16-byte aligned address, keys contiguous, every other
    stride 0 or a positive multiple of 16 bytes."""
    _, sb, sh, sq, sk = bias_arg[:5]
    return ptr % 16 == 0 and sk == 1 and all(s >= 0 and s * itemsize % 16 == 0 for s in (sb, sh, sq))


def _tma_bias(cp, dev):
    """``dev`` (a checked device bias) laid out for the warp-specialized kernels' TMA loads: itself
    when :func:`_bias_tma_ready`, else a copy with rows padded to 16 bytes (a temporary the size of
    the bias's own elements, never of the broadcast shape: dimensions it broadcasts along by a
    zero stride are cut to one first). The caller's array is untouched."""
    item = dev.itemsize
    st = _bias_strides(dev.shape, dev.strides, item)
    if dev.size == 0 or _bias_tma_ready(_ptr(dev), (0, *st), item):
        return dev
    src = dev[tuple(slice(0, 1) if s == 0 and n > 1 else slice(None) for n, s in zip(dev.shape, dev.strides))]
    cols = src.shape[-1]
    pitch = -(-cols * item // 16) * 16 // item
    buf = cp.empty(src.shape[:-1] + (pitch,), dtype=src.dtype)
    out = buf[..., :cols]
    out[...] = src
    return out


def _bias_for_spec(cp, plan, spec, bias_arg: tuple, bias_dev) -> tuple:
    """(``BiasArg``, the device array it points at) for the instance ``spec``: for a build that loads
    the bias through TMA (``BIAS_TMA``) the bias laid out by :func:`_tma_bias` (perhaps a padded
    copy, which the caller holds until the launch is queued); else ``bias_arg`` and ``bias_dev``."""
    if bias_dev is None or not spec.macro("BIAS_TMA"):
        return bias_arg, bias_dev
    dev = _tma_bias(cp, bias_dev)
    return _bias_arg(plan, _ptr(dev), dev.shape, dev.strides, dev.itemsize), dev


@functools.lru_cache(maxsize=256)
def _bias_map_cached(data_type: str, ptr: int, dims: tuple, strides: tuple, box: tuple) -> np.ndarray:
    from .backends import tma

    return tma.encode_tile_map(tma.tile_map_args(data_type, ptr, dims, strides, box, 128))


_NO_MAP = np.zeros(1, np.dtype((np.void, 128)))


def _bias_map(plan, spec, bias_arg: tuple) -> np.ndarray:
    """The warp-specialized kernels' bias map (the forward's 4th tensor map, the backward's 5th;
    ``spec`` the instance): the bias as a 4-D (batch, heads, rows, keys) map, 1 along its broadcast
    dimensions, in 128-byte-swizzled boxes of 128 bytes of keys by the instance's BLOCK_M rows (one
    row for a bias broadcast along the rows; SwBiasTile in kernels/arch/sm90/tma_tile.cuh); zeros
    for a build without bias or an empty one.

    Raises:
        ValueError: the bias breaks a TMA rule (:func:`_bias_tma_ready`; the API's own calls lay
            the bias out first with :func:`_tma_bias`)."""
    n = spec.macro("BIAS_TMA", 0)
    ptr = bias_arg[0]
    if not n or not ptr:
        return _NO_MAP
    if not _bias_tma_ready(ptr, bias_arg, n):
        raise ValueError(f"bias: the TMA loads of the warp-specialized kernels need a 16-byte aligned bias with "
                         f"contiguous keys and 16-byte multiple strides, got address {ptr:#x}, strides {bias_arg[1:5]}")
    sb, sh, sq = bias_arg[1:4]
    dims = (plan.batch if sb else 1, plan.problem.nhead_q if sh else 1, plan.rows_q if sq else 1, plan.rows_k)
    strides = tuple(s * n if s else 16 for s in (sb, sh, sq)) + (n,)
    box = (1, 1, spec.macro("BLOCK_M") if sq else 1, 128 // n)
    return _bias_map_cached("float32" if n == 4 else "uint16", ptr, dims, strides, box)


#: BiasArg::ds_kind DS_KIND_TMA (kernels/params.cuh): the ws backward's BIAS build stores dBias from its
#: dS tile in shared memory with TMA (:func:`_dbias_store`)
DS_KIND_TMA = 3
#: whether :func:`_dbias_store` may choose that store (tests and benchmarks turn it off to compare
#: with the element-by-element store of the same kernel)
DBIAS_TMA_STORE = True


def _dbias_tma(plan, spec, dbias) -> bool:
    """Whether ``spec`` stores ``dbias`` (the array :func:`_direct_dbias` makes, or None) from its dS
    tile with TMA (:func:`_dbias_store`): the ws backward's BIAS build, dBias in the inputs' 16-bit
    dtype (dS rounded as the kernel rounds its dS tile for GEMM4), rows TMA can address (16-byte
    aligned, seqlen_k * 2 bytes a multiple of 16), and :data:`DBIAS_TMA_STORE`."""
    return (dbias is not None and DBIAS_TMA_STORE and spec.source == "fmha_bwd_dq_dk_dv_sm90_ws"
            and bool(spec.macro("BIAS")) and _DS_KIND.get(np.dtype(dbias.dtype)) == {"fp16": 1, "bf16": 2}[spec.dtype]
            and plan.rows_k * 2 % 16 == 0 and dbias.size > 0 and _ptr(dbias) % 16 == 0)


def _dbias_store(plan, spec, bias_arg: tuple, dbias) -> tuple:
    """(``bias_arg``, the ws backward's 6th tensor map) for a launch of ``spec`` with ``dbias``, the
    array the kernel stores dS into as dBias itself (:func:`_direct_dbias`; ``bias_arg``'s
    ``ds_kind`` already its dtype's) or None. When :func:`_dbias_tma`: ``ds_kind`` becomes
    :data:`DS_KIND_TMA` and the map is dBias as a 4-D (batch, heads, rows, keys) tensor in
    128-byte-swizzled boxes of 64 keys x BLOCK_M rows, the layout of the kernel's dS tile; the
    kernel then also writes the zeros of the blocks the mask skips. Otherwise ``bias_arg`` unchanged
    and zeros (the kernel stores its dS elements one by one). With the map the launch passes a null
    ``dbias_acc`` (the kernel's test for the element-by-element store)."""
    if not _dbias_tma(plan, spec, dbias):
        return bias_arg, _NO_MAP
    p = plan.problem
    dims = (p.batch, p.nhead_q, plan.rows_q, plan.rows_k)
    strides = (2 * p.nhead_q * plan.rows_q * plan.rows_k, 2 * plan.rows_q * plan.rows_k, 2 * plan.rows_k, 2)
    box = (1, 1, spec.macro("BLOCK_M"), 64)
    return (*bias_arg[:6], DS_KIND_TMA), _bias_map_cached("uint16", _ptr(dbias), dims, strides, box)


def _dropout(plan) -> tuple:
    d = plan.dropout
    return (d.seed, d.offset, d.threshold, d.scale)


def _dropout_mask(cp, plan, nhead_q):
    """bool [batch, nhead_q, rows_q, rows_k]: the keep mask the attention kernels apply
    (fmha_dropout_mask.cu calls the same Philox function with the same keying)."""
    keep = cp.empty((plan.batch, nhead_q, plan.rows_q, plan.rows_k), dtype=cp.bool_)
    if keep.size:
        _launch(cp, dropout_mask_spec(), L.dropout_mask_launch(plan.batch, nhead_q, plan.rows_q, plan.rows_k),
                P.DROPOUT_MASK, (_ptr(keep), plan.rows_q, plan.rows_k, _dropout(plan)))
    return keep


def _cu(cp, plan, cu_seqlens_q, cu_seqlens_k):
    """cu_seqlens as contiguous int32 CuPy arrays in group mode (already validated); None, None
    in batch mode."""
    if not plan.group_mode:
        return None, None
    return (cp.ascontiguousarray(_to_device(cp, "cu_seqlens_q", cu_seqlens_q)),
            cp.ascontiguousarray(_to_device(cp, "cu_seqlens_k", cu_seqlens_k)))


def _outputs(cp, out, names, shapes, dtypes, inputs):
    """Fresh outputs, or the caller's ``out`` buffers once checked (:func:`cupy_fmha.validate.check_out`;
    ``inputs``: (name, array) pairs the call reads, which they may not alias)."""
    if out is None:
        return [cp.empty(s, dtype=d) for s, d in zip(shapes, dtypes)]
    return list(check_out(cp.ndarray, cp.cuda.Device().id, out, names, shapes, dtypes, inputs))



def _device_cc() -> int:
    """The current device's compute capability; raises RuntimeError without a usable GPU."""
    return _cc(_cupy())

# --------------------------------------------------------------------------- forward


def attention_forward(q, k, v, *, softmax_scale=None, causal=False, window_size=(-1, -1), mask=None,
                      layout="bshd", dtype=None, alibi_slopes=None, bias=None, dropout_p=0.0, seed=0, offset=0,
                      return_dropout_mask=False, out=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                      max_seqlen_k=None):
    """Attention forward: ``O = softmax(softmax_scale * Q K^T + mask) V`` and its log-sum-exp.

    Args:
        q: [batch, seqlen_q, nhead_q, hdim_q] (``layout="bshd"``), [batch, nhead_q, seqlen_q,
            hdim_q] (``"bhsd"``) or [total_q, nhead_q, hdim_q] (``"thd"``, group mode); float16
            or bfloat16 (CuPy's native ``bfloat16``; uint16 bits with ``dtype="bfloat16"`` on
            older CuPy). A CuPy array, a NumPy array (copied to the current device) or any
            object with ``__dlpack__`` (PyTorch, JAX: taken without a copy). Any strides with a
            unit last stride.
        k: [batch, seqlen_k, nhead_k, hdim_q] (or bhsd, or [total_k, nhead_k, hdim_q] for thd);
            ``nhead_q`` a multiple of ``nhead_k`` (GQA/MQA).
        v: [batch, seqlen_k, nhead_k, hdim_v] (or bhsd, or [total_k, nhead_k, hdim_v]).
        softmax_scale: multiplies Q K^T; default ``1 / sqrt(hdim_q)``.
        causal: FlashAttention's causal mask (bottom-right aligned).
        window_size: (left, right) sliding window, bottom-right aligned, -1 = unlimited.
        mask: CK's mask string instead (``0``, ``t``, ``b``, ``t:l,r``, ``b:l,r``, ``xt:w``,
            ``xb:w``, ``g:y,x``); see :mod:`cupy_fmha.mask`. In group mode every mask is resolved
            per sequence with that sequence's own lengths.
        layout: ``"bshd"`` (default), ``"bhsd"``, or ``"thd"`` (group mode, needs cu_seqlens).
        dtype: ``None``, ``"float16"`` or ``"bfloat16"`` (needed only for uint16 bf16 bits).
        alibi_slopes: optional float32 [nhead_q] or [batch, nhead_q]: ALiBi as FlashAttention
            defines it, a bias ``-slope * |i + seqlen_k - seqlen_q - j|`` added to the scaled
            scores of query row ``i`` and key ``j`` (group mode: local positions and each
            sequence's own lengths).
        bias: optional elementwise bias added to the scaled scores (after ``softmax_scale``,
            before the mask), any shape broadcastable (NumPy rules) to [batch, nhead_q,
            seqlen_q, seqlen_k], e.g. [1, 1, sq, sk], [1, nhead_q, sq, sk], [batch, nhead_q, sq,
            sk], [sq, sk] or [sq, 1]; any strides (broadcast dimensions are read with stride 0,
            never expanded). On sm_90 at head dims rounding up to 64 or 128 the warp-specialized
            forward (and at 64 the backward) loads it tile by tile through TMA, which needs rows
            starting on 16 bytes: a bias whose rows are not a multiple of 16 bytes, or that does
            not start on 16 bytes, is read from a padded copy (a temporary the size of the bias's
            own elements, made per call; the caller's array is untouched); a bias broadcast along
            the keys ([..., sq, 1]) runs on the per-element kernels instead (:func:`_tma_bias`,
            kernels/fmha_fwd_sm90_ws.cu). dtype float16, bfloat16 or float32, independent of q's dtype (bf16
            natively, or as uint16 bits when ``dtype="bfloat16"``). Not together with
            ``alibi_slopes``. A bias of ``-inf`` masks a
            pair out. Group mode (``layout="thd"``): broadcastable to [batch, nhead_q,
            max_seqlen_q, max_seqlen_k] (batch = ``len(cu_seqlens_q) - 1``); sequence ``i`` uses
            ``bias[i, :, :seqlen_q_i, :seqlen_k_i]``, the top-left corner of its plane, indexed
            by positions local to the sequence (entries beyond it are never read). Selects the
            kernel instance compiled with the bias (``-D BIAS=1``).
        dropout_p: dropout probability in [0, 1) on the attention weights: ``O = (P * Z) V``
            with ``Z = keep * 256 / t``, ``t = floor((1 - dropout_p) * 256 + 0.5)`` the 8-bit keep
            threshold (``dropout_p`` in effect rounded to a multiple of 1/256, as FlashAttention-2
            does; the factor is the inverse of the keep probability applied, so ``E[Z] = 1``,
            except where ``t = 0``, ``dropout_p > 1 - 1/512``: then ``Z = 0``); the
            LSE stays that of the undropped softmax.
            0 (default) runs the kernels built without dropout; above 0, the ``-D DROPOUT=1``
            instances.
        seed, offset: integers in [0, 2**64): the Philox key and counter offset
            (:mod:`cupy_fmha.philox` defines the keep mask bit for bit; element (b, h, i, j)
            uses counter offset ``offset + b * nhead_q + h``; group mode: b is the sequence and
            i, j positions inside it). The backward must get the same ``dropout_p``, ``seed``
            and ``offset``.
        return_dropout_mask: also return the keep mask (computed by a separate small kernel
            with the same Philox function; all True when ``dropout_p`` is 0).
        out: optional (o, lse) buffers to write into instead of fresh arrays (o: any strides with
            a unit last stride and 16-byte aligned rows; lse: C-contiguous float32); neither may
            share memory with an input or the other.
        cu_seqlens_q, cu_seqlens_k: group mode only: int32 [batch + 1] offsets (CuPy or NumPy;
            read back once to validate): sequence ``b`` is rows ``cu_seqlens_q[b]`` to
            ``cu_seqlens_q[b + 1]`` of q (and likewise of k, v). Lengths may be 0 anywhere.
        max_seqlen_q, max_seqlen_k: group mode only: ``None`` (the longest sequence) or an int
            at least that long; max_seqlen_q sets lse's last dimension.

    Returns:
        (o, lse), or (o, lse, keep) with ``return_dropout_mask``: o [batch, seqlen_q, nhead_q,
        hdim_v] in ``layout`` (thd: [total_q, nhead_q, hdim_v]) and q's dtype (a CuPy array,
        also for NumPy or DLPack inputs); lse
        float32 [batch, nhead_q, seqlen_q] (thd: [batch, nhead_q, max_seqlen_q], -inf beyond each
        sequence's length), natural log; keep a CuPy bool array [batch, nhead_q, seqlen_q,
        seqlen_k] (batch mode: as :func:`cupy_fmha.reference.attention_forward` returns it; thd:
        [batch, nhead_q, max_seqlen_q, max_seqlen_k], sequence b's mask in its top-left
        [seqlen_q_b, seqlen_k_b] corner, where the reference returns a list of the per-sequence
        masks). Rows that see no key (all rows of a sequence with no keys): o = 0, lse = -inf.

    Raises:
        TypeError, ValueError: bad input (see :func:`cupy_fmha.validate.check_forward_inputs`,
            :func:`cupy_fmha.validate.check_bias` and :func:`cupy_fmha.validate.check_dropout`;
            ``bias`` with ``alibi_slopes``), before anything is launched.
        RuntimeError: CuPy or a GPU is missing.
    """
    q, k, v, bias, alibi_slopes = (_adopt(n, a) for n, a in (("q", q), ("k", k), ("v", v), ("bias", bias),
                                                            ("alibi_slopes", alibi_slopes)))
    plan: FwdPlan = plan_forward(
        q, k, v, bias=bias, alibi_slopes=alibi_slopes, cc=_device_cc, softmax_scale=softmax_scale, causal=causal,
        window_size=window_size, mask=mask, layout=layout, dtype=dtype, dropout_p=dropout_p, seed=seed,
        offset=offset, return_dropout_mask=return_dropout_mask, cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)
    return _run_forward(plan, q, k, v, bias, alibi_slopes, out, cu_seqlens_q, cu_seqlens_k)


def _run_forward(plan: FwdPlan, q, k, v, bias, alibi_slopes, out, cu_seqlens_q, cu_seqlens_k):
    """:func:`attention_forward` after its plan: prepare the arrays and launch. ``cu_seqlens_*``
    are only handed to the kernels here (never read back): :mod:`cupy_fmha.jax` calls this with
    a plan made from stand-in offsets so that no host read happens on XLA's stream."""
    layout = plan.layout
    cp = _cupy()
    read = (("q", q), ("k", k), ("v", v), ("bias", bias), ("alibi_slopes", alibi_slopes),
            ("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k))
    q, k, v = (_prep(cp, n, a, bool(plan.maps)) for n, a in (("q", q), ("k", k), ("v", v)))
    o, lse = _outputs(cp, out, ("o", "lse"), (plan.o_shape, plan.lse_shape), (q.dtype, np.float32), read)
    cu_q, cu_k = _cu(cp, plan, cu_seqlens_q, cu_seqlens_k)
    # slopes / bias_dev: the device copies the params point at, held until the launch is queued
    alibi, slopes = _alibi(cp, plan, alibi_slopes)
    bias_arg, bias_dev = _bias(cp, plan, bias)
    bias_arg, tma_dev = _bias_for_spec(cp, plan, plan.spec, bias_arg, bias_dev)  # (tma_dev: held until queued)
    _launch_forward(cp, plan, (_tensor(q, layout), _tensor(k, layout), _tensor(v, layout), _tensor(o, layout)),
                    _ptr(lse), _seq(plan, cu_q, cu_k), alibi, bias_arg, _dropout(plan))
    if plan.want_keep:  # group mode: sequence b's mask in the top-left corner of its plane
        return o, lse, _dropout_mask(cp, plan, plan.problem.nhead_q)
    return o, lse


def _launch_forward(cp, plan: FwdPlan, tensors, lse: int, seq, alibi, bias_arg, dropout, maps=None) -> None:
    """The forward kernel's launch from its arguments' device addresses: ``tensors`` the
    ``TensorArg`` tuples of q, k, v, o; ``lse`` its address; ``seq``, ``alibi``, ``bias_arg``,
    ``dropout`` the feature groups (:func:`_seq_arg`, :func:`_alibi_arg`, :func:`_bias_arg`,
    :func:`_dropout`); ``maps`` the TMA tensor maps of q, k, v when the caller has them already
    (:func:`_maps`), else they are looked up here; the warp-specialized forward's 4th, the bias's
    (:func:`_bias_map`; the bias laid out by :func:`_tma_bias`), is added here. Shared by
    :func:`_run_forward` and :mod:`cupy_fmha.jax`'s callbacks, which hold the addresses of XLA's
    buffers."""
    p = plan.problem
    values = (*tensors, lse, seq, p.hdim_q, p.hdim_v, p.group, p.softmax_scale * LOG2E, _mask(plan), alibi,
              bias_arg, dropout)
    if not plan.maps or L.empty_grid(plan.launch):
        maps = ()
    else:
        if maps is None:
            maps = _maps(cp, plan.maps, tensors[:3])
        if plan.spec.source == "fmha_fwd_sm90_ws":
            maps = (*maps, _by_value(cp, _bias_map(plan, plan.spec, bias_arg)))
    _launch(cp, plan.spec, plan.launch, P.FWD, values, maps)


# --------------------------------------------------------------------------- backward


def attention_backward(do, q, k, v, o, lse, *, softmax_scale=None, causal=False, window_size=(-1, -1),
                       mask=None, layout="bshd", dtype=None, alibi_slopes=None, bias=None, return_dbias=False,
                       dropout_p=0.0, seed=0, offset=0, out=None, deterministic=False, cu_seqlens_q=None,
                       cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
                       dlse=None) -> AttentionGrads | AttentionGradsWithBias:
    """Attention backward: dQ, dK, dV (and optionally dBias) from dO and the forward's O and LSE.

    Three launches (CK's FMHA backward): ``dot_do_o`` (which also zero-fills the fp32 dQ
    accumulator, as FlashAttention-2's preprocessing does), ``dq_dk_dv``, ``convert_dq`` (+ a GQA
    group sum of dK/dV through the same convert kernel when nhead_q != nhead_k). With
    ``return_dbias``, ``dq_dk_dv`` also stores dS = P * (dP - D): for a bias that broadcasts along
    nothing (batch mode, shape [batch, nhead_q, seqlen_q, seqlen_k] up to leading 1s) straight into
    dbias, rounded once to the bias's dtype; otherwise in float32 (before any 16-bit rounding) into a
    zeroed workspace of [batch, nhead_q, seqlen_q, seqlen_k] float32 (group mode: the max lengths;
    4 bytes per score: plan memory for it), which CuPy then sums over the bias's broadcast
    dimensions.

    Args:
        do: gradient of o, [batch, seqlen_q, nhead_q, hdim_v] (or bhsd, or [total_q, nhead_q,
            hdim_v] for thd); its strides may differ from o's.
        q, k, v: as in :func:`attention_forward`.
        o: the forward output; lse: float32 [batch, nhead_q, seqlen_q] from the forward (thd:
            [batch, nhead_q, max_seqlen_q]).
        softmax_scale, causal, window_size, mask, layout, dtype, alibi_slopes, bias, dropout_p,
            seed, offset, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k: as in the
            forward (must match: the backward regenerates the forward's keep mask from dropout_p,
            seed and offset; dV = (P Z)^T dO, dS = P (dP Z - D), D = rowsum(dO * O)).
        return_dbias: also return dbias, the gradient of ``bias`` (needs ``bias``): dS summed
            over the dimensions the bias broadcasts along, in the bias's shape and dtype. Group
            mode: sequence ``i``'s dS lands in the top-left [seqlen_q_i, seqlen_k_i] corner of
            plane ``i`` of a [batch, nhead_q, max_seqlen_q, max_seqlen_k] fp32 workspace, the
            rest is 0; so entries of dbias outside every sequence's corner are 0.
        out: optional (dq, dk, dv) buffers to write into (shapes of q, k, v; unit last stride,
            16-byte aligned rows; no memory shared with an input or each other, interleaved views
            of one buffer are fine); dbias is always a fresh array.
        deterministic: bool. False (default): the dq_dk_dv CTAs add their dQ contributions into
            one fp32 accumulator [batch, nhead_q, seqlen_q, hdim_q] with float atomics, so dQ
            may differ in the last bits from run to run. True: dq, dk and dv are bit-identical
            on every run with the same inputs on the same device and library version. On the
            warp-specialized Hopper kernel (sm_90, head dims rounding up to 64 or 128, no dropout
            or bias) the key blocks add their dQ tiles into the one accumulator in ascending
            order, admitted one at a time by an int32 semaphore per (batch, head, query tile of
            64, 80 or 128 rows): the same memory as the default plus those semaphores. Elsewhere each CTA
            stores its key block kb's dQ contribution with plain stores into slab kb of an fp32
            workspace [nsplit, batch, nhead_q, seqlen_q, hdim_q], nsplit = ceil(seqlen_k /
            BLOCK_N) (BLOCK_N = 128 on the other Hopper kernel, 16 * NWARPS = 128 or 64 on the
            mma.sync kernels), and ``convert_dq`` sums, in kb order, only the slabs whose key
            block sees that row (nothing is zero-filled). Memory there: nsplit times the atomic
            accumulator, i.e. ``4 * nsplit * batch * nhead_q * seqlen_q * hdim_q`` bytes, e.g.
            4.3 GB for batch 4, 16 heads, seqlen 4096, hdim 128 (32 slabs) instead of 136 MB;
            see :func:`cupy_fmha.launch.dq_workspace` and :func:`cupy_fmha.backward_workspace_bytes`.
            dK/dV are deterministic in both modes (plain stores; GQA sums per-head fp32 copies
            in a fixed order).
        dlse: optional cotangent of the forward's lse (the gradient of the loss with respect to
            lse, lse in natural-log units): float32, lse's shape [batch, nhead_q, seqlen_q]
            (thd: [batch, nhead_q, max_seqlen_q]; rows past each sequence's length are not
            read), any strides; a CuPy array on the current device, a NumPy array (copied over)
            or a DLPack tensor, as ``lse``. None (default): zero, i.e. a loss of o alone. Its
            source is the lse term of the softmax gradient: lse_i = log sum_j exp(s_ij), so
            d lse_i / d s_ij = P_ij, and with g = dlse
            ``dS = P * (dP - D + g) = P * (dP - (D - g))``, D = rowsum(dO * O) being
            FlashAttention's D. So no kernel changes: ``dlse`` is subtracted from the fp32 D
            workspace (one elementwise CuPy kernel on the current stream, where the backward's
            kernels run) between ``dot_do_o`` and ``dq_dk_dv``; dq, dk and dbias get the lse term,
            dv does not depend on it. With dropout the same holds (lse is that of the undropped P).
            Values are used as given, unchecked (a check would read them back): a NaN or an
            infinity makes dq of its row and dk (and dbias) non-finite, also in a row that sees
            no key (lse = -inf: P = 0 there, but 0 * inf is NaN; which keys it reaches then
            depends on the kernel's tiling), so pass 0 for those rows (e.g. the cotangent of
            a z-loss, 2 * lse, is -inf there). Group mode never reads the rows of a sequence
            without keys. The caller's array is not modified (an ``out`` buffer sharing its memory is refused,
            as for any input).

    Returns:
        :class:`AttentionGrads` (dq like q, dk like k with nhead_k heads, dv like v), fresh
        contiguous arrays in ``layout`` and the inputs' dtype. Group mode: rows of a sequence
        with no keys get dq = 0; keys of a sequence with no queries get dk = dv = 0. With
        ``return_dbias=True``: :class:`AttentionGradsWithBias` (the same plus ``dbias``).

    Raises:
        TypeError: ``deterministic`` is not a bool; and see below.
        TypeError, ValueError: bad input (see :func:`cupy_fmha.validate.check_backward_inputs`
            and :func:`cupy_fmha.validate.check_bias`; ``bias`` with ``alibi_slopes``;
            ``return_dbias`` not a bool or True without ``bias``; ``dlse`` not float32, not lse's
            shape or on another GPU: :func:`cupy_fmha.validate.check_dlse`), before anything is
            launched.
        RuntimeError: CuPy or a GPU is missing.
    """
    do, q, k, v, o, lse, bias, alibi_slopes, dlse = (
        _adopt(n, a) for n, a in (("do", do), ("q", q), ("k", k), ("v", v), ("o", o), ("lse", lse), ("bias", bias),
                                  ("alibi_slopes", alibi_slopes), ("dlse", dlse)))
    plan: BwdPlan = plan_backward(
        do, q, k, v, o, lse, bias=bias, alibi_slopes=alibi_slopes, dlse=dlse, cc=_device_cc, softmax_scale=softmax_scale,
        causal=causal, window_size=window_size, mask=mask, layout=layout, dtype=dtype, dropout_p=dropout_p,
        seed=seed, offset=offset, return_dbias=return_dbias, deterministic=deterministic,
        cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k)
    return _run_backward(plan, do, q, k, v, o, lse, bias, alibi_slopes, out, cu_seqlens_q, cu_seqlens_k, dlse=dlse)


def _run_backward(plan: BwdPlan, do, q, k, v, o, lse, bias, alibi_slopes, out, cu_seqlens_q, cu_seqlens_k,
                  dlse=None):
    """:func:`attention_backward` after its plan (see :func:`_run_forward`); ``dlse`` checked by the
    plan (None: none)."""
    layout = plan.layout
    cp = _cupy()
    read = (("do", do), ("q", q), ("k", k), ("v", v), ("o", o), ("lse", lse), ("bias", bias),
            ("alibi_slopes", alibi_slopes), ("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k),
            ("dlse", dlse))
    do, q, k, v, o = (_prep(cp, n, a, bool(plan.maps)) for n, a in (("do", do), ("q", q), ("k", k), ("v", v),
                                                                     ("o", o)))
    lse = cp.ascontiguousarray(_to_device(cp, "lse", lse))
    if dlse is not None:  # (only read, by an elementwise kernel: any strides)
        dlse = _to_device(cp, "dlse", dlse)
    dq, dk, dv = _outputs(cp, out, ("dq", "dk", "dv"), plan.grad_shapes, (q.dtype,) * 3, read)
    cu_q, cu_k = _cu(cp, plan, cu_seqlens_q, cu_seqlens_k)
    alibi, slopes = _alibi(cp, plan, alibi_slopes)
    bias_arg, bias_dev = _bias(cp, plan, bias)
    # (bias_dev itself stays the shape dBias is reduced to)
    bias_arg, tma_dev = _bias_for_spec(cp, plan, plan.specs.dq_dk_dv, bias_arg, bias_dev)
    dbias = _direct_dbias(cp, plan, bias_dev)
    if dbias is not None:  # (the kernel stores dS as dBias itself, in the bias's dtype)
        bias_arg = (*bias_arg[:6], _DS_KIND[np.dtype(dbias.dtype)])
    ds_acc = _launch_backward(
        cp, plan, tuple(_tensor(a, layout) for a in (do, q, k, v, o, dq, dk, dv)), _ptr(lse), _seq(plan, cu_q, cu_k),
        alibi, bias_arg, _dropout(plan), dbias=dbias, dlse=dlse)
    if plan.want_dbias:
        return AttentionGradsWithBias(dq, dk, dv, ds_acc if dbias is not None else reduce_dbias(cp, ds_acc, bias_dev))
    return AttentionGrads(dq, dk, dv)


#: BiasArg::ds_kind (kernels/params.cuh) by the storage dtype of dBias: the dq_dk_dv kernels round dS
#: to it as they store it (bf16 travels as ml_dtypes' bfloat16 or as uint16 bits)
_DS_KIND = {np.dtype(np.float32): 0, np.dtype(np.float16): 1, _BF16: 2, np.dtype(np.uint16): 2}


def _direct_dbias(cp, plan, bias_dev, into=None):
    """The dBias array the dq_dk_dv kernel writes itself (dS in the bias's dtype, with no fp32
    workspace and no reduction) when ``plan.want_dbias`` and the bias broadcasts along nothing: its
    shape, padded to 4-D, is [batch, nhead_q, seqlen_q, seqlen_k] (batch mode). Zeroed only where the
    mask may skip blocks and the kernel stores dS element by element (the skipped blocks' dS is never
    stored; its TMA store, :func:`_dbias_tma`, writes their zeros itself); without a mask every element
    is stored. None otherwise (group mode, a broadcast bias: the workspace and
    :func:`cupy_fmha.dbias.reduce_dbias`). ``bias_dev`` needs only ``shape`` and ``dtype``; ``into``:
    the array to use instead of a fresh one (contiguous, the bias's shape, its dtype or for bf16 its
    uint16 bits: :mod:`cupy_fmha.jax`'s view of XLA's dBias buffer)."""
    p = plan.problem
    if not plan.want_dbias or bias_dev is None or not dbias_stored_directly(
            bias_dev.shape, (p.batch, p.nhead_q, plan.rows_q, plan.rows_k), plan.group_mode):
        return None
    out = cp.empty(bias_dev.shape, dtype=bias_dev.dtype) if into is None else into
    full = plan.window[0] >= L.WINDOW_INF and plan.window[1] >= L.WINDOW_INF
    if not full and not _dbias_tma(plan, plan.specs.dq_dk_dv, out):
        out.fill(0)
    return out


def _launch_backward(cp, plan: BwdPlan, tensors, lse: int, seq, alibi, bias_arg, dropout, maps=None, dbias=None,
                     dlse=None):
    """The backward's workspaces and launches from its arguments' device addresses: ``tensors``
    the ``TensorArg`` tuples of do, q, k, v, o, dq, dk, dv; ``lse`` its address; the feature
    groups and ``maps`` (of q, k, v, do; the ws backward's 5th, the bias's, is added here) as in
    :func:`_launch_forward`. With ``plan.want_dbias``: ``dbias`` the array the kernel stores dS into
    as dBias itself (:func:`_direct_dbias`; ``bias_arg``'s last entry its ``ds_kind``), returned; or
    None, and the fp32 dS workspace is made here and returned (for
    :func:`cupy_fmha.dbias.reduce_dbias`). Else None. ``dlse``: lse's cotangent, a float32 CuPy
    array of lse's shape on this device (checked by the plan), subtracted from D between the
    dot_do_o and dq_dk_dv launches (dS = P (dP - (D - dlse)): the kernels are the same); None: none.
    Shared by :func:`_run_backward` and :mod:`cupy_fmha.jax`'s callbacks."""
    t_do, t_q, t_k, t_v, t_o, t_dq, t_dk, t_dv = tensors
    p, specs, launches, gm = plan.problem, plan.specs, plan.launches, plan.group_mode
    mask = _mask(plan)

    # atomic mode and the ordered deterministic adds add into zeros (dot_do_o zero-fills it);
    # deterministic slabs are stored before convert_dq reads them
    dq_acc = cp.empty(plan.dq_ws.shape, dtype=cp.float32)
    dq_sem = cp.zeros(plan.dq_ws.nsem, dtype=cp.int32) if plan.dq_ws.nsem else None  # ordered deterministic adds
    delta = cp.empty(plan.lse_shape, dtype=cp.float32)
    _launch(cp, specs.dot_do_o, launches["dot_do_o"], P.DOT_DO_O, (
        t_do, t_o, _ptr(delta), 0 if plan.dq_ws.nsplit else _ptr(dq_acc), seq,
        p.hdim_q, p.hdim_v, plan.dq_ws.pitch, plan.dq_ws.cols))
    if dlse is not None and delta.size:
        # the lse term of the softmax gradient (d lse_i / d s_ij = P_ij): dS = P (dP - D + dlse), and
        # every dq_dk_dv kernel forms dS = P (dP - D) from this workspace. An elementwise kernel on the
        # current stream, the one the launches above and below run on, so it runs between them.
        # (Group mode: rows past a sequence, never written by dot_do_o, are never read either.)
        delta -= dlse

    # dS for dBias; zeroed: pairs in key/query blocks the mask skips (group mode: outside every
    # sequence's corner) are never written
    ds_acc = None
    if plan.want_dbias:
        ds_acc = dbias if dbias is not None else cp.zeros((p.batch, p.nhead_q, plan.rows_q, plan.rows_k), dtype=cp.float32)
    if plan.dkdv_ws:  # GQA: per-query-head fp32 dK/dV, summed over each group by convert_dq
        dk_buf, dv_buf = (cp.empty(s, dtype=cp.float32) for s in plan.dkdv_ws)
        dk_arg, dv_arg = _workspace_tensor(dk_buf, gm), _workspace_tensor(dv_buf, gm)
    else:
        dk_arg, dv_arg = t_dk, t_dv
    read = (t_q, t_k, t_v, t_do)
    if not plan.maps or L.empty_grid(launches["dq_dk_dv"]):
        maps = ()
    else:
        if maps is None:
            maps = _maps(cp, plan.maps, read)
        if specs.dq_dk_dv.source == "fmha_bwd_dq_dk_dv_sm90_ws":  # the 5th: the bias's, the 6th dBias's (or zeros)
            bias_arg, dbias_map = _dbias_store(plan, specs.dq_dk_dv, bias_arg, dbias)
            maps = (*maps, _by_value(cp, _bias_map(plan, specs.dq_dk_dv, bias_arg)), _by_value(cp, dbias_map))
    _launch(cp, specs.dq_dk_dv, launches["dq_dk_dv"], P.BWD, (
        *read, dk_arg, dv_arg,
        lse, _ptr(delta), _ptr(dq_acc), 0 if bias_arg[6] == DS_KIND_TMA else _ptr(ds_acc), _ptr(dq_sem),
        plan.dq_ws.split_stride, seq,
        p.hdim_q, p.hdim_v, p.group, 1 if plan.dkdv_ws else 0, p.softmax_scale * LOG2E, p.softmax_scale,
        mask, alibi, bias_arg, dropout), maps)

    conv_dq = specs.convert_dq_split if plan.dq_ws.nsplit else specs.convert_dq
    _launch(cp, conv_dq, launches["convert_dq"], P.CONVERT, (
        _ptr(dq_acc), t_dq, plan.dq_ws.split_stride, seq, p.hdim_q, 1, plan.dq_ws.nsplit,
        plan.block_n, plan.block_m, plan.dq_ws.pitch, plan.dq_ws.cols, int(plan.dq_ws.tiled), p.softmax_scale, 0, mask))
    if plan.dkdv_ws:
        rows = (0, 0, plan.kv_rows, 0)  # the GQA sums: kv_batch x nhead_k x kv_rows rows, no slabs
        for acc, res, d in ((dk_buf, t_dk, p.hdim_q), (dv_buf, t_dv, p.hdim_v)):
            _launch(cp, specs.convert_dq, launches["convert_dkdv"], P.CONVERT, (
                _ptr(acc), res, 0, rows, d, p.group, 0, 1, 1, plan.kv_rows, d, 0, 1.0, 0, (0, 0, 0, 0)))
    return ds_acc
