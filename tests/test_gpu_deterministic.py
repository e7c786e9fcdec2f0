"""``attention_backward(deterministic=True)`` on the GPU: dq, dk, dv bit-identical over repeated
runs, and correct against the float64 reference (:func:`cupy_fmha.verify.compare`).

Every test is marked ``gpu`` and skipped without CuPy or a device (see conftest.py). Cases cover
the Hopper warp-specialized kernels (hdim 64, 128, and 256 on the wide build, on compute capability
9.0: ordered adds into one workspace, admitted by a semaphore per query tile) and the mma.sync
kernel (slabs; hdim 32, 96, and 256 off Hopper, with its two-CTA column split), causal / no mask / sliding windows, GQA
groups of 1 and 4, sequence lengths 1, 253 and 1000 (never tile multiples), sq != sk, fp16 and
bf16.

Poisoning: outputs go into NaN-filled ``out=`` buffers, and before every call the memory pool is
emptied and one NaN-filled block larger than the dQ workspace is freed back into it, so the
(never zero-filled) workspace is carved from NaN memory: a slab element that convert_dq reads
without the main kernel having written it turns dq into NaN and fails the reference check.
"""

from __future__ import annotations

import numpy as np
import pytest

try:  # the conftest hook skips these tests without a device; this keeps collection clean
    import cupy as cp
except Exception:  # pragma: no cover - no CuPy at all
    cp = None

import cupy_fmha
from conftest import BF16, F16, Inputs, assert_close, device_key, is_sm90, nan_block_in_pool, nan_like, seed_for
from cupy_fmha import launch as L
from cupy_fmha import reference as R
from cupy_fmha.spec import bwd_specs

pytestmark = pytest.mark.gpu

RUNS = 10


class Case(Inputs):
    """:class:`conftest.Inputs` (seeded by the case name) and the forward's o / lse."""

    def __init__(self, name, dtype, layout, b, sq, sk, hq, hk, d, mkw):
        super().__init__(dtype, layout, b, sq, sk, hq, hk, d, d, seed_for("determ", name))
        self.mkw = dict(mkw)
        self.b, self.sq, self.sk, self.hq, self.hk = b, sq, sk, hq, hk
        self.kw = dict(self.mkw, layout=layout, dtype=self.dtype_arg)
        self.o, self.lse = cupy_fmha.attention_forward(self.dev["q"], self.dev["k"], self.dev["v"], **self.kw)

    def workspace_bytes(self) -> int:
        cc = device_key()
        spec = bwd_specs("bf16" if self.dtype == BF16 else "fp16", self.d, self.d, cc).dq_dk_dv
        return L.dq_workspace(spec, self.b, self.hq, self.sq, self.sk, self.d, True).nbytes

    def backward(self, deterministic=True):
        """One backward into NaN-poisoned outputs, over a NaN-poisoned memory pool."""
        q = self.dev["q"]
        outs = [nan_like(x.shape, x.dtype) for x in (q, self.dev["k"], self.dev["v"])]
        pool = cp.get_default_memory_pool()
        cp.cuda.get_current_stream().synchronize()
        pool.free_all_blocks()
        # back to the pool, NaN-filled: the workspace is carved from it
        nan_block_in_pool((self.workspace_bytes() // 4 + (1 << 20),))()
        g = cupy_fmha.attention_backward(self.dev["do"], q, self.dev["k"], self.dev["v"], self.o, self.lse,
                                         **self.kw, out=tuple(outs), deterministic=deterministic)
        assert all(x is y for x, y in zip(g, outs))
        cp.cuda.get_current_stream().synchronize()
        return g


# id: (dtype, layout, b, sq, sk, hq, hk, d, mask kwargs)
CASES = {
    # Hopper wgmma kernel on cc 9.0 (mma.sync elsewhere): hdim 64
    "f16-d64-none-253": (F16, "bshd", 2, 253, 253, 4, 4, 64, {}),
    "f16-d64-causal-1000-gqa4": (F16, "bshd", 1, 1000, 1000, 8, 2, 64, {"causal": True}),
    "bf16-d64-window64,32-1000x253": (BF16, "bhsd", 1, 1000, 253, 2, 2, 64, {"window_size": (64, 32)}),
    "f16-d64-sq1-sk1000-gqa4": (F16, "bshd", 2, 1, 1000, 4, 1, 64, {}),
    "f16-d64-t-1x1": (F16, "bshd", 1, 1, 1, 2, 2, 64, {"mask": "t"}),
    # hdim 128
    "bf16-d128-none-1000": (BF16, "bshd", 1, 1000, 1000, 4, 4, 128, {}),
    "bf16-d128-causal-253x1000-gqa4": (BF16, "bshd", 1, 253, 1000, 8, 2, 128, {"causal": True}),
    "f16-d128-window100,0-1000": (F16, "bshd", 1, 1000, 1000, 2, 2, 128, {"window_size": (100, 0)}),
    "bf16-d128-none-1000x1": (BF16, "bshd", 2, 1000, 1, 2, 2, 128, {}),
    "f16-d128-b-1000x253-gqa4-empty-rows": (F16, "bhsd", 1, 1000, 253, 4, 1, 128, {"mask": "b"}),
    # mma.sync kernel: hdim 32
    "f16-d32-none-1000x253": (F16, "bshd", 2, 1000, 253, 4, 4, 32, {}),
    "bf16-d32-causal-253-gqa4": (BF16, "bshd", 1, 253, 253, 8, 2, 32, {"causal": True}),
    "f16-d32-window64,64-1000": (F16, "bhsd", 1, 1000, 1000, 2, 2, 32, {"window_size": (64, 64)}),
    # hdim 96
    "bf16-d96-none-253x1000": (BF16, "bshd", 1, 253, 1000, 4, 4, 96, {}),
    "f16-d96-causal-1000-gqa4": (F16, "bshd", 1, 1000, 1000, 4, 1, 96, {"causal": True}),
    "bf16-d96-causal-1x253": (BF16, "bshd", 3, 1, 253, 2, 2, 96, {"causal": True}),
    # hdim 256 (the wide ws build on cc 9.0, ordered adds; elsewhere mma.sync with its NSPLIT = 2 column split)
    "f16-d256-none-253": (F16, "bshd", 1, 253, 253, 2, 2, 256, {}),
    "bf16-d256-causal-1000x253-gqa4": (BF16, "bshd", 1, 1000, 253, 4, 1, 256, {"causal": True}),
    "f16-d256-window128,16-1000": (F16, "bhsd", 1, 1000, 1000, 2, 2, 256, {"window_size": (128, 16)}),
    "bf16-d256-none-253x1": (BF16, "bshd", 2, 253, 1, 2, 2, 256, {}),
}


def _bits(x):
    return cp.asnumpy(x.view(cp.uint16))


@pytest.mark.parametrize("case", list(CASES))
def test_deterministic_is_bit_identical_and_correct(case):
    dtype, layout, b, sq, sk, hq, hk, d, mkw = CASES[case]
    c = Case(case, dtype, layout, b, sq, sk, hq, hk, d, mkw)
    cc = device_key()
    spec = bwd_specs("bf16" if dtype == BF16 else "fp16", d, d, cc).dq_dk_dv
    if cc == 90 and d in (64, 128, 256):
        assert spec.target == "sm90a" and spec.macro("DQ_ORDERED") == 1  # the ws kernels' ordered adds here
    first = c.backward()
    bits = [_bits(x) for x in first]
    for run in range(1, RUNS):
        g = c.backward()
        for name, ref_bits, x in zip(("dq", "dk", "dv"), bits, g):
            same = ref_bits == _bits(x)
            assert same.all(), f"{name} differs on run {run} at {int((~same).sum())} elements"

    h = c.host
    kw = dict(mkw, layout=layout)
    ref = R.attention_backward(h["do"], h["q"], h["k"], h["v"], **kw)
    low = R.attention_backward(h["do"], h["q"], h["k"], h["v"], precision="low", **kw)
    assert_close(c, {n: (c.to_float(x), r, lo) for n, x, r, lo in zip(("dq", "dk", "dv"), first, ref, low)})


@pytest.mark.parametrize("case", ["f16-d64-causal-1000-gqa4", "bf16-d128-causal-253x1000-gqa4",
                                  "bf16-d256-causal-1000x253-gqa4"])
def test_deterministic_twenty_runs(case):
    """Issue 10's count: 20 deterministic backwards at hdim 64, 128 and 256, every one bit-identical."""
    dtype, layout, b, sq, sk, hq, hk, d, mkw = CASES[case]
    c = Case(case, dtype, layout, b, sq, sk, hq, hk, d, mkw)
    bits = [_bits(x) for x in c.backward()]
    for run in range(1, 20):
        for name, ref_bits, x in zip(("dq", "dk", "dv"), bits, c.backward()):
            same = ref_bits == _bits(x)
            assert same.all(), f"{name} differs on run {run} at {int((~same).sum())} elements"


@pytest.mark.parametrize("case", ["f16-d64-causal-1000-gqa4", "bf16-d96-none-253x1000",
                                  "f16-d256-window128,16-1000"])
def test_deterministic_agrees_with_atomic(case):
    """Same dK/dV bits as the default mode (both are plain stores); dQ equal up to the order of
    the fp32 additions (a couple of output ulps)."""
    dtype, layout, b, sq, sk, hq, hk, d, mkw = CASES[case]
    c = Case(case, dtype, layout, b, sq, sk, hq, hk, d, mkw)
    det, atomic = c.backward(True), c.backward(False)
    assert (_bits(det.dk) == _bits(atomic.dk)).all() and (_bits(det.dv) == _bits(atomic.dv)).all()
    x, y = c.to_float(det.dq), c.to_float(atomic.dq)
    ulp = 2.0**-10 if dtype == F16 else 2.0**-7
    assert np.max(np.abs(x - y)) <= 4 * ulp * np.max(np.abs(y))


def test_deterministic_rejects_non_bool():
    c = Case("bad", F16, "bshd", 1, 16, 16, 2, 2, 64, {})
    for bad in (1, "true", None):
        with pytest.raises(TypeError, match="deterministic"):
            cupy_fmha.attention_backward(c.dev["do"], c.dev["q"], c.dev["k"], c.dev["v"], c.o, c.lse,
                                         deterministic=bad)


def test_deterministic_at_seqlen_65536_without_slabs():
    """Issue 10's long case: batch 1, 16 heads, seqlen 65536, hdim 128 (the slabs would need 69 GB
    at 32768 and were beyond the GPU here). On the Hopper ws kernel the ordered adds need the
    default workspace only: deterministic runs, twice bit-identically, and its dQ agrees with
    the default mode's up to the order of the fp32 additions."""
    if not is_sm90():
        pytest.skip("the ordered adds run on the sm_90 ws kernel")
    spec = bwd_specs("bf16", 128, 128, 90, deterministic=True).dq_dk_dv
    assert L.dq_workspace(spec, 1, 16, 65536, 65536, 128, True).nsplit == 0
    rng = cp.random.default_rng(seed_for("det-65536"))
    q, k, v, do = (rng.standard_normal((1, 65536, 16, 128), dtype=cp.float32).astype(BF16) for _ in range(4))
    o, lse = cupy_fmha.attention_forward(q, k, v, causal=True)
    det = [cupy_fmha.attention_backward(do, q, k, v, o, lse, causal=True, deterministic=True) for _ in range(2)]
    atomic = cupy_fmha.attention_backward(do, q, k, v, o, lse, causal=True)
    for a, b in zip(det[0], det[1]):
        assert bool((a.view(cp.uint16) == b.view(cp.uint16)).all())
    assert (det[0].dk.view(cp.uint16) == atomic.dk.view(cp.uint16)).all()
    x, y = det[0].dq.astype(cp.float32), atomic.dq.astype(cp.float32)
    assert bool(cp.isfinite(x).all()) and float(cp.abs(x - y).max()) <= 4 * 2.0**-7 * float(cp.abs(y).max())
