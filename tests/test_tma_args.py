"""CPU checks of the TMA tensor-map arguments (cupy_fmha/backends/tma.py): a valid view of a bshd
tensor gives the driver's arguments, and every rule of cuTensorMapEncodeTiled that a view or box
can break is refused with a message naming it, before any driver call."""

from __future__ import annotations

import pytest

from cupy_fmha.backends import tma


def _bshd(b=2, s=100, h=3, d=128, item=2):
    shape = (b, s, h, d)
    strides = (s * h * d * item, h * d * item, d * item, item)
    return shape, strides


def test_bshd_rows_of_one_head():
    shape, strides = _bshd()
    a = tma.tile_map_args("bfloat16", 0x7F0000000000, shape, strides, (1, 64, 1, 64), 128)
    assert a.shape == shape and a.strides == strides and a.box == (1, 64, 1, 64)
    assert a.box_bytes == 64 * 64 * 2 and a.itemsize == 2 and a.swizzle == 128


@pytest.mark.parametrize("change, message", [
    (dict(data_type="int8"), "data_type"),
    (dict(swizzle=16), "swizzle"),
    (dict(address=0x7F0000000008), "address: must be 16-byte aligned"),
    (dict(strides=(100 * 3 * 128 * 2, 3 * 128 * 2, 128 * 2, 4)), "innermost dimension must be contiguous"),
    (dict(strides=(100 * 3 * 128 * 2, 3 * 128 * 2, 130, 2)), "strides[2]"),
    (dict(strides=(2**40, 3 * 128 * 2, 128 * 2, 2)), "strides[0]"),
    (dict(shape=(2, 0, 3, 128)), "shape[1]"),
    (dict(box=(1, 257, 1, 64)), "box[1]"),
    (dict(box=(1, 64, 1, 4)), "multiple of 16 bytes"),
    (dict(box=(1, 64, 1, 128)), "wider than the 128-byte swizzle"),
    (dict(box=(1, 64, 64)), "strides, box"),
    (dict(shape=(1,) * 6, strides=(16,) * 5 + (2,), box=(1,) * 6), "1 to 5 dimensions"),
])
def test_rules_are_named(change, message):
    shape, strides = _bshd()
    kw = dict(data_type="bfloat16", address=0x7F0000000000, shape=shape, strides=strides, box=(1, 64, 1, 64),
              swizzle=128)
    kw.update(change)
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        tma.tile_map_args(**kw)


def test_column_blocked_view_of_bshd():
    shape, strides = _bshd(b=2, s=100, h=3, d=128)
    v_shape, v_strides = tma.column_blocked_view(shape, strides, 2, row_axis=1)
    assert v_shape == (2, 16, 100, 3, 8)
    assert v_strides == (strides[0], 16, strides[1], strides[2], 2)
    # element (b, cb, s, h, e) of the view is element (b, s, h, 8 cb + e) of the tensor
    off = lambda st, idx: sum(i * x for i, x in zip(idx, st))  # noqa: E731
    assert off(v_strides, (1, 5, 7, 2, 3)) == off(strides, (1, 7, 2, 43))
    a = tma.tile_map_args("bfloat16", 0x7F0000000000, v_shape, v_strides, (1, 16, 64, 1, 8), 0)
    assert a.box_bytes == 64 * 128 * 2
    with pytest.raises(ValueError, match="multiple of 8"):
        tma.column_blocked_view((2, 100, 3, 36), (1, 1, 1, 2), 2, row_axis=1)
    with pytest.raises(ValueError, match="row_axis"):
        tma.column_blocked_view(shape, strides, 2, row_axis=3)


def test_unswizzled_box_may_be_wider():
    shape, strides = _bshd()
    a = tma.tile_map_args("float16", 0x7F0000000000, shape, strides, (1, 64, 1, 128), 0)
    assert a.box_bytes == 64 * 128 * 2


_EVERY_WRAPPER = r"""
#include "arch/arch.cuh"
using namespace fmha;
extern "C" __global__ void __launch_bounds__(384, 1)
tma_wrappers(const __grid_constant__ TmaMap map, unsigned long long* out) {
    extern __shared__ __align__(1024) unsigned char smem[];
    __shared__ __align__(8) unsigned long long bar[2];
    const int wg = threadIdx.x / 128;
    if (threadIdx.x == 0) { mbarrier_init(smem_u32(&bar[0]), 1); mbarrier_init(smem_u32(&bar[1]), 256); mbarrier_init_fence(); }
    __syncthreads();
    if (wg == 0) {
        setmaxnreg_dec<24>();
        if (threadIdx.x == 0) {
            tma_prefetch_map(map);
            mbarrier_arrive_expect_tx(smem_u32(&bar[0]), 2048);
            tma_load_2d(smem_u32(smem), map, smem_u32(&bar[0]), 0, 0);
            tma_load_5d(smem_u32(smem) + 4096, map, smem_u32(&bar[0]), 0, 0, 0, 0, 0);
        }
        named_barrier_arrive(1, 384);
    } else {
        setmaxnreg_inc<240>();
        mbarrier_wait(smem_u32(&bar[0]), 0);
        named_barrier_sync(1, 384);
        mbarrier_arrive(smem_u32(&bar[1]));
        out[threadIdx.x] = wgmma_desc_sw128_kmajor(smem_u32(smem) + 32 * wg);
    }
}
"""


def test_every_tma_wrapper_compiles_for_sm90a():
    """NVRTC and ptxas accept every wrapper of tma.cuh in one kernel (setmaxnreg needs the
    single-block launch bound), with no spills; the GPU test runs the load path."""
    from cupy_fmha import compile as C

    if C.nvrtc_version() is None:
        pytest.skip("NVRTC not available (install the cuda13 extra)")
    from cupy.cuda import nvrtc

    prog = nvrtc.createProgram(C.expand_includes(_EVERY_WRAPPER), "tma_wrappers.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, ["-std=c++17", "-arch=sm_90a", "-Xptxas=-v", *C._nvrtc_include_dirs()])
        except nvrtc.NVRTCError as exc:
            raise AssertionError(nvrtc.getProgramLog(prog)) from exc
        log = nvrtc.getProgramLog(prog)
    finally:
        nvrtc.destroyProgram(prog)
    assert "0 bytes spill stores" in log and "error" not in log.lower(), log


def test_ws_maps_are_encoded_once_per_buffer(monkeypatch):
    """The backward's tensor maps are cached by address, shape and strides: a training loop that
    hands the same buffers back pays the driver call once."""
    import numpy as np

    from cupy_fmha import api
    from cupy_fmha.backends import tma

    calls = []

    def fake(args):
        calls.append(args)
        return np.zeros(1, np.dtype((np.void, 128)))

    monkeypatch.setattr(tma, "encode_tile_map", fake)
    api._tile_map.cache_clear()
    key = ("bfloat16", 1 << 20, 2, 16, 1000, 128, 1000 * 16 * 128, 128, 16 * 128, 64, 128)
    a = api._tile_map(*key)
    assert api._tile_map(*key) is a and len(calls) == 1
    api._tile_map(*key[:1], (1 << 20) + 4096, *key[2:])  # another buffer: encoded again
    assert len(calls) == 2 and calls[1].address == (1 << 20) + 4096
    api._tile_map.cache_clear()


def test_maps_are_wrapped_once_as_by_value_arguments():
    """A cached map goes to CuPy already wrapped as its by-value argument (CuPy's CNumpyArray,
    built once instead of on every launch); a stand-in module without that class gets the array."""
    import types

    import numpy as np

    from cupy_fmha import api

    a = np.zeros(1, np.dtype((np.void, 128)))
    assert api._by_value(types.SimpleNamespace(__name__="fake"), a) is a
    try:
        import cupy
        from cupy.cuda.function import CNumpyArray
    except Exception:
        return  # the stand-in case above is all this machine can check
    api._BY_VALUE.clear()
    w = api._by_value(cupy, a)
    assert isinstance(w, CNumpyArray) and api._by_value(cupy, a) is w
    b = np.zeros(1, np.dtype((np.void, 128)))
    assert api._by_value(cupy, b) is not w
    api._BY_VALUE.clear()
