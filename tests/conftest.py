"""Shared pytest setup and the GPU test helpers.

``gpu``-marked tests are skipped cleanly without CuPy or a CUDA device (the collection hook
below). Everything the ``tests/test_gpu_*.py`` files share lives here once, as plain functions,
classes and constants that the test files import with ``from conftest import ...``:

* :func:`nan_like`: NaN-poisoned device buffers for ``out=`` (an element a kernel fails to write
  stays NaN and fails the comparison); :func:`nan_block_in_pool`: a NaN block freed back into
  CuPy's memory pool, so the next allocation of that size (a workspace) starts as NaN. After
  every ``gpu`` test the pool is emptied (an autouse fixture), as the old per-file fixtures did.
* :func:`seed_for`: a stable seed from any key (crc32 of its repr).
* input builders: :class:`Inputs` (batch mode, ``bshd``/``bhsd``), :class:`BiasInputs` (plus an
  elementwise bias), :class:`Packed` (group mode, ``thd`` with cu_seqlens). Scores are
  ~ N(0, 1.5^2). bf16 travels to the device as uint16 bits with ``dtype="bfloat16"``
  (``bf16_bits=True``, the default) or as CuPy's native bfloat16 (``bf16_bits=False``).
* :func:`run`: forward then backward through poisoned ``out=`` buffers.
* :func:`check` (= :func:`reference_outputs` + :func:`assert_close`): every output against the
  float64 and the ``precision="low"`` references by :func:`cupy_fmha.verify.compare`.
"""

from __future__ import annotations

import functools
import os
import sys
import zlib


def _share_blas_threads(workers: int) -> None:
    """Size the BLAS / OpenMP pools of ``workers`` pytest-xdist workers to their share of the cores.

    The GPU suite runs ``-n 16`` on a 16-core machine, each worker computing float64 NumPy
    references beside the others: with every worker's OpenBLAS sized to all cores, 16 workers start
    256 threads on 16 cores. ``CUPY_FMHA_TEST_BLAS_THREADS`` sets the count (``0``: leave the pools alone); an
    environment variable the caller already set (``OPENBLAS_NUM_THREADS`` ...) is kept. OpenBLAS reads
    the variables when it loads, so they are set twice: in the controller (:func:`pytest_configure`,
    before xdist starts the workers, which inherit them: this holds even where a plugin imports NumPy
    before this file), and at a worker's import of this file (a worker started some other way).
    """
    want = os.environ.get("CUPY_FMHA_TEST_BLAS_THREADS", "")
    if workers <= 0 or want == "0":
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    n = want or str(max(1, cores // workers))  # (the cores this process may run on, as OpenBLAS counts them)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, n)


if "numpy" not in sys.modules:
    _share_blas_threads(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0))

import ml_dtypes  # noqa: E402 - after the thread counts above
import numpy as np
import pytest

try:  # GPU helpers need CuPy at run time only; collection works without it
    import cupy as cp
except Exception:  # pragma: no cover - no CuPy at all, or its CUDA libraries fail to load
    cp = None

import cupy_fmha  # lazy package: the API (and CuPy) load on first attribute access
from cupy_fmha import philox
from cupy_fmha import reference as R
from cupy_fmha.verify import bf16_bits_to_float, compare

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)


# --------------------------------------------------------------------------- GPU skipping


def device_key():
    """The current device's backend key as the library resolves it (``api._cc``): the compute
    capability as an int on CUDA (90 on H100/H200), the gfx target string on ROCm ("gfx942").
    GPU tests use this, not ``Device().compute_capability``: cupy-rocm reports major/minor of the
    gfx target there ("90" on gfx90a, "94" on gfx942), which would pass for sm_90."""
    import cupy

    from cupy_fmha import api

    return api._cc(cupy)


def is_sm90() -> bool:
    """Whether the current device is an sm_90 GPU (wgmma, TMA: the Hopper kernels and probes)."""
    return device_key() == 90


@functools.lru_cache(maxsize=1)
def gpu_unavailable_reason() -> str | None:
    """``None`` when CuPy imports and sees at least one device, else why not."""
    try:
        import cupy
    except Exception as exc:  # ImportError, or a CUDA library failing to load
        return f"CuPy not importable ({type(exc).__name__}: {exc})"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return f"no CUDA device ({type(exc).__name__}: {exc})"
    if n <= 0:
        return "no CUDA device"
    return None


def pytest_configure(config):
    """In the pytest-xdist controller, before it starts its workers: their BLAS pools' share of the
    cores, through the environment they inherit (:func:`_share_blas_threads`)."""
    workers = getattr(config.option, "numprocesses", None)  # (xdist has turned "auto" into a count by now)
    if isinstance(workers, int) and not os.environ.get("PYTEST_XDIST_WORKER"):
        _share_blas_threads(workers)


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    reason = gpu_unavailable_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"needs a GPU: {reason}")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def require_gpu():
    reason = gpu_unavailable_reason()
    if reason is not None:
        pytest.skip(f"needs a GPU: {reason}")


@pytest.fixture(autouse=True)
def _free_device_pool(request):
    """After each ``gpu`` test (skipped ones never get here), hand CuPy's pooled blocks back."""
    yield
    if request.node.get_closest_marker("gpu") is not None and cp is not None:
        cp.get_default_memory_pool().free_all_blocks()


# --------------------------------------------------------------------------- poisoning, seeds


def nan_like(shape, dtype):
    """A fresh device buffer filled with NaN bits: NaN for float32, 0xFFFF for 16-bit elements
    (fp16, bf16 bits or native bf16). Handed to the API as ``out=``, so any element a kernel
    fails to write stays NaN and fails the comparison."""
    a = cp.empty(shape, dtype=dtype)
    if a.dtype == cp.float32:
        a.fill(cp.nan)
    else:
        a.view(cp.uint16).fill(0xFFFF)
    return a


def nan_block_in_pool(shape):
    """Returns a function that fills a float32 block of ``shape`` with NaN and frees it back to
    CuPy's memory pool, so the next allocation of that size (the backward's dQ workspace) starts
    as NaN instead of whatever the pool held."""

    def poison():
        junk = cp.full(shape, cp.nan, dtype=cp.float32)
        del junk

    return poison


def seed_for(*key) -> int:
    """A stable RNG seed for any key (crc32 of its repr)."""
    return zlib.crc32(repr(key).encode())


# --------------------------------------------------------------------------- input builders


def layout_shape(layout, b, s, h, d):
    """[b, s, h, d] for ``bshd``, [b, h, s, d] for ``bhsd``."""
    return (b, s, h, d) if layout == "bshd" else (b, h, s, d)


def cu_seqlens(lengths) -> np.ndarray:
    """int32 [0, l0, l0 + l1, ...]."""
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


class _Tensors:
    """Random q, k, v, dO of the given shapes, rounded to ``dtype`` (fp16 or bf16): host copies
    ``host`` for the reference, device copies ``dev``; ``rng`` continues the same stream."""

    def __init__(self, dtype, shapes, seed, bf16_bits=True):
        self.rng = rng = np.random.default_rng(seed)
        self.dtype = np.dtype(dtype)
        #: bf16 as uint16 bits with dtype="bfloat16" (True) or as native CuPy bfloat16 (False)
        self.bf16_bits = bool(bf16_bits)
        if self.dtype == BF16:
            self.dtype_arg = "bfloat16" if self.bf16_bits else None
        else:
            self.dtype_arg = "float16"
        self.d, self.dv = shapes["q"][-1], shapes["v"][-1]
        # scores ~ N(0, 1.5^2): softmax neither uniform nor one-hot
        self.host = {
            "q": self._round(1.5 * rng.standard_normal(shapes["q"])),
            "k": self._round(rng.standard_normal(shapes["k"])),
            "v": self._round(rng.standard_normal(shapes["v"])),
            "do": self._round(rng.standard_normal(shapes["do"])),
        }
        self.dev = {n: self.to_device(x) for n, x in self.host.items()}

    def _round(self, x):
        return x.astype(np.float32).astype(self.dtype)

    def to_device(self, x):
        """A host array on the device; bf16 as uint16 bits when ``bf16_bits``."""
        if x.dtype == BF16 and self.bf16_bits:
            return cp.asarray(np.ascontiguousarray(x).view(np.uint16))
        return cp.asarray(x)

    def to_float(self, x, dtype=None):
        """A device result (in ``dtype``, default the inputs') as float64 NumPy; bf16 results
        are read as uint16 bits when ``bf16_bits`` (anything else raises)."""
        dtype = self.dtype if dtype is None else np.dtype(dtype)
        if dtype == BF16 and self.bf16_bits and x.dtype == np.uint16:
            return bf16_bits_to_float(x).astype(np.float64)
        if dtype == BF16 and x.dtype != BF16:  # bits where native bf16 was expected
            raise TypeError(f"expected a bfloat16 result, got dtype {x.dtype}")
        return cp.asnumpy(x).astype(np.float64)


class Inputs(_Tensors):
    """Batch mode: q [b, sq, hq, d], k [b, sk, hk, d], v [b, sk, hk, dv], dO [b, sq, hq, dv]
    (``bshd``; ``bhsd`` swaps the sequence and head axes)."""

    def __init__(self, dtype, layout, b, sq, sk, hq, hk, d, dv, seed, *, bf16_bits=True):
        self.layout = layout
        shapes = {"q": layout_shape(layout, b, sq, hq, d), "k": layout_shape(layout, b, sk, hk, d),
                  "v": layout_shape(layout, b, sk, hk, dv), "do": layout_shape(layout, b, sq, hq, dv)}
        super().__init__(dtype, shapes, seed, bf16_bits)

    def api_kw(self, kw, cu_on_device=True):
        return dict(kw)

    def lse_shape(self, q, kw):
        bshd = kw.get("layout", "bshd") == "bshd"
        return (q.shape[0], q.shape[2], q.shape[1]) if bshd else (q.shape[0], q.shape[1], q.shape[2])

    def reference_kw(self, kw):
        return dict(kw, layout=self.layout)


#: bias shape kinds (batch mode) -> shape from (b, h, sq, sk)
BIAS_SHAPES = {
    "11": lambda b, h, sq, sk: (1, 1, sq, sk),   # CK e:0
    "1h": lambda b, h, sq, sk: (1, h, sq, sk),   # CK e:1
    "bh": lambda b, h, sq, sk: (b, h, sq, sk),   # CK e:2
    "2d": lambda b, h, sq, sk: (sq, sk),
    "lastb": lambda b, h, sq, sk: (b, h, sq, 1),  # broadcast along the keys: key stride 0
    "rows": lambda b, h, sq, sk: (h, 1, sk),     # broadcast along the query rows
}


def bias_to_device(inp, bias):
    """A host bias as handed to the API with the inputs ``inp``: bf16 as uint16 bits when the
    inputs are bf16 bits (``dtype="bfloat16"``), as the NumPy ml_dtypes array itself under fp16
    inputs (the API copies it over), as native CuPy bfloat16 under native bf16 inputs; other
    dtypes as CuPy arrays."""
    if bias.dtype == BF16 and inp.bf16_bits:
        return cp.asarray(bias.view(np.uint16)) if inp.dtype == BF16 else bias
    return cp.asarray(bias)


class BiasInputs(Inputs):
    """:class:`Inputs` plus an elementwise bias of ``bias_shape`` (``bias_scale`` * N(0, 1),
    drawn after the inputs from the same stream) or ``bias_host``, rounded to ``bias_dtype``:
    ``bias`` on the host, ``dev_bias`` as handed to the API (:func:`bias_to_device`)."""

    def __init__(self, dtype, bias_dtype, layout, b, sq, sk, hq, hk, d, dv, bias_shape, seed,
                 bias_scale=2.0, bias_host=None, *, bf16_bits=True):
        super().__init__(dtype, layout, b, sq, sk, hq, hk, d, dv, seed, bf16_bits=bf16_bits)
        self.bias_dtype = np.dtype(bias_dtype)
        if bias_host is None:
            bias_host = bias_scale * self.rng.standard_normal(bias_shape)
        self.bias = np.asarray(bias_host).astype(np.float32).astype(self.bias_dtype)
        self.dev_bias = bias_to_device(self, self.bias)

    def reference_kw(self, kw):
        return dict(kw, layout=self.layout, bias=self.bias)


# varlen lengths with empty sequences in the middle or at the ends
LQ, LK = [100, 37, 0, 250], [80, 0, 51, 250]  # the lead's lengths: empty q and empty k in the middle
LQ2, LK2 = [64, 0, 130, 1, 77], [0, 70, 130, 200, 0]  # empty k at both ends, empty q in the middle
LQ3, LK3 = [50, 0, 33], [40, 0, 33]  # both empty in the middle


class Packed(_Tensors):
    """Group mode: packed q [total_q, hq, d], k/v [total_k, hk, d/dv], dO; the cu_seqlens
    ``cq``, ``ck`` (host int32) for sequences of lengths ``lq``, ``lk``."""

    def __init__(self, dtype, lq, lk, hq, hk, d, dv, seed, *, bf16_bits=True):
        tq, tk = sum(lq), sum(lk)
        self.cq, self.ck = cu_seqlens(lq), cu_seqlens(lk)
        self.batch, self.hq = len(lq), hq
        shapes = {"q": (tq, hq, d), "k": (tk, hk, d), "v": (tk, hk, dv), "do": (tq, hq, dv)}
        super().__init__(dtype, shapes, seed, bf16_bits)

    def api_kw(self, kw, cu_on_device=True):
        """``kw`` plus layout ``thd`` and the cu_seqlens (CuPy arrays, or NumPy ones)."""
        cu = (cp.asarray(self.cq), cp.asarray(self.ck)) if cu_on_device else (self.cq, self.ck)
        return dict(kw, layout="thd", cu_seqlens_q=cu[0], cu_seqlens_k=cu[1])

    def lse_shape(self, q, kw):
        return (self.batch, self.hq, kw.get("max_seqlen_q") or int(np.diff(self.cq).max()))

    def reference_kw(self, kw):
        return dict(kw, layout="thd", cu_seqlens_q=self.cq, cu_seqlens_k=self.ck)


# --------------------------------------------------------------------------- running


def run(inp, kw, *, dev=None, before_backward=None, want_keep=False, bias=None, dbias=None,
        cu_on_device=True, dlse=None):
    """Forward then backward of ``inp`` (or the device arrays ``dev``) with the API keywords
    ``kw``, through NaN-poisoned ``out=`` buffers (checked to be the arrays returned).

    ``before_backward`` runs between the two calls; ``want_keep`` asks the forward for the
    dropout keep mask; ``bias`` is passed to both calls and ``dbias`` as ``return_dbias`` (the
    type of the gradients is checked); ``dlse`` (lse's cotangent) to the backward only. Returns
    (o, lse, grads), plus the keep mask with ``want_keep``."""
    dev = dev or inp.dev
    q, k, v, do = dev["q"], dev["k"], dev["v"], dev["do"]
    kw = dict(inp.api_kw(kw, cu_on_device), dtype=inp.dtype_arg)
    if bias is not None:
        kw["bias"] = bias
    fwd = {"return_dropout_mask": True} if want_keep else {}
    bwd = {} if dbias is None else {"return_dbias": dbias}
    if dlse is not None:
        bwd["dlse"] = dlse
    o_out, lse_out = nan_like(do.shape, q.dtype), nan_like(inp.lse_shape(q, kw), cp.float32)
    res = cupy_fmha.attention_forward(q, k, v, **kw, **fwd, out=(o_out, lse_out))
    o, lse = res[0], res[1]
    assert o is o_out and lse is lse_out
    grads_out = tuple(nan_like(x.shape, q.dtype) for x in (q, k, v))
    if before_backward is not None:
        before_backward()
    g = cupy_fmha.attention_backward(do, q, k, v, o, lse, **kw, **bwd, out=grads_out)
    assert all(x is y for x, y in zip(g, grads_out))
    if dbias:
        assert isinstance(g, cupy_fmha.AttentionGradsWithBias) and len(g) == 4
        assert isinstance(g.dbias, cp.ndarray) and g.dbias.shape == tuple(bias.shape)
        assert g.dbias.dtype == dbias_dtype(inp, bias)
    elif dbias is not None:
        assert type(g) is cupy_fmha.AttentionGrads and len(g) == 3
    cp.cuda.get_current_stream().synchronize()
    return (o, lse, g, res[2]) if want_keep else (o, lse, g)


def dbias_dtype(inp, bias):
    """The dtype dbias comes back in for ``bias`` (as handed to the API, or its host copy): bf16
    as uint16 bits when bf16 inputs travel as bits (the bias then travels as bits too), else the
    bias's own dtype (a NumPy bf16 bias under fp16 inputs comes back as native bf16)."""
    dt = np.dtype(bias.dtype)
    return np.dtype(np.uint16) if dt == BF16 and inp.dtype == BF16 and inp.bf16_bits else dt


def keep_reference(b, hq, sq, sk, p, seed, offset):
    """The dropout keep mask [b, hq, sq, sk] from :mod:`cupy_fmha.philox`."""
    return np.stack([philox.dropout_keep_block(seed, offset, i, hq, sq, sk, p) for i in range(b)])


# --------------------------------------------------------------------------- judging


def reference_outputs(inp, o, lse, g, kw, *, dbias=False, dlse=None):
    """{name: (result as float64, float64 reference, ``precision="low"`` reference)} for o, lse,
    dq, dk, dv (and dbias, in the dtype of the host bias in ``kw`` or ``inp``), the references
    run with ``kw`` (host arrays: ALiBi slopes, bias) and the layout of ``inp``; ``dlse`` (a host
    array, lse's cotangent) goes to the reference backwards."""
    h = inp.host
    rkw = inp.reference_kw(kw)
    ref_o, ref_lse = R.attention_forward(h["q"], h["k"], h["v"], **rkw)
    low_o, low_lse = R.attention_forward(h["q"], h["k"], h["v"], precision="low", **rkw)
    extra = {"return_dbias": True} if dbias else {}
    if dlse is not None:
        extra["dlse"] = dlse
    ref_g = R.attention_backward(h["do"], h["q"], h["k"], h["v"], **extra, **rkw)
    low_g = R.attention_backward(h["do"], h["q"], h["k"], h["v"], precision="low", **extra, **rkw)
    outs = {
        "o": (inp.to_float(o), ref_o, low_o),
        "lse": (cp.asnumpy(lse).astype(np.float64), ref_lse, low_lse),
        "dq": (inp.to_float(g.dq), ref_g[0], low_g[0]),
        "dk": (inp.to_float(g.dk), ref_g[1], low_g[1]),
        "dv": (inp.to_float(g.dv), ref_g[2], low_g[2]),
    }
    if dbias:
        assert g.dbias.dtype == dbias_dtype(inp, rkw["bias"])
        outs["dbias"] = (inp.to_float(g.dbias, rkw["bias"].dtype), ref_g[3], low_g[3])
    return outs


def assert_close(inp, outs, bias_dtype=None):
    """Every non-empty entry of ``outs`` passes :func:`cupy_fmha.verify.compare` (dtype: the
    inputs', ``bias_dtype`` for dbias; head dims: the inputs')."""
    checks = [compare(n, out, ref, low, dtype=bias_dtype if n == "dbias" else inp.dtype,
                      hdim_q=inp.d, hdim_v=inp.dv)
              for n, (out, ref, low) in outs.items() if out.size]
    bad = [str(c) for c in checks if not c.ok]
    assert not bad, "\n".join(bad)


def check(inp, o, lse, g, kw, *, dbias=False, dlse=None):
    """:func:`reference_outputs` judged by :func:`assert_close`; returns the outputs."""
    outs = reference_outputs(inp, o, lse, g, kw, dbias=dbias, dlse=dlse)
    assert_close(inp, outs, inp.reference_kw(kw)["bias"].dtype if dbias else None)
    return outs


def check_group(inp, o, lse, g, kw, *, dbias=False, dlse=None):
    """:func:`check` for group mode (:class:`Packed`): every output the reference's shape and
    free of NaN first, then the tolerance rule, then the exact values of empty sequences (lse
    -inf beyond each sequence's length; a sequence without keys: o = 0, dq = 0, lse = -inf; one
    without queries: dk = dv = 0). Returns the outputs."""
    outs = reference_outputs(inp, o, lse, g, kw, dbias=dbias, dlse=dlse)
    for name, (out, ref, _) in outs.items():
        assert out.shape == ref.shape, (name, out.shape, ref.shape)
        assert not np.isnan(out).any(), f"{name}: NaN (unwritten or poisoned)"
    assert_close(inp, outs, inp.reference_kw(kw)["bias"].dtype if dbias else None)
    lq, lk = np.diff(inp.cq), np.diff(inp.ck)
    o_f, lse_f, dq_f, dk_f, dv_f = (outs[n][0] for n in ("o", "lse", "dq", "dk", "dv"))
    for b in range(inp.batch):
        rows = slice(inp.cq[b], inp.cq[b + 1])
        keys = slice(inp.ck[b], inp.ck[b + 1])
        assert np.all(np.isneginf(lse_f[b, :, lq[b]:])), f"lse beyond sequence {b} must be -inf"
        if lk[b] == 0:
            assert np.all(o_f[rows] == 0) and np.all(dq_f[rows] == 0), f"sequence {b} has no keys"
            assert np.all(np.isneginf(lse_f[b]))
        if lq[b] == 0:
            assert np.all(dk_f[keys] == 0) and np.all(dv_f[keys] == 0), f"sequence {b} has no queries"
    return outs


def _rocm_rows() -> list[tuple]:
    mod = sys.modules.get("test_rocm_compile")
    return [(r.kernel, r.target, r.vgprs, r.agprs, r.scratch, r.lds, r.occupancy) for r in getattr(mod, "REPORTS", None) or []]


#: rows the pytest-xdist workers sent (pytest_testnodedown), for the controller's summary
_WORKER_ROCM_ROWS: list[tuple] = []


def pytest_sessionfinish(session):
    """Under pytest-xdist, a worker hands its ROCm rows to the controller."""
    out = getattr(session.config, "workeroutput", None)
    if out is not None:
        out["rocm_rows"] = _rocm_rows()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    _WORKER_ROCM_ROWS.extend(tuple(r) for r in getattr(node, "workeroutput", {}).get("rocm_rows", []))


def pytest_terminal_summary(terminalreporter):
    """The AMD (gfx9) resource table of tests/test_rocm_compile.py, when it ran (in this process
    or in pytest-xdist workers). LDS includes the kernels' dynamic shared memory; waves/SIMD is
    clang's figure lowered to what that LDS allows."""
    rows = sorted(_rocm_rows() + _WORKER_ROCM_ROWS, key=lambda r: (r[0], r[1]))
    if not rows:
        return
    terminalreporter.section("ROCm resources (clang, per kernel and target)")
    w = max(64, *(len(r[0]) for r in rows))
    terminalreporter.write_line(f"{'kernel':{w}} {'target':7} {'VGPR':>5} {'AGPR':>5} {'scratch':>7} {'LDS':>7} {'waves/SIMD':>10}")
    for kernel, target, vgprs, agprs, scratch, lds, occ in rows:
        terminalreporter.write_line(f"{kernel:{w}} {target:7} {vgprs:5} {agprs:5} {scratch:7} {lds:7} {occ:10}")
