"""Dense NumPy reference (the oracle) for attention forward and backward.

Maths (per batch b and query head h; K/V head ``h // (nhead_q // nhead_k)``)::

    S   = scale * Q K^T + B,  masked entries = -inf      (B: bias, ALiBi or 0)
    LSE = logsumexp(S)              (rows with no visible key: -inf)
    P   = exp(S - LSE)              (rows with no visible key: 0)
    Z   = keep * s                  (dropout, s = 256 / threshold: philox.keep_scale; Z = 1 without dropout)
    O   = (P * Z) V
    D   = rowsum(dO * O)
    dV  = (P * Z)^T dO              (summed over each GQA group)
    dP  = (dO V^T) * Z
    dS  = P * (dP - D + g)          (g = dLSE, the cotangent of LSE: dLSE_i / dS_ij = P_ij; 0 by default)
    dQ  = scale * dS K
    dK  = scale * dS^T Q            (summed over each GQA group)
    dB  = dS                        (summed over the bias's broadcast dimensions)

Features:

* ``bias``: broadcastable (NumPy rules) to [batch, nhead_q, seqlen_q, seqlen_k] (varlen:
  [batch, nhead_q, max_seqlen_q, max_seqlen_k], indexed by positions local to each sequence),
  added after scaling and before the mask.
* ``alibi_slopes`` [nhead_q] or [batch, nhead_q] (FlashAttention's ALiBi): the bias
  ``-slope[b, h] * |i + seqlen_k - seqlen_q - j|`` with each sequence's own lengths.
* dropout (``dropout_p``, ``seed``, ``offset``): the keep mask of :mod:`cupy_fmha.philox`; LSE
  is that of the undropped softmax.
* varlen / group mode (``layout="thd"``, ``cu_seqlens_q``, ``cu_seqlens_k``): q
  [total_q, nhead_q, d], k/v [total_k, nhead_k, d/dv]; each sequence is its own attention
  problem (masks resolved with its own lengths; the dropout batch index is the sequence index);
  lse is [batch, nhead_q, max_seqlen_q] with ``-inf`` beyond each sequence's length.

``precision="float64"`` (default) computes everything in float64 from the upcast inputs.
``precision="low"`` emulates a plain same-precision implementation, as FlashAttention's tests use
it to set their tolerance: float32 arithmetic, with S, P, O, dP, dS, dQ, dK and dV rounded to the
inputs' dtype (fp16, bf16; float32 for float32/float64 inputs) where such an implementation would
store them; LSE and D stay float32. With a bias, S is rounded after the scaling and again after
adding the (float32-converted) bias; the dropout multiplier (``philox.keep_scale(p)``, 256 / threshold) is a float32 and P * Z
is rounded; dbias is summed in float32 and rounded to the bias's dtype (float32 for float64
biases). Results are returned as float64 arrays either way.

The work is vectorized over heads (one matmul per GEMM per batch entry / sequence); memory is
about six [nhead_q, sq, sk] float64 arrays at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from .mask import dense_mask
from .philox import dropout_keep_block
from .validate import (
    check_alibi_slopes,
    check_bias,
    check_dropout,
    check_flag,
    check_reference_inputs,
    check_return_dbias,
    check_varlen_inputs,
)

__all__ = ["attention_forward", "attention_backward"]

_BF16 = np.dtype(ml_dtypes.bfloat16)
_PRECISIONS = ("float64", "low")


def _host(name: str, a):
    """NumPy view of ``a`` (CuPy arrays are copied to the host)."""
    if not isinstance(a, np.ndarray) and hasattr(a, "get") and hasattr(a, "shape"):
        a = a.get()
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name}: expected a NumPy array, got {type(a).__name__}")
    return a


def _rounder(rdt):
    if rdt is None:
        return lambda x: x
    if rdt == np.float32:
        return lambda x: x.astype(np.float32)
    return lambda x: x.astype(rdt).astype(np.float32)


@dataclass
class _Setup:
    """Everything a pass needs, in the working dtype."""

    prob: object  # validate.Problem or validate.VarlenProblem
    varlen: bool
    arrays: dict  # batch: [b, h, s, d]; varlen: [t, h, d]
    work: type
    rnd: object
    batch: int
    seqlen_q: int  # batch: seqlen_q; varlen: max_seqlen_q
    seqlen_k: int
    bias: np.ndarray | None  # host bias as given
    bias4: np.ndarray | None  # broadcast view [batch, hq, seqlen_q, seqlen_k], working dtype
    slopes: np.ndarray | None  # [batch, hq], working dtype
    dropout: object  # validate.Dropout
    rp: object  # the kept elements' factor, philox.keep_scale(p), in the working dtype
    bias_rnd: object  # dbias rounding
    visible: np.ndarray | None  # batch mode: the one dense mask

    def lengths(self, b: int) -> tuple[int, int]:
        if not self.varlen:
            return self.seqlen_q, self.seqlen_k
        cq, ck = self.prob.cu_seqlens_q, self.prob.cu_seqlens_k
        return cq[b + 1] - cq[b], ck[b + 1] - ck[b]

    def get(self, name: str, b: int) -> np.ndarray:
        """[h, s, d] of batch entry / sequence ``b``."""
        a = self.arrays[name]
        if not self.varlen:
            return a[b]
        cu = self.prob.cu_seqlens_k if name in ("k", "v") else self.prob.cu_seqlens_q
        return np.ascontiguousarray(a[cu[b]:cu[b + 1]].transpose(1, 0, 2))

    def put(self, out: np.ndarray, name: str, b: int, x: np.ndarray) -> None:
        """Store [h, s, d] ``x`` for ``b`` into ``out`` (batch [b, h, s, d], varlen [t, h, d])."""
        if not self.varlen:
            out[b] = x
            return
        cu = self.prob.cu_seqlens_k if name in ("k", "v") else self.prob.cu_seqlens_q
        out[cu[b]:cu[b + 1]] = x.transpose(1, 0, 2)

    def mask(self, b: int, sq: int, sk: int) -> np.ndarray:
        if self.visible is not None:
            return self.visible
        return dense_mask(self.prob.mask, sq, sk)

    def additive(self, b: int, sq: int, sk: int):
        """Bias or ALiBi term [hq or 1, sq, sk] for ``b`` (``None`` without either)."""
        if self.bias4 is not None:
            return self.bias4[b, :, :sq, :sk]
        if self.slopes is not None:
            w = self.work
            dist = np.abs(np.arange(sq)[:, None] + (sk - sq) - np.arange(sk)[None, :]).astype(w)
            return -self.slopes[b][:, None, None] * dist
        return None

    def keep(self, b: int, sq: int, sk: int) -> np.ndarray:
        d = self.dropout
        return dropout_keep_block(d.seed, d.offset, b, self.prob.nhead_q, sq, sk, d.p)

    def multiplier(self, keep):
        """Z = keep * keep_scale(p) in the working dtype (``None`` without dropout)."""
        if not self.dropout.enabled:
            return None
        return np.where(keep, self.rp, self.work(0))


def _setup(named, precision, *, softmax_scale, causal, window_size, mask, layout, bias,
           alibi_slopes, dropout_p, seed, offset, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
           max_seqlen_k) -> _Setup:
    if precision not in _PRECISIONS:
        raise ValueError(f"precision: expected 'float64' or 'low', got {precision!r}")
    arrays = {name: _host(name, a) for name, a in named}
    q, k, v = arrays["q"], arrays["k"], arrays["v"]
    extra = [(n, a) for n, a in arrays.items() if n not in ("q", "k", "v")]
    mkw = dict(softmax_scale=softmax_scale, causal=causal, window_size=window_size, mask=mask)
    varlen = layout == "thd"
    if varlen:
        prob = check_varlen_inputs(
            q, k, v, extra, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
            max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, layout=layout,
            any_float=True, hdim_rule=False, strides=False, **mkw,
        )
        batch, sq, sk = prob.batch, prob.max_seqlen_q, prob.max_seqlen_k
    else:
        for name, val in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k),
                          ("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
            if val is not None:
                raise ValueError(
                    f"{name}: variable-length inputs need layout='thd', got {layout!r}"
                )
        prob = check_reference_inputs(q, k, v, extra, layout=layout, **mkw)
        batch, sq, sk = prob.batch, prob.seqlen_q, prob.seqlen_k
    drop = check_dropout(dropout_p, seed, offset)
    hq = prob.nhead_q
    if bias is not None:
        bias = _host("bias", bias)
        if alibi_slopes is not None:
            check_alibi_slopes(alibi_slopes, batch, hq, bias=bias)  # raises: both given
        bias_dt = check_bias(bias, batch, hq, sq, sk, any_float=True, varlen=varlen)
    if alibi_slopes is not None:
        alibi_slopes = _host("alibi_slopes", alibi_slopes)
        check_alibi_slopes(alibi_slopes, batch, hq, any_float=True)

    dt = prob.dtype
    if precision == "low":
        rdt = dt if dt.itemsize <= 4 else np.dtype(np.float32)
        work = np.float32
    else:
        rdt, work = None, np.float64
    conv = {}
    for name, a in arrays.items():
        if not varlen and prob.layout != "bhsd":
            a = a.transpose(0, 2, 1, 3)  # to [b, h, s, d]
        conv[name] = np.ascontiguousarray(a.astype(work))
    bias4 = bias_rnd = None
    if bias is not None:
        b4 = bias.astype(work).reshape((1,) * (4 - bias.ndim) + bias.shape)
        bias4 = np.broadcast_to(b4, (batch, hq, sq, sk))
        if precision == "low":
            bias_rnd = _rounder(bias_dt if bias_dt.itemsize <= 4 else np.dtype(np.float32))
        else:
            bias_rnd = _rounder(None)
    slopes = None
    if alibi_slopes is not None:
        slopes = np.broadcast_to(alibi_slopes.astype(work).reshape(-1, hq), (batch, hq))
    rp = work(drop.scale)
    visible = None if varlen else dense_mask(prob.mask, sq, sk)
    return _Setup(prob, varlen, conv, work, _rounder(rdt), batch, sq, sk, bias, bias4, slopes,
                  drop, rp, bias_rnd, visible)


def _forward_one(q, k, v, visible, scale, group, rnd, work, add=None, z=None):
    """One batch entry / sequence. q [hq, sq, d], k [hk, sk, d], v [hk, sk, dv]; ``add`` the
    bias term broadcastable to [hq, sq, sk]; ``z`` the dropout multiplier [hq, sq, sk].

    Returns p (undropped), pz (= p * z, or p), o, lse, and the group-expanded k, v."""
    kx = np.repeat(k, group, axis=0) if group > 1 else k
    vx = np.repeat(v, group, axis=0) if group > 1 else v
    hq, sq, sk = q.shape[0], q.shape[1], k.shape[1]
    if sk == 0:  # no keys at all: every row is empty
        p = np.zeros((hq, sq, 0), dtype=work)
        o = np.zeros((hq, sq, v.shape[2]), dtype=work)
        return p, p, o, np.full((hq, sq), work(-np.inf)), kx, vx
    s = rnd(work(scale) * np.matmul(q, kx.transpose(0, 2, 1)))
    if add is not None:
        s = rnd(s + add)
    s = np.where(visible, s, work(-np.inf))
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, work(0))  # empty rows: any finite shift works
    e = np.exp(s - m)  # exp(-inf) = 0 at masked entries
    denom = e.sum(axis=-1, keepdims=True)
    has = denom > 0
    safe = np.where(has, denom, work(1))
    p = rnd(e / safe)
    lse = np.where(has, m + np.log(safe), work(-np.inf))[..., 0]
    pz = p if z is None else rnd(p * z)
    o = rnd(np.matmul(pz, vx))
    return p, pz, o, lse, kx, vx


def _dlse(dlse, shape: tuple, what: str):
    """The reference backward's ``dlse`` on the host (None kept): any float array of lse's
    ``shape`` [batch, nhead_q, ``what``]."""
    if dlse is None:
        return None
    if not all(hasattr(dlse, a) for a in ("shape", "dtype")):
        raise TypeError(f"dlse: expected a float array of lse's shape {shape} or None, got "
                        f"{type(dlse).__module__}.{type(dlse).__name__}")
    dlse = _host("dlse", dlse)
    if not (dlse.dtype.kind == "f" or dlse.dtype == _BF16):
        raise TypeError(f"dlse: expected a floating-point array, got dtype {dlse.dtype}")
    if tuple(dlse.shape) != shape:
        raise ValueError(f"dlse: expected lse's shape {shape} [batch, nhead_q, {what}], got {tuple(dlse.shape)}")
    return dlse


def _to_layout(a, layout):
    return a if layout == "bhsd" else a.transpose(0, 2, 1, 3)


def attention_forward(
    q,
    k,
    v,
    *,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    mask=None,
    layout="bshd",
    precision="float64",
    bias=None,
    alibi_slopes=None,
    dropout_p=0.0,
    seed=0,
    offset=0,
    return_dropout_mask=False,
    cu_seqlens_q=None,
    cu_seqlens_k=None,
    max_seqlen_q=None,
    max_seqlen_k=None,
):
    """Reference attention forward.

    Args:
        q: [b, sq, hq, d] (``layout="bshd"``), [b, hq, sq, d] (``"bhsd"``) or
            [total_q, hq, d] (``"thd"``, varlen); any float dtype (float16,
            ``ml_dtypes.bfloat16``, float32, float64). CuPy arrays are copied over.
        k: [b, sk, hk, d] / [b, hk, sk, d] / [total_k, hk, d], same dtype; ``hq % hk == 0``.
        v: [b, sk, hk, dv] / [b, hk, sk, dv] / [total_k, hk, dv], same dtype.
        softmax_scale: default ``1/sqrt(d)``.
        causal, window_size, mask: see :func:`cupy_fmha.mask.resolve_mask` (varlen: resolved
            per sequence with its own lengths).
        precision: ``"float64"`` or ``"low"`` (see the module docstring).
        bias: any float array broadcastable to [b, hq, sq, sk] whatever the layout (varlen:
            [b, hq, max_seqlen_q, max_seqlen_k], local positions); added after scaling.
        alibi_slopes: [hq] or [b, hq] (not with ``bias``).
        dropout_p, seed, offset: dropout probability in [0, 1) and the uint64 Philox seed and
            offset (:mod:`cupy_fmha.philox`).
        return_dropout_mask: also return the boolean keep mask.
        cu_seqlens_q, cu_seqlens_k: int32 [b + 1] offsets (``layout="thd"`` only).
        max_seqlen_q, max_seqlen_k: varlen only; default the longest sequence; set lse's and
            the bias's sequence dimensions.

    Returns:
        ``(o, lse)`` or, with ``return_dropout_mask``, ``(o, lse, keep)``: o float64 in q's
        layout with head dim dv; lse float64 [b, hq, sq] (varlen [b, hq, max_seqlen_q], ``-inf``
        beyond each sequence), ``-inf`` for rows with no visible key (whose o row is 0); keep
        bool [b, hq, sq, sk] (varlen: a list of [hq, sq_i, sk_i]).

    Raises:
        TypeError, ValueError: as :mod:`cupy_fmha.validate` (any float dtype and head dim are
            allowed here); ``precision`` not one of ``"float64"``, ``"low"``.
    """
    want_keep = check_flag("return_dropout_mask", return_dropout_mask)
    st = _setup(
        [("q", q), ("k", k), ("v", v)], precision, softmax_scale=softmax_scale, causal=causal,
        window_size=window_size, mask=mask, layout=layout, bias=bias, alibi_slopes=alibi_slopes,
        dropout_p=dropout_p, seed=seed, offset=offset, cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
    )
    prob = st.prob
    hq, dv_ = prob.nhead_q, prob.hdim_v
    lse = np.full((st.batch, hq, st.seqlen_q), -np.inf)
    if st.varlen:
        o = np.zeros((prob.total_q, hq, dv_))
    else:
        o = np.empty((st.batch, hq, st.seqlen_q, dv_))
    # the keep masks are stored only when asked for: [batch, nhead_q, seqlen_q, seqlen_k] bools
    # would otherwise be allocated (and discarded) on every call, with or without dropout
    keeps = None
    if want_keep:
        keeps = [] if st.varlen else np.empty((st.batch, hq, st.seqlen_q, st.seqlen_k), dtype=bool)
    for b in range(st.batch):
        sq, sk = st.lengths(b)
        keep = st.keep(b, sq, sk) if (st.dropout.enabled or want_keep) else None
        if want_keep:
            if st.varlen:
                keeps.append(keep)
            else:
                keeps[b] = keep
        if sq == 0:
            continue
        _, _, ob, lb, _, _ = _forward_one(
            st.get("q", b), st.get("k", b), st.get("v", b), st.mask(b, sq, sk),
            prob.softmax_scale, prob.group, st.rnd, st.work, st.additive(b, sq, sk),
            st.multiplier(keep),
        )
        st.put(o, "q", b, ob)
        lse[b, :, :sq] = lb
    if not st.varlen:
        o = np.ascontiguousarray(_to_layout(o, prob.layout))
    if want_keep:
        return o, lse, keeps
    return o, lse


def attention_backward(
    do,
    q,
    k,
    v,
    *,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    mask=None,
    layout="bshd",
    precision="float64",
    bias=None,
    alibi_slopes=None,
    dropout_p=0.0,
    seed=0,
    offset=0,
    return_dbias=False,
    cu_seqlens_q=None,
    cu_seqlens_k=None,
    max_seqlen_q=None,
    max_seqlen_k=None,
    dlse=None,
):
    """Reference attention backward (recomputes the forward; no o/lse needed).

    Args:
        do: [b, sq, hq, dv] (``bshd``), [b, hq, sq, dv] (``bhsd``) or [total_q, hq, dv]
            (``thd``), same dtype as q.
        q, k, v, softmax_scale, causal, window_size, mask, layout, precision, bias,
            alibi_slopes, dropout_p, seed, offset, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
            max_seqlen_k: as :func:`attention_forward`.
        return_dbias: also return dbias (needs ``bias``).
        dlse: optional cotangent of the forward's lse (the gradient of the loss with respect to
            lse, lse in natural-log units): any float array [b, hq, sq] (varlen: [b, hq,
            max_seqlen_q]; entries past each sequence's length are ignored). Since
            dLSE_i / dS_ij = P_ij, it adds g_i P_ij to dS: dS = P * (dP - D + g) (FlashAttention's
            D with the lse term of the softmax gradient). None (default): zero. Used as given: a
            NaN or an infinity gives non-finite gradients, also in a row that sees no key
            (P = 0, but 0 * inf is NaN); varlen never reads a sequence without keys.

    Returns:
        ``(dq, dk, dv)`` or, with ``return_dbias``, ``(dq, dk, dv, dbias)``; float64 in the
        inputs' layout: dq like q; dk like k and dv like v, with ``nhead_k`` heads (each the sum
        over its group of query heads); dbias with the bias's own shape (dS summed over the
        dimensions the bias broadcasts along; zero where no sequence reaches, in varlen mode).
        Rows with no visible key contribute nothing (zero dq rows), never NaN.

    Raises:
        TypeError, ValueError: as :func:`attention_forward`, plus do's shape/dtype,
            ``return_dbias`` without ``bias`` and dlse's type, dtype and shape.
    """
    want_dbias = check_return_dbias(return_dbias, bias)
    st = _setup(
        [("q", q), ("k", k), ("v", v), ("do", do)], precision, softmax_scale=softmax_scale,
        causal=causal, window_size=window_size, mask=mask, layout=layout, bias=bias,
        alibi_slopes=alibi_slopes, dropout_p=dropout_p, seed=seed, offset=offset,
        cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k,
    )
    prob, rnd, work = st.prob, st.rnd, st.work
    scale = work(prob.softmax_scale)
    hq, hk, g = prob.nhead_q, prob.nhead_k, prob.group
    glse = _dlse(dlse, (st.batch, hq, st.seqlen_q), "max_seqlen_q" if st.varlen else "seqlen_q")
    d, dv_ = prob.hdim_q, prob.hdim_v
    if st.varlen:
        dq = np.zeros((prob.total_q, hq, d))
        dk = np.zeros((prob.total_k, hk, d))
        dv = np.zeros((prob.total_k, hk, dv_))
    else:
        dq = np.empty((st.batch, hq, st.seqlen_q, d))
        dk = np.empty((st.batch, hk, st.seqlen_k, d))
        dv = np.empty((st.batch, hk, st.seqlen_k, dv_))
    dbias4 = None
    if want_dbias:
        bshape = (1,) * (4 - st.bias.ndim) + st.bias.shape
        dbias4 = np.zeros(bshape, dtype=work)
    for b in range(st.batch):
        sq, sk = st.lengths(b)
        if sq == 0 or sk == 0:
            continue  # varlen only: outputs stay zero
        qb, dob = st.get("q", b), st.get("do", b)
        z = st.multiplier(st.keep(b, sq, sk)) if st.dropout.enabled else None
        p, pz, o, _, kx, vx = _forward_one(
            qb, st.get("k", b), st.get("v", b), st.mask(b, sq, sk), scale, g, rnd, work,
            st.additive(b, sq, sk), z,
        )
        D = np.sum(dob * o, axis=-1, keepdims=True)
        if glse is not None:  # the lse term: dS = P * (dP - (D - g)); D stays float32 in "low"
            D = D - glse[b, :, :sq, None].astype(D.dtype)
        dv_h = np.matmul(pz.transpose(0, 2, 1), dob)  # [hq, sk, dv]
        st.put(dv, "v", b, rnd(dv_h.reshape(hk, g, sk, dv_).sum(axis=1)))
        dp = rnd(np.matmul(dob, vx.transpose(0, 2, 1)))
        if z is not None:
            dp = rnd(dp * z)
        ds = rnd(p * (dp - D))
        st.put(dq, "q", b, rnd(scale * np.matmul(ds, kx)))
        dk_h = np.matmul(ds.transpose(0, 2, 1), qb)  # [hq, sk, d]
        st.put(dk, "k", b, rnd(scale * dk_h.reshape(hk, g, sk, d).sum(axis=1)))
        if dbias4 is not None:
            x = ds
            for axis, n in ((0, dbias4.shape[1]), (1, dbias4.shape[2]), (2, dbias4.shape[3])):
                if n == 1:
                    x = x.sum(axis=axis, keepdims=True)
            bi = b if dbias4.shape[0] > 1 else 0
            dbias4[bi, :, : x.shape[1], : x.shape[2]] += x
    if st.varlen:
        grads = (dq, dk, dv)
    else:
        lay = prob.layout
        grads = tuple(np.ascontiguousarray(_to_layout(x, lay)) for x in (dq, dk, dv))
    if want_dbias:
        dbias = st.bias_rnd(dbias4).astype(np.float64).reshape(st.bias.shape)
        return (*grads, dbias)
    return grads
