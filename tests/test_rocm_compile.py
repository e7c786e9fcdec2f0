"""The ROCm (gfx9) architecture layer compiles for gfx90a, gfx942 and gfx950 with Debian's
clang-22 (device code only: no GPU, no ROCm install), without scratch, within each target's LDS
and register limits, and so do the ported kernels (rocm.PORTED_SOURCES: dot_do_o, convert_dq, the
dropout mask, and the mma.sync-family forward and backward main kernel (dq_dk_dv) on MFMA, every
instance of the gfx9 tile tables), from the same sources as the CUDA build; the resource table
(LDS including each kernel's dynamic layout) is printed at the end of the run. Skips without
clang. Nothing here has run on an AMD GPU."""

from __future__ import annotations

import dataclasses
import re

import pytest

from cupy_fmha.backends import rocm
from cupy_fmha.compile import kernel_dir, load_source

REPORTS: list = []  # printed by conftest's terminal summary

_PROBE = r"""
#include "arch/gfx9/instr.cuh"
using namespace fmha::gfx9;
// Every MFMA wrapper of the target, each on per-lane registers (layout.cuh), and
// the row reductions; a 32 KiB LDS staging buffer so the LDS column of the report means something.
extern "C" __attribute__((global)) void gfx9_layer_probe(const half4_t* a, const bf16x4_t* b, floatx16_t* c,
                                                          floatx4_t* c4, float* r, const half8_t* a8,
                                                          const bf16x8_t* b8) {
    __attribute__((shared)) float stage[8192];
    const int l = lane_id();
    stage[l] = r[l];
    __builtin_amdgcn_s_barrier();
    floatx16_t acc = c[l];
    floatx4_t acc4 = c4[l];
    acc = mfma_32x32x8(a[l], a[l], acc);
    acc = mfma_32x32x8(b[l], b[l], acc);
    acc4 = mfma_16x16x16(a[l], a[l], acc4);
    acc4 = mfma_16x16x16(b[l], b[l], acc4);
#if defined(__gfx950__)
    acc = mfma_32x32x16(a8[l], a8[l], acc);
    acc = mfma_32x32x16(b8[l], b8[l], acc);
    acc4 = mfma_16x16x32(a8[l], a8[l], acc4);
    acc4 = mfma_16x16x32(b8[l], b8[l], acc4);
#endif
    c[l] = acc;
    c4[l] = acc4;
    r[l] = row_reduce_sum<Mfma32x32x8::N>(stage[(l * 7) & 8191]) + row_reduce_max<Mfma16x16x16::N>(acc4[0]);
}
"""


@pytest.mark.parametrize("target", rocm.TARGETS)
def test_gfx9_layer_compiles(target):
    if rocm.clang() is None:
        pytest.skip("no clang++-22 (Debian: apt-get install clang-22 lld-22)")
    reports = rocm.offline_compile_hip(_PROBE, target, [str(kernel_dir())])
    assert [r.kernel for r in reports] == ["gfx9_layer_probe"], reports
    r = reports[0]
    REPORTS.append(r)
    assert r.scratch == 0, f"{target}: {r.scratch} B of scratch per lane\n{r.log}"
    assert r.lds == 32768 and r.lds <= rocm.LDS_LIMIT[target], r.log
    assert r.ok and r.occupancy > 0, r


def test_bad_target_is_named():
    with pytest.raises(ValueError, match="target"):
        rocm.offline_compile_hip("", "gfx1100")


_PORTED = [(target, spec) for target in rocm.TARGETS for spec in rocm.ported_specs(target)]


def _need_clang():
    if rocm.clang() is None:
        pytest.skip("no clang++-22 (Debian: apt-get install clang-22 lld-22)")


@pytest.mark.parametrize("target, spec", _PORTED, ids=[f"{s.name}-{t}" for t, s in _PORTED])
def test_ported_kernel_compiles(spec, target):
    _need_clang()
    reports = rocm.offline_compile_hip(load_source(spec.source), target, defines=rocm.hip_defines(spec))
    assert [r.kernel for r in reports] == [spec.entry], reports
    r = rocm.with_dynamic_lds(reports[0], spec.macro("SMEM_BYTES", 0), spec.macro("NTHREADS"))
    REPORTS.append(dataclasses.replace(r, kernel=spec.name))
    assert r.ok and r.scratch == 0, f"{spec.name} on {target}: {r}\n{r.log}"
    assert r.lds <= rocm.LDS_LIMIT[target] and r.occupancy > 0, r


@pytest.mark.parametrize("target", rocm.TARGETS)
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_fwd_products_run_on_mfma(target, dtype):
    """The forward's two products are MFMA instructions (16x16x16 of the dtype), and nothing goes
    through scratch memory."""
    _need_clang()
    spec = rocm.fwd_spec(dtype, 128, 128, target)
    asm = rocm.device_asm(load_source(spec.source), target, defines=rocm.hip_defines(spec))
    ops = set(re.findall(r"v_mfma_f32_16x16x16_?(b?f16)", asm))  # gfx90a's bf16 one is bf16_1k
    assert ops == {"bf16" if dtype == "bf16" else "f16"}, ops
    # V^T's column fragments: gfx950's transposed LDS read, 16-bit reads elsewhere
    tr = len(re.findall(r"^\s+ds_read_b64_tr_b16\b", asm, re.M))
    u16 = len(re.findall(r"^\s+ds_read_u16\b", asm, re.M))
    assert (tr > 0 and u16 == 0) if target == "gfx950" else (tr == 0 and u16 > 0), (tr, u16)
    assert not re.search(r"^\s+(scratch|buffer)_(load|store)", asm, re.M)
    assert re.search(r"\.private_segment_fixed_size:\s+0\b", asm)


def test_fwd_tiles_fit_lds():
    for target in rocm.TARGETS:
        for hq, hv in [(d, d) for d in rocm.FWD_HDIMS] + [(192, 128)]:
            spec = rocm.fwd_spec("bf16", hq, hv, target)
            assert spec.macro("SMEM_BYTES") <= rocm.LDS_LIMIT[target], spec.name
            assert spec.macro("NTHREADS") == 64 * spec.macro("NWARPS") and spec.macro("BLOCK_M") == 16 * spec.macro("NWARPS")
    assert rocm.fwd_spec("fp16", 72, 72, "gfx942").macro("HDIM_Q") == 128
    with pytest.raises(ValueError, match="target"):
        rocm.fwd_spec("fp16", 64, 64, "gfx1100")


@pytest.mark.parametrize("target", rocm.TARGETS)
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_bwd_products_run_on_mfma(target, dtype):
    """The backward's five products are MFMA instructions (16x16x16 of the dtype; per query block
    and wavefront: GEMM0 and GEMM2 HDIM / 16 k-steps, GEMM1 and GEMM3 HDIM / 16 tiles per 16 query
    rows, GEMM4 its share of dQ's tiles), column fragments come from transposed LDS reads on
    gfx950 (16-bit reads elsewhere), the dQ adds are native fp32 atomics (no
    compare-and-swap loop: the ROCm options carry -munsafe-fp-atomics for gfx90a), and nothing
    goes through scratch memory."""
    _need_clang()
    spec = rocm.bwd_spec(dtype, 128, 128, target)
    asm = rocm.device_asm(load_source(spec.source), target, defines=rocm.hip_defines(spec))
    ops = re.findall(r"^\s+v_mfma_f32_16x16x16_?(b?f16)", asm, re.M)
    assert set(ops) == {"bf16" if dtype == "bf16" else "f16"}, set(ops)
    bm, nw = spec.macro("BLOCK_M"), spec.macro("NWARPS")
    mt4 = bm // 16
    per_step = 2 * 8 * (bm // 16) + 2 * 8 * (bm // 16) + (spec.macro("BLOCK_N") // 16) * -(-8 // (nw // mt4))
    assert len(ops) == per_step, (len(ops), per_step)
    # column fragments (dO and Q k-major, dS^T for GEMM4, K for dQ): gfx950's transposed LDS read
    tr = len(re.findall(r"^\s+ds_read_b64_tr_b16\b", asm, re.M))
    u16 = len(re.findall(r"^\s+ds_read_u16\b", asm, re.M))
    assert (tr > 0 and u16 == 0) if target == "gfx950" else (tr == 0 and u16 > 0), (tr, u16)
    assert re.search(r"^\s+global_atomic_add_f32\b", asm, re.M)
    assert not re.search(r"cmpswap", asm)
    assert not re.search(r"^\s+(scratch|buffer)_(load|store)", asm, re.M)
    assert re.search(r"\.private_segment_fixed_size:\s+0\b", asm)


def test_bwd_tiles_fit_lds():
    for target in rocm.TARGETS:
        for hq, hv in rocm.HDIM_PAIRS:
            for dropout in (False, True):
                spec = rocm.bwd_spec("bf16", hq, hv, target, dropout=dropout)
                assert spec.macro("SMEM_BYTES") <= rocm.LDS_LIMIT[target], spec.name
                nw, bm = spec.macro("NWARPS"), spec.macro("BLOCK_M")
                assert spec.macro("NTHREADS") == 64 * nw and spec.macro("BLOCK_N") == 16 * nw
                assert nw % (bm // 16) == 0, spec.name  # GEMM4's partition of the query rows
    # 64 KiB: hdim 128 takes 16-row steps, hdim 256 one wavefront; 160 KiB: 4 wavefronts throughout
    assert rocm.bwd_tiles(128, 128, "gfx90a") == dict(NWARPS=4, BLOCK_M=16, NSPLIT=1, MIN_BLOCKS=1)
    assert rocm.bwd_tiles(256, 256, "gfx942")["NWARPS"] == 1
    assert all(rocm.bwd_tiles(hq, hv, "gfx950", dropout=True)["NWARPS"] == 4 for hq, hv in rocm.HDIM_PAIRS)
    with pytest.raises(ValueError, match="target"):
        rocm.bwd_spec("fp16", 64, 64, "gfx1100")
