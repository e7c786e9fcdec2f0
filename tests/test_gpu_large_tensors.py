"""Tensors of more than 2^31 elements (issue 3, item 9): 64-bit offsets in every kernel.

One (batch 1, 32 heads, seqlen 1,100,000, hdim 64) problem holds 2.25e9 elements per tensor
(4.5 GB in fp16), so every offset of the last rows (bshd: row * nhead * hdim) or the last heads
(bhsd: head * seqlen * hdim; the fp32 dQ workspace and, in both layouts, its
(b * nhead + h) * seqlen * hdim rows) exceeds 2^31 and would wrap if any product were formed in
32 bits. A small sliding window keeps the work to seconds.

Checking: the window makes a row's output depend only on nearby keys, so the float64 reference
runs on a slice (query rows [r0, r1), the keys they can see) with the same mask expressed as a
generic window relative to the slice (:func:`_slice_window`): o, lse and dq of those rows, and dk,
dv of the keys whose every query row lies in the slice, are exact. Slices: the last rows and the
first rows of the sequence, in the first, a middle and the last head (the largest bhsd offsets).
The whole outputs are checked for NaN/inf on the device (they are poisoned before the run).

Marked ``gpu`` and ``slow``; the cases run one at a time on a host (a file lock: under xdist two
would not fit together), and one skips with the reason when the device has too little free memory
after a minute's wait.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pytest

try:  # the conftest hook skips these tests without a device; this keeps collection clean
    import cupy as cp
except Exception:  # pragma: no cover - no CuPy at all
    cp = None

from conftest import F16, nan_like
from cupy_fmha import reference as R
from cupy_fmha.compile import _host_lock
from cupy_fmha.verify import compare

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

SEQLEN, NHEAD = 1_100_000, 32
ROWS = 200  # query rows checked at each end of the sequence
# heads checked against the reference: the first, one past the middle (bhsd byte offsets beyond
# 2^31) and the last (bhsd element offsets beyond 2^31, the largest dQ-workspace rows)
HEADS = [0, NHEAD // 2, NHEAD - 1]

# id: (layout, hdim, window_size (left, right)); FlashAttention's window (bottom-right aligned,
# the same as top-left here since seqlen_q == seqlen_k). hdim 64 runs the sm_90a (wgmma) kernels
# on Hopper; hdim 72 (padded 80) the mma.sync kernels there.
CASES = {
    "bshd-d64-window64,0": ("bshd", 64, (64, 0)),
    "bhsd-d64-window32,32": ("bhsd", 64, (32, 32)),
    "bshd-d72-window32,32": ("bshd", 72, (32, 32)),
}


def bytes_needed(b: int, h: int, s: int, d: int) -> int:
    """Device bytes of one forward + backward at these sizes, fp16, nhead_q == nhead_k, d == dv.

    q, k, v, o, do, dq, dk, dv (8 x 2 bytes per element), the fp32 dQ accumulator (4), lse and D
    (4 bytes per row each), plus one fp32 tensor of temporaries while the inputs are drawn (4)."""
    n = b * h * s * d
    return 8 * 2 * n + 4 * n + 2 * 4 * b * h * s + 4 * n


def _slice_window(left: int, right: int, r0: int, k0: int) -> str:
    """The mask of query rows [r0, ...) against keys [k0, ...) of a sliding window (left, right)
    on a square problem, as a generic CK window ``g:y,x`` in the slice's own indices.

    Full problem: row i sees key j iff i - left <= j <= i + right. With i = i' + r0, j = j' + k0
    and c = r0 - k0: i' + c - left <= j' <= i' + c + right, i.e. i' - y + 1 <= j' < i' + x with
    y = 1 + left - c, x = 1 + right + c."""
    c = r0 - k0
    return f"g:{1 + left - c},{1 + right + c}"


def _all_finite(x, chunk=1 << 30) -> bool:
    """No NaN/inf in a contiguous device array, reduced in chunks of fewer than 2^31 elements
    (so no reduction, CUB's included, has to index past int32)."""
    flat = x.reshape(-1)
    return all(bool(cp.isfinite(flat[i:i + chunk]).all()) for i in range(0, flat.size, chunk))


def _draw(rng, shape, scale=1.0):
    """fp16 standard normals (times ``scale``), drawn on the device in fp32."""
    x = rng.standard_normal(shape, dtype=cp.float32)
    if scale != 1.0:
        x *= scale
    y = x.astype(cp.float16)
    del x
    return y


def _rows(a, layout, lo, hi):
    """Host fp16 copy of sequence positions [lo, hi) of the checked HEADS of a rank-4 device array
    (a basic slice on the device, small; the heads are picked on the host)."""
    x = cp.asnumpy(a[:, lo:hi] if layout == "bshd" else a[:, :, lo:hi])
    return x[:, :, HEADS] if layout == "bshd" else x[:, HEADS]


def _one_case_at_a_time():
    """An exclusive file lock shared by every process on this host (``compile._host_lock``): under
    pytest-xdist two workers could otherwise start two ~50 GB cases at once, and on an 80 GB GPU one
    would skip (it did on an H100, 2026-12-06: 9.5 GiB free of 79.2 GiB)."""
    return _host_lock(Path(tempfile.gettempdir()) / "cupy_fmha_large_tensor_tests.lock")


def _wait_for_free(want: int, patience_s: float = 60.0) -> tuple[int, int]:
    """(free, total) device bytes once ``want`` are free, or after ``patience_s`` seconds: other
    workers' tests hold memory for a moment (their pools are emptied after each test)."""
    deadline = time.monotonic() + patience_s
    while True:
        free, total = cp.cuda.runtime.memGetInfo()
        if free >= want or time.monotonic() > deadline:
            return free, total
        time.sleep(2.0)


@pytest.mark.parametrize("case", list(CASES))
def test_more_than_2_31_elements(case):
    layout, d, window = CASES[case]
    b, h, s = 1, NHEAD, SEQLEN
    assert b * h * s * d > 2**31
    need = bytes_needed(b, h, s, d)
    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()
    with _one_case_at_a_time():
        free, total = _wait_for_free(need + (2 << 30))
        if free < need + (2 << 30):
            pytest.skip(f"needs about {need / 2**30:.1f} GiB of free device memory (+2 GiB margin), "
                        f"the device has {free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB")
        # failures come back as text, so that no traceback frame keeps ~50 GB of device arrays alive
        # into the next case
        problems = _run_and_check(layout, b, h, s, d, window)
        pool.free_all_blocks()
    assert not problems, "\n".join(problems)


def _run_and_check(layout, b, h, s, d, window) -> list[str]:
    import cupy_fmha

    left, right = window
    shape = (b, s, h, d) if layout == "bshd" else (b, h, s, d)
    rng = cp.random.RandomState(20240611 + d)  # cuRAND host API: size_t counts
    q = _draw(rng, shape, 1.5)  # scores ~ N(0, 1.5^2), as in conftest.Inputs
    k, v, do = _draw(rng, shape), _draw(rng, shape), _draw(rng, shape)
    kw = dict(window_size=(left, right), layout=layout)

    o, lse = nan_like(shape, cp.float16), nan_like((b, h, s), cp.float32)
    o2, lse2 = cupy_fmha.attention_forward(q, k, v, **kw, out=(o, lse))
    assert o2 is o and lse2 is lse
    grads = tuple(nan_like(shape, cp.float16) for _ in range(3))
    g = cupy_fmha.attention_backward(do, q, k, v, o, lse, **kw, out=grads)
    cp.cuda.get_current_stream().synchronize()

    # every element written, none overflowed (the window leaves no row without keys)
    problems = [f"{name}: NaN or inf somewhere in the output"
                for name, x in (("o", o), ("lse", lse), ("dq", g.dq), ("dk", g.dk), ("dv", g.dv))
                if not _all_finite(x)]

    # the reference on slices at both ends of the sequence, HEADS only
    for r0, r1 in ((s - ROWS, s), (0, ROWS)):
        k0, k1 = max(r0 - left, 0), min(r1 + right, s)
        hq, hk, hv, hdo = (_rows(x, layout, lo, hi) for x, (lo, hi) in
                           ((q, (r0, r1)), (k, (k0, k1)), (v, (k0, k1)), (do, (r0, r1))))
        rkw = dict(mask=_slice_window(left, right, r0, k0), layout=layout)
        ref_o, ref_lse = R.attention_forward(hq, hk, hv, **rkw)
        low_o, low_lse = R.attention_forward(hq, hk, hv, precision="low", **rkw)
        ref_g = R.attention_backward(hdo, hq, hk, hv, **rkw)
        low_g = R.attention_backward(hdo, hq, hk, hv, precision="low", **rkw)
        # keys [j0, j1) get gradient only from rows inside [r0, r1): j - right >= r0 (or r0 == 0)
        # and j + left < r1 (or r1 == s)
        j0 = k0 if r0 == 0 else r0 + right
        j1 = k1 if r1 == s else r1 - left
        assert j1 - j0 >= ROWS // 2

        def keys(x, lo=j0 - k0, hi=j1 - k0):
            return x[:, lo:hi] if layout == "bshd" else x[:, :, lo:hi]

        outs = {
            "o": (_rows(o, layout, r0, r1), ref_o, low_o),
            "lse": (cp.asnumpy(lse[:, :, r0:r1])[:, HEADS], ref_lse, low_lse),
            "dq": (_rows(g.dq, layout, r0, r1), ref_g[0], low_g[0]),
            "dk": (_rows(g.dk, layout, j0, j1), keys(ref_g[1]), keys(low_g[1])),
            "dv": (_rows(g.dv, layout, j0, j1), keys(ref_g[2]), keys(low_g[2])),
        }
        for n, (out, ref, low) in outs.items():
            c = compare(n, out, ref, low, dtype=F16, hdim_q=d, hdim_v=d)
            if not c.ok:
                problems.append(f"rows [{r0}, {r1}) heads {HEADS}: {c}")
    return problems
