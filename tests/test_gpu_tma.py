"""The TMA layer on the GPU (kernels/arch/sm90/tma.cuh, cupy_fmha/backends/tma.py): a probe kernel
loads one box of a bshd tensor with cp.async.bulk.tensor (an mbarrier with a transaction count)
and copies its shared-memory bytes out as they lie; they must equal a NumPy model of the box
(rows past the tensor zero-filled) placed by the 128-byte swizzle of tma.cuh's header (chunk j of
row r at chunk j ^ (r % 8)), or unswizzled. Fresh random bits, poisoned output, a box that crosses
the end of the sequence. Needs sm_90."""

from __future__ import annotations

import numpy as np
import pytest

try:
    import cupy as cp
except Exception:  # pragma: no cover
    cp = None

from cupy_fmha import compile as C
from cupy_fmha.backends import tma
import conftest
from conftest import seed_for

pytestmark = pytest.mark.gpu

_PROBE = r"""
#include "arch/arch.cuh"
using namespace fmha;
// One thread block: thread 0 initializes the barrier and issues the load; everyone waits; the
// box's bytes are copied out as they lie in shared memory.
extern "C" __global__ void __launch_bounds__(128, 1)
tma_probe(const __grid_constant__ TmaMap map, unsigned char* out, int nbytes, int rank, int c0, int c1, int c2, int c3,
          int c4) {
    extern __shared__ __align__(1024) unsigned char smem[];
    __shared__ __align__(8) unsigned long long bar;
    const unsigned sbar = smem_u32(&bar), sdst = smem_u32(smem);
    if (threadIdx.x == 0) {
        mbarrier_init(sbar, 1);
        mbarrier_init_fence();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        tma_prefetch_map(map);
        mbarrier_arrive_expect_tx(sbar, nbytes);
        if (rank == 5) tma_load_5d(sdst, map, sbar, c0, c1, c2, c3, c4);
        else tma_load_4d(sdst, map, sbar, c0, c1, c2, c3);
    }
    mbarrier_wait(sbar, 0);
    for (int i = threadIdx.x; i < nbytes; i += blockDim.x) out[i] = smem[i];
}
"""


def _swizzle128(box_bytes: np.ndarray) -> np.ndarray:
    """Where each byte of a box (rows of 128 bytes, in order) lands under the 128-byte swizzle."""
    n = box_bytes.size
    a = np.arange(n)
    phys = a ^ (((a >> 7) & 7) << 4)
    out = np.empty_like(box_bytes)
    out[phys] = box_bytes
    return out


def _launch(probe, tmap, out, nbytes, coords):
    c = [np.int32(x) for x in coords] + [np.int32(0)] * (5 - len(coords))
    probe((1, 1, 1), (128, 1, 1), (tmap, out, np.int32(nbytes), np.int32(len(coords)), *c), shared_mem=nbytes)


def _bits(key, shape, dtype):
    rng = np.random.default_rng(seed_for(*key))
    bits = rng.integers(0, 2**16, size=shape, dtype=np.uint16)
    x = cp.asarray(bits)
    if dtype == "bfloat16":
        import ml_dtypes
        return bits, x.view(ml_dtypes.bfloat16)
    return bits, x.view(cp.float16)


@pytest.fixture(scope="module")
def probe():
    if not conftest.is_sm90():
        pytest.skip("TMA needs sm_90")
    mod = cp.RawModule(code=C.expand_includes(_PROBE), options=("-std=c++17", "-arch=sm_90a"))
    return mod.get_function("tma_probe")


@pytest.mark.parametrize("swizzle, width, c0", [(128, 64, 0), (128, 64, 64), (0, 128, 0), (0, 64, 64)])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_tma_box_lands_as_modelled(probe, swizzle, width, c0, dtype):
    b, s, h, d, rows = 2, 100, 3, 128, 64
    bits, x = _bits(("tma", swizzle, width, c0, dtype), (b, s, h, d), dtype)
    row0, hh, bb = 72, 1, 1  # rows 72..135: the last 36 lie past the sequence (zero-filled)
    args = tma.tile_map_for(x, (1, rows, 1, width), swizzle)
    tmap = tma.encode_tile_map(args)
    out = cp.full(args.box_bytes, 0xAB, dtype=cp.uint8)  # poisoned
    _launch(probe, tmap, out, args.box_bytes, (c0, hh, row0, bb))
    got = cp.asnumpy(out)
    want = np.zeros((rows, width), np.uint16)
    take = bits[bb, row0:row0 + rows, hh, c0:c0 + width]
    want[:take.shape[0]] = take
    want = want.view(np.uint8).reshape(-1)
    if swizzle == 128:
        want = _swizzle128(want)
    assert np.array_equal(got, want), np.flatnonzero(got != want)[:16]


@pytest.mark.parametrize("d, rows", [(128, 64), (64, 128), (128, 128)])
def test_column_blocked_box_is_the_wgmma_blocked_layout(probe, d, rows):
    """One 5-D box of column_blocked_view lands as [d / 8][rows][8]: core matrix (rb, cb) of the
    tile (8 rows x 16 bytes, contiguous) at element offset (cb * rows / 8 + rb) * 64."""
    b, s, h = 2, 150, 3
    bits, x = _bits(("tma-blocked", d, rows), (b, s, h, d), "bfloat16")
    shape, strides = tma.column_blocked_view(x.shape, x.strides, 2, row_axis=1)
    assert shape == (b, d // 8, s, h, 8)
    args = tma.tile_map_args("bfloat16", x.data.ptr, shape, strides, (1, d // 8, rows, 1, 8), 0)
    tmap = tma.encode_tile_map(args)
    out = cp.full(args.box_bytes, 0xCD, dtype=cp.uint8)
    row0, hh, bb = 90, 2, 1  # rows past 150 zero-filled
    _launch(probe, tmap, out, args.box_bytes, (0, hh, row0, 0, bb))
    got = cp.asnumpy(out).view(np.uint16).reshape(d // 8, rows, 8)
    tile = np.zeros((rows, d), np.uint16)
    take = bits[bb, row0:row0 + rows, hh, :]
    tile[:take.shape[0]] = take
    want = tile.reshape(rows, d // 8, 8).transpose(1, 0, 2)
    assert np.array_equal(got, want), np.argwhere(got != want)[:8]
