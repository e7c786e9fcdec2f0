"""The plan: every decision of one attention call, resolved once from its arguments.

:func:`plan_forward` and :func:`plan_backward` turn the public functions' arguments into a
frozen :class:`FwdPlan` / :class:`BwdPlan`: problem sizes, dtypes, layout, the kernels' mask
window, features (ALiBi, bias, dropout), kernel instances, launch geometry, output shapes and
workspace sizes. Batch mode (``bshd``/``bhsd``) and group mode (``thd``) resolve into the same
fields, so :mod:`cupy_fmha.api` runs one path for both. All argument checks run here, through
:mod:`cupy_fmha.validate`, before anything touches the GPU; the device only enters through its
compute capability (which picks the backend's kernel instances).

Plans are memoized on everything they read (shapes, dtypes, strides, devices, option values,
compute capability, tuning variables), so a training loop calling with the same shapes pays for
resolution once. Group-mode plans also read ``cu_seqlens`` values and are not memoized.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from . import launch as L
from ._checks import check_int
from .spec import (BwdSpecs, KernelSpec, bwd_specs, fwd_spec, tuning_key, use_bwd_ws_diagonal, use_fwd_ws_short, use_heads_x,
                   use_wg_skip)
from .validate import (
    _BF16,
    _check_head_dims,
    Dropout,
    VarlenProblem,
    check_alibi_slopes,
    check_backward_inputs,
    check_bias,
    check_dlse,
    check_dropout,
    check_flag,
    check_forward_inputs,
    check_return_dbias,
    check_varlen_inputs,
    normalize_dtype,
    require_lse,
)

__all__ = ["FwdPlan", "BwdPlan", "plan_forward", "plan_backward", "backward_workspace_bytes", "BIAS_KIND"]

#: the kernels' bias kind per logical bias dtype (0: no bias; BiasArg.kind in kernels/params.cuh)
BIAS_KIND = {np.dtype(np.float16): 1, _BF16: 2, np.dtype(np.float32): 3}

_VARLEN_ARGS = ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k")


@dataclass(frozen=True)
class _Plan:
    problem: object          #: validate.Problem (batch mode) or validate.VarlenProblem (group mode)
    layout: str              #: "bshd", "bhsd" or "thd"
    dtype: str               #: "fp16" | "bf16" (the kernels' element type)
    batch: int
    rows_q: int              #: seqlen_q, or max_seqlen_q in group mode (the LSE / D / dQ row pitch)
    rows_k: int              #: seqlen_k, or max_seqlen_k in group mode
    window: tuple[int, int, int]  #: the kernels' (win_y, win_x, bottom_right) (launch.kernel_window*)
    alibi_sb: int | None     #: ALiBi slopes' batch stride (0 or nhead_q); None without ALiBi
    bias_dtype: np.dtype | None   #: the bias's logical dtype; None without a bias
    dropout: Dropout
    #: bytes per element of a bias the TMA unit can read once laid out (:func:`cupy_fmha.api._tma_bias`):
    #: 2 or 4 unless the bias broadcasts along the keys (0, also without a bias)
    bias_tma: int = 0

    @property
    def group_mode(self) -> bool:
        return self.layout == "thd"

    def shape(self, rows: int, heads: int, dim: int) -> tuple[int, ...]:
        """Shape of a q-like tensor of ``rows`` tokens per sequence (total tokens in group mode)."""
        if self.layout == "thd":
            return (rows, heads, dim)
        return (self.batch, rows, heads, dim) if self.layout == "bshd" else (self.batch, heads, rows, dim)


@dataclass(frozen=True)
class FwdPlan(_Plan):
    want_keep: bool = False
    spec: KernelSpec | None = None
    launch: L.Launch | None = None
    o_shape: tuple[int, ...] = ()
    lse_shape: tuple[int, ...] = ()
    maps: tuple = ()                        #: the kernel's TMA tensor maps (launch.tma_boxes)


@dataclass(frozen=True)
class BwdPlan(_Plan):
    deterministic: bool = False
    want_dbias: bool = False
    specs: BwdSpecs | None = None
    dq_ws: L.DqWorkspace | None = None      #: the fp32 dQ accumulator (or slabs)
    block_n: int = 0                        #: keys per dq_dk_dv CTA
    block_m: int = 0                        #: query rows per dq_dk_dv step
    grad_shapes: tuple = ()                 #: (dq, dk, dv) shapes, in the inputs' layout
    lse_shape: tuple[int, ...] = ()
    kv_rows: int = 0                        #: rows of the GQA fp32 dK/dV workspaces (seqlen_k or total_k)
    dkdv_ws: tuple = ()                     #: GQA: (dk, dv) fp32 workspace shapes [kv_batch, nhead_q, kv_rows, d]; () without GQA
    launches: dict | None = None            #: kernel name -> Launch
    maps: tuple = ()                        #: dq_dk_dv's TMA tensor maps (launch.tma_boxes)

    @property
    def kv_batch(self) -> int:
        """Batch of the GQA dK/dV workspaces: 1 in group mode (tokens packed along the rows)."""
        return 1 if self.group_mode else self.batch


# --------------------------------------------------------------------------- memoization
#
# Resolution runs in two stages: the checks and everything that depends only on the arguments
# (memoized on the arrays' shapes, dtypes, strides and devices and the option values), then the
# kernel instances and launch geometry for the device (memoized on the first stage's result, the
# compute capability and the tuning variables). The first stage needs no GPU, so bad input is
# reported before CuPy or a device is looked for.

_CHECKED: dict = {}
_KERNELS: dict = {}


def _typed(v):
    """A cache key for an option value that tells apart values which compare equal but are not
    equally valid (``True`` / ``1`` / ``1.0``; ``(2, 0)`` / ``(2.0, 0.0)``; ``0`` / ``False``)."""
    if isinstance(v, (list, tuple)):
        return (type(v), tuple(_typed(x) for x in v))
    return (type(v), v)


def _array_key(a):
    if a is None:
        return None
    return (type(a), tuple(a.shape), a.dtype, tuple(a.strides), getattr(getattr(a, "device", None), "id", None))


def _checked(fn, arrays, kw):
    """``fn(*arrays, **kw)``, memoized on everything it reads. Failures are never cached, so bad
    input always raises. Group mode reads cu_seqlens values: never memoized."""
    if kw.get("layout") == "thd":
        return fn(*arrays, **kw)
    try:
        # in the caller's keyword order (the API passes a fixed order; another order only misses)
        key = (fn.__name__, tuple([_array_key(a) for a in arrays]),
               tuple([(k, _typed(v)) if v.__class__ in (list, tuple) else (k, v.__class__, v) for k, v in kw.items()]))
        hash(key)
    except (AttributeError, TypeError):
        return fn(*arrays, **kw)
    p = _CHECKED.get(key)
    if p is None:
        p = fn(*arrays, **kw)
        if len(_CHECKED) > 4096:
            _CHECKED.clear()
        _CHECKED[key] = p
    return p


def _for_device(fn, base, cc):
    """``fn(base, cc)`` memoized on the identity of ``base`` (a first-stage result, kept alive by
    the cache entry), the compute capability and the tuning variables."""
    key = (id(base), cc, tuning_key())
    hit = _KERNELS.get(key)
    if hit is not None and hit[0] is base:
        return hit[1]
    plan = fn(base, cc)
    if len(_KERNELS) > 4096:
        _KERNELS.clear()
    _KERNELS[key] = (base, plan)
    return plan


# --------------------------------------------------------------------------- shared resolution


def _reject_varlen_args(layout, kw) -> None:
    if layout == "thd":
        return
    for name in _VARLEN_ARGS:
        if kw.get(name) is not None:
            raise ValueError(f"{name}: variable-length inputs need layout='thd', got {layout!r}")


def _problem(q, k, v, extra, lse, kw):
    """(problem, rows_q, rows_k, window) for batch or group mode."""
    layout = kw["layout"]
    common = dict(softmax_scale=kw["softmax_scale"], causal=kw["causal"], window_size=kw["window_size"],
                  mask=kw["mask"], dtype=kw["dtype"])
    if layout == "thd":
        p = check_varlen_inputs(q, k, v, extra, cu_seqlens_q=kw["cu_seqlens_q"], cu_seqlens_k=kw["cu_seqlens_k"],
                                max_seqlen_q=kw["max_seqlen_q"], max_seqlen_k=kw["max_seqlen_k"], layout="thd",
                                lse=lse, **common)
        return p, p.max_seqlen_q, p.max_seqlen_k, L.kernel_window_spec(p.mask)
    _reject_varlen_args(layout, kw)
    if extra:
        (_, o), (_, do) = extra
        p = check_backward_inputs(do, q, k, v, o, lse, layout=layout, **common)
    else:
        p = check_forward_inputs(q, k, v, layout=layout, **common)
    return p, p.seqlen_q, p.seqlen_k, (*L.kernel_window(p.window), 0)


def _base(p, layout, rows_q, rows_k, window, bias, alibi_slopes, kw) -> _Plan:
    """The fields every plan has, after the feature checks (bias, ALiBi, dropout)."""
    if bias is not None and alibi_slopes is not None:
        check_alibi_slopes(alibi_slopes, p.batch, p.nhead_q, bias=bias)  # raises: both given
    bias_dt = None
    if bias is not None:
        bias_dt = check_bias(bias, p.batch, p.nhead_q, rows_q, rows_k, dtype=kw["dtype"],
                             varlen=isinstance(p, VarlenProblem))
    alibi_sb = None
    if alibi_slopes is not None:
        shape = check_alibi_slopes(alibi_slopes, p.batch, p.nhead_q)
        alibi_sb = p.nhead_q if len(shape) == 2 else 0
    drop = check_dropout(kw["dropout_p"], kw["seed"], kw["offset"])
    dtype = "bf16" if p.dtype == _BF16 else "fp16"
    bias_tma = 0
    # (a zero key stride broadcasts along the keys as a last dimension of 1 does: not through TMA)
    if bias_dt is not None and len(bias.shape) and int(bias.shape[-1]) > 1 and int(bias.strides[-1]) != 0:
        bias_tma = 4 if bias_dt == np.dtype(np.float32) else 2
    return _Plan(p, layout, dtype, p.batch, rows_q, rows_k, window, alibi_sb, bias_dt, drop, bias_tma)


@functools.lru_cache(maxsize=1024)
def _fwd_spec(dtype, hdim_q, hdim_v, cc, alibi, bias, dropout, wg_skip, bias_tma, short, _tuning):
    return fwd_spec(dtype, hdim_q, hdim_v, cc, alibi=alibi, bias=bias, dropout=dropout, wg_skip=wg_skip,
                    bias_tma=bias_tma, short=short)


@functools.lru_cache(maxsize=1024)
def _bwd_specs(dtype, hdim_q, hdim_v, cc, alibi, bias, dropout, deterministic, bias_tma, heads_x, diagonal, _tuning):
    return bwd_specs(dtype, hdim_q, hdim_v, cc, alibi=alibi, bias=bias, dropout=dropout, deterministic=deterministic,
                     bias_tma=bias_tma, heads_x=heads_x, diagonal=diagonal)


# --------------------------------------------------------------------------- forward


def _check_forward(q, k, v, bias, alibi_slopes, **kw) -> tuple[_Plan, bool]:
    p, rows_q, rows_k, window = _problem(q, k, v, [], None, kw)
    base = _base(p, kw["layout"], rows_q, rows_k, window, bias, alibi_slopes, kw)
    return base, check_flag("return_dropout_mask", kw["return_dropout_mask"])


def _forward_kernels(checked, cc) -> FwdPlan:
    base, want_keep = checked
    p = base.problem
    masked = min(base.window[0], base.window[1]) < L.WINDOW_INF  # (a diagonal: causal or a sliding window)
    diagonal = not base.group_mode and masked
    spec = _fwd_spec(base.dtype, p.hdim_q, p.hdim_v, cc, base.alibi_sb is not None, base.bias_dtype is not None,
                     base.dropout.enabled, use_wg_skip(diagonal, base.rows_q, cc), base.bias_tma,
                     use_fwd_ws_short(masked, base.rows_q, cc), tuning_key())
    o_rows = p.total_q if base.group_mode else base.rows_q
    tk = p.total_k if base.group_mode else base.rows_k
    maps = L.tma_boxes(spec, 1 if base.group_mode else p.batch, p.nhead_q, p.nhead_k, p.hdim_q, p.hdim_v, o_rows, tk)
    return FwdPlan(**vars(base), want_keep=want_keep, spec=spec, maps=maps,
                   launch=L.fwd_launch(spec, p.batch, p.nhead_q, base.rows_q),
                   o_shape=base.shape(o_rows, p.nhead_q, p.hdim_v), lse_shape=(p.batch, p.nhead_q, base.rows_q))


def plan_forward(q, k, v, *, bias=None, alibi_slopes=None, cc, **kw) -> FwdPlan:
    """Resolve :func:`cupy_fmha.attention_forward`'s arguments (``kw``: its keyword options)
    into a :class:`FwdPlan`, or raise the error naming the bad argument. ``cc`` is called, after
    every check has passed, for the device's compute capability (an int, e.g. 90).

    Raises:
        TypeError, ValueError: see :mod:`cupy_fmha.validate`.
    """
    checked = _checked(_check_forward, (q, k, v, bias, alibi_slopes), kw)
    return _for_device(_forward_kernels, checked, cc())


# --------------------------------------------------------------------------- backward


def _check_backward(do, q, k, v, o, lse, bias, alibi_slopes, dlse=None, **kw) -> tuple[_Plan, bool, bool]:
    deterministic = kw["deterministic"]
    if not isinstance(deterministic, (bool, np.bool_)):
        raise TypeError(f"deterministic: expected a bool, got {type(deterministic).__name__}")
    require_lse(lse)
    p, rows_q, rows_k, window = _problem(q, k, v, [("o", o), ("do", do)], lse, kw)
    # (only checked: the launcher subtracts it from D between dot_do_o and dq_dk_dv; no kernel changes)
    check_dlse(dlse, lse, (("do", do), ("q", q), ("k", k), ("v", v), ("o", o), ("lse", lse)),
               varlen=kw["layout"] == "thd")
    want_dbias = check_return_dbias(kw["return_dbias"], bias)
    base = _base(p, kw["layout"], rows_q, rows_k, window, bias, alibi_slopes, kw)
    return base, bool(deterministic), want_dbias


def _backward_kernels(checked, cc) -> BwdPlan:
    base, deterministic, want_dbias = checked
    p = base.problem
    # causal-like: the window's left side reaches every query row, its right side is limited
    causal = base.window[0] >= base.rows_q and base.window[1] < L.WINDOW_INF
    heads_x = use_heads_x(causal, base.rows_k, cc, p.nhead_q, max(p.hdim_q, p.hdim_v))
    diagonal = use_bwd_ws_diagonal(min(base.window[0], base.window[1]) < L.WINDOW_INF, causal, base.rows_k, cc)
    specs = _bwd_specs(base.dtype, p.hdim_q, p.hdim_v, cc, base.alibi_sb is not None, base.bias_dtype is not None,
                       base.dropout.enabled, deterministic, base.bias_tma, heads_x, diagonal, tuning_key())
    b, hq, hk = p.batch, p.nhead_q, p.nhead_k
    tq = p.total_q if base.group_mode else base.rows_q
    tk = p.total_k if base.group_mode else base.rows_k
    kv_batch = 1 if base.group_mode else b
    dkdv_ws = ((kv_batch, hq, tk, p.hdim_q), (kv_batch, hq, tk, p.hdim_v)) if p.group > 1 else ()
    dq_ws = L.dq_workspace(specs.dq_dk_dv, b, hq, base.rows_q, base.rows_k, p.hdim_q, deterministic)
    conv_dq = specs.convert_dq_split if dq_ws.nsplit else specs.convert_dq
    launches = {
        "dot_do_o": L.dot_do_o_launch(specs.dot_do_o, b, hq, base.rows_q),
        "dq_dk_dv": L.dq_dk_dv_launch(specs.dq_dk_dv, b, hq, base.rows_k),
        "convert_dq": L.convert_launch(conv_dq, b, hq, base.rows_q),
        "convert_dkdv": L.convert_launch(specs.convert_dq, kv_batch, hk, tk),
    }
    block_n, block_m = L.dq_dk_dv_blocks(specs.dq_dk_dv)
    return BwdPlan(**vars(base), deterministic=deterministic, want_dbias=want_dbias, specs=specs,
                   dq_ws=dq_ws,
                   block_n=block_n, block_m=block_m,
                   grad_shapes=(base.shape(tq, hq, p.hdim_q), base.shape(tk, hk, p.hdim_q),
                                base.shape(tk, hk, p.hdim_v)),
                   lse_shape=(b, hq, base.rows_q), kv_rows=tk, dkdv_ws=dkdv_ws, launches=launches,
                   maps=L.tma_boxes(specs.dq_dk_dv, kv_batch, hq, hk, p.hdim_q, p.hdim_v, tq, tk))


def plan_backward(do, q, k, v, o, lse, *, bias=None, alibi_slopes=None, dlse=None, cc, **kw) -> BwdPlan:
    """Resolve :func:`cupy_fmha.attention_backward`'s arguments (``kw``: its keyword options)
    into a :class:`BwdPlan`, or raise the error naming the bad argument; ``cc`` as in
    :func:`plan_forward`. ``dlse`` (lse's cotangent, optional) is checked here
    (:func:`cupy_fmha.validate.check_dlse`) and plays no part in the plan: the same kernels run
    with or without it.

    Raises:
        TypeError, ValueError: see :mod:`cupy_fmha.validate`.
    """
    checked = _checked(_check_backward, (do, q, k, v, o, lse, bias, alibi_slopes, dlse), kw)
    return _for_device(_backward_kernels, checked, cc())


# --------------------------------------------------------------------------- sizes for users


def dbias_stored_directly(bias_shape, scores: tuple, group_mode: bool) -> bool:
    """Whether the dq_dk_dv kernels store dS straight into dBias (in the bias's dtype, no fp32
    workspace and no reduction: :func:`cupy_fmha.api._direct_dbias`): in batch mode, for a bias
    that broadcasts along nothing, i.e. whose shape padded to 4-D with leading 1s is ``scores``,
    (batch, nhead_q, seqlen_q, seqlen_k)."""
    shape = tuple(int(n) for n in bias_shape)
    return not group_mode and (1,) * (4 - len(shape)) + shape == tuple(scores)


def _check_sizes_args(a: dict) -> tuple[str, bool]:
    """:func:`backward_workspace_bytes`'s arguments (``a``: its locals) checked as the call's would be;
    returns the dtype as 'fp16' / 'bf16' and ``deterministic``.

    Raises:
        TypeError, ValueError: naming the argument."""
    for name, least in (("batch", 1), ("nhead_q", 1), ("seqlen_q", 0), ("seqlen_k", 0), ("nhead_k", 1), ("cc", 0),
                        ("hdim_q", None), ("hdim_v", None)):
        check_int(name, a[name], least)
    _check_head_dims(int(a["hdim_q"]), int(a["hdim_v"]), ("hdim_q", "hdim_v"))
    if a["nhead_q"] % a["nhead_k"]:
        raise ValueError(f"nhead_k: {a['nhead_k']} must divide nhead_q={a['nhead_q']} (GQA/MQA)")
    for name in ("deterministic", "return_dbias", "dropout", "bias", "alibi", "group_mode", "causal",
                 "sliding_window"):
        check_flag(name, a[name])
    dt = normalize_dtype(a["dtype"])
    if dt is None:
        raise ValueError("dtype: expected 'float16' or 'bfloat16', got None")
    return ("bf16" if dt == _BF16 else "fp16"), bool(a["deterministic"])


def backward_workspace_bytes(batch: int, nhead_q: int, seqlen_q: int, seqlen_k: int, hdim_q: int,
                             hdim_v: int | None = None, *, nhead_k: int | None = None, deterministic: bool = False,
                             return_dbias: bool = False, dtype: str = "bf16", cc: int = 90,
                             dropout: bool = False, bias: bool = False, alibi: bool = False,
                             bias_shape: tuple | None = None, group_mode: bool = False, causal: bool = False,
                             sliding_window: bool = False) -> dict[str, int]:
    """Device memory, in bytes, that :func:`cupy_fmha.attention_backward` allocates besides its
    outputs, by workspace, plus ``"total"``.

    Args:
        batch, nhead_q, seqlen_q, seqlen_k, hdim_q, hdim_v: problem sizes (group mode: the
            number of sequences, max_seqlen_q and max_seqlen_k; hdim_v defaults to hdim_q).
        nhead_k: K/V heads (default nhead_q); with GQA, per-query-head fp32 dK/dV workspaces are
            added.
        deterministic: the dQ slabs of ``deterministic=True`` (one per key block).
        return_dbias: the fp32 dS workspace of dBias (none for a bias that broadcasts along nothing
            in batch mode: its dS is stored straight into dbias, an output; pass ``bias_shape``).
        dtype, cc, dropout, bias, alibi: pick the kernel instance as the call would (the slab
            count depends on its key block; ``cc`` is the compute capability, e.g. 90 for H100/H200,
            80 for A100; ``bias``: one that does not broadcast along the keys, which the
            warp-specialized Hopper backward takes).
        bias_shape, group_mode: the bias's shape and whether the call is in group mode (for the
            dBias workspace; without ``bias_shape`` it is counted).
        causal, sliding_window: the call's mask: ``causal`` a causal mask (or any window whose left
            side reaches every query row), ``sliding_window`` a window whose left side is shorter than
            seqlen_q (then ``causal`` is ignored). On the warp-specialized Hopper backward they can pick
            other query tiles, which round the dQ workspace's rows differently
            (:func:`cupy_fmha.spec.use_bwd_ws_diagonal`).

    Returns:
        ``{"delta": ..., "dq_accumulator": ..., "dkdv_gqa": ..., "dbias": ..., "total": ...}``.
        Group mode's GQA workspaces hold total_k rows instead of batch * seqlen_k: pass
        ``batch=1, seqlen_k=total_k`` for an exact figure there.

    Raises:
        TypeError, ValueError: naming the argument: sizes that are not ints (bools included) or below
            1 (seqlens below 0), head dims the kernels do not take, ``nhead_k`` not dividing
            ``nhead_q``, a flag that is not a bool, ``dtype`` other than fp16 / bf16 (``"float16"``,
            ``"bfloat16"`` and the NumPy types are taken as by :func:`cupy_fmha.attention_forward`).
    """
    hdim_v = hdim_q if hdim_v is None else hdim_v
    nhead_k = nhead_q if nhead_k is None else nhead_k
    dtype, deterministic = _check_sizes_args(locals())
    diagonal = use_bwd_ws_diagonal(bool(causal or sliding_window), bool(causal) and not sliding_window, seqlen_k, cc)
    specs = bwd_specs(dtype, hdim_q, hdim_v, cc, alibi=alibi, bias=bias, dropout=dropout,
                      deterministic=deterministic, bias_tma=2 if bias else 0, diagonal=diagonal)
    ws = L.dq_workspace(specs.dq_dk_dv, batch, nhead_q, seqlen_q, seqlen_k, hdim_q, deterministic)
    out = {"delta": 4 * batch * nhead_q * seqlen_q, "dq_accumulator": ws.nbytes,
           "dkdv_gqa": 4 * batch * nhead_q * seqlen_k * (hdim_q + hdim_v) if nhead_k != nhead_q else 0,
           "dbias": 4 * batch * nhead_q * seqlen_q * seqlen_k if return_dbias else 0}
    if bias_shape is not None and dbias_stored_directly(bias_shape, (batch, nhead_q, seqlen_q, seqlen_k), group_mode):
        out["dbias"] = 0
    out["total"] = sum(out.values())
    return out
