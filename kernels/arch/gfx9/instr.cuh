// Architecture layer, gfx9 (AMD CDNA: gfx90a, gfx942, gfx950; wave64): the MFMA instructions as
// compiler builtins (clang's __builtin_amdgcn_mfma_*; hiprtc and clang -x hip know them), over
// the fragment layouts of layout.cuh beside it, and gfx950's transposed LDS read. Hand-written.
// Compile-checked for the three targets by tests/test_rocm_compile.py (clang-22); never run: no
// AMD GPU is available to this project (the ROCm backend is issue 12, in progress).
#pragma once
#include "layout.cuh"

namespace fmha {
namespace gfx9 {

typedef _Float16 half4_t __attribute__((ext_vector_type(4)));
typedef _Float16 half8_t __attribute__((ext_vector_type(8)));
typedef short bf16x4_t __attribute__((ext_vector_type(4)));    // bf16 bits (the *_1k builtins)
typedef __bf16 bf16x8_t __attribute__((ext_vector_type(8)));
typedef float floatx4_t __attribute__((ext_vector_type(4)));
typedef float floatx16_t __attribute__((ext_vector_type(16)));

// D = A B + C over one wavefront; A and B: KPL elements per lane, D: ACC per lane (layout.cuh).
FMHA_GFX9_FN inline floatx16_t mfma_32x32x8(half4_t a, half4_t b, floatx16_t c) {
    return __builtin_amdgcn_mfma_f32_32x32x8f16(a, b, c, 0, 0, 0);
}
FMHA_GFX9_FN inline floatx16_t mfma_32x32x8(bf16x4_t a, bf16x4_t b, floatx16_t c) {
    return __builtin_amdgcn_mfma_f32_32x32x8bf16_1k(a, b, c, 0, 0, 0);
}
FMHA_GFX9_FN inline floatx4_t mfma_16x16x16(half4_t a, half4_t b, floatx4_t c) {
    return __builtin_amdgcn_mfma_f32_16x16x16f16(a, b, c, 0, 0, 0);
}
FMHA_GFX9_FN inline floatx4_t mfma_16x16x16(bf16x4_t a, bf16x4_t b, floatx4_t c) {
    return __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(a, b, c, 0, 0, 0);
}
#if defined(__gfx950__)
FMHA_GFX9_FN inline floatx16_t mfma_32x32x16(half8_t a, half8_t b, floatx16_t c) {
    return __builtin_amdgcn_mfma_f32_32x32x16_f16(a, b, c, 0, 0, 0);
}
FMHA_GFX9_FN inline floatx16_t mfma_32x32x16(bf16x8_t a, bf16x8_t b, floatx16_t c) {
    return __builtin_amdgcn_mfma_f32_32x32x16_bf16(a, b, c, 0, 0, 0);
}
FMHA_GFX9_FN inline floatx4_t mfma_16x16x32(half8_t a, half8_t b, floatx4_t c) {
    return __builtin_amdgcn_mfma_f32_16x16x32_f16(a, b, c, 0, 0, 0);
}
FMHA_GFX9_FN inline floatx4_t mfma_16x16x32(bf16x8_t a, bf16x8_t b, floatx4_t c) {
    return __builtin_amdgcn_mfma_f32_16x16x32_bf16(a, b, c, 0, 0, 0);
}

// ds_read_b64_tr_b16 (layout.cuh's DsReadTr16): 4 16-bit elements of one column of the 4 x 16
// block the lane's group of 16 reads; p, the lane's 8-byte address, must be an LDS address.
typedef short short4_t __attribute__((ext_vector_type(4)));
FMHA_GFX9_FN inline short4_t ds_read_tr16(const void* p) {
    typedef __attribute__((address_space(3))) short4_t lds_short4;
    return __builtin_amdgcn_ds_read_tr16_b64_v4i16((lds_short4*)p);
}
#endif

// Lane index in the wavefront, and the value of `x` in lane (this lane ^ mask) inside groups of
// `width` lanes, through the LDS crossbar (ds_bpermute); compiler builtins only, so the layer
// needs no HIP runtime headers (hiprtc and the offline clang check alike).
FMHA_GFX9_FN inline int lane_id() { return __builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u)); }
FMHA_GFX9_FN inline float shfl_xor(float x, int mask, int width) {
    const int lane = lane_id();
    const int src = (lane & ~(width - 1)) | ((lane ^ mask) & (width - 1));
    return __builtin_bit_cast(float, __builtin_amdgcn_ds_bpermute(src << 2, __builtin_bit_cast(int, x)));
}

// *p += v in global memory, atomically, result unused (relaxed, device scope; the dQ adds). The
// compiler makes it one global_atomic_add_f32 on gfx942 / gfx950, and on gfx90a only under
// -munsafe-fp-atomics (the memory being coarse-grained, as hipMalloc's is): otherwise a
// compare-and-swap loop there, correct but slow (the ROCm backend passes the option).
FMHA_GFX9_FN inline void atomic_add_f32(float* p, float v) {
    __hip_atomic_fetch_add(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}

// Row reductions of an accumulator (each lane holds one column; the rows of a column live in one
// lane): across the columns of a row, i.e. across the N lanes of a lane group, by xor shuffles
// within groups of N lanes (ds_swizzle / DPP are the compiler's business here).
template <int N>
FMHA_GFX9_FN inline float row_reduce_sum(float x) {
#pragma unroll
    for (int m = N / 2; m >= 1; m >>= 1) x += shfl_xor(x, m, N);
    return x;
}
template <int N>
FMHA_GFX9_FN inline float row_reduce_max(float x) {
#pragma unroll
    for (int m = N / 2; m >= 1; m >>= 1) x = __builtin_fmaxf(x, shfl_xor(x, m, N));
    return x;
}

}  // namespace gfx9
}  // namespace fmha
