// Architecture layer, sm80 (NVIDIA sm_80 and newer): the mma.sync-family instructions, as inline PTX.
//
//   mma_16816        mma.sync m16n8k16, fp16/bf16 in, fp32 accumulate (row.col)
//   ldsm_x4/x2(_t)   ldmatrix 8x8 b16 fragments from shared memory (optionally transposed)
//   cp_async_16      16-byte global->shared copy, zero-filled when !pred (cp.async.cg)
//   red_add_f32x2    fp32 pair atomically added to global memory (vector red on sm_90)
//   pack2 / to_float element conversions (input dtype); f16/bf16_bits_to_float (run-time dtype)
#pragma once
#include "../../common.cuh"

namespace fmha {

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// D += A * B for one 16x8x16 tile. a: 4 regs (A fragment), b: 2 regs, d: 4 fp32.
__device__ __forceinline__ void mma_16816(float d[4], const uint32_t a[4], const uint32_t b[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32." FMHA_PTX_ELEM "." FMHA_PTX_ELEM ".f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ void ldsm_x4(uint32_t r[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x2(uint32_t r[2], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x2_t(uint32_t r[2], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}

// 16-byte async copy; when pred is false the destination is zero-filled and nothing is read.
__device__ __forceinline__ void cp_async_16(unsigned dst, const void* src, bool pred) {
    int n = pred ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N)); }

__device__ __forceinline__ void red_add_f32x2(float* p, float a, float b) {
#if __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" :: "l"(p), "f"(a), "f"(b) : "memory");
#else
    atomicAdd(p, a);
    atomicAdd(p + 1, b);
#endif
}

// Two floats -> one register holding two 16-bit elements (round to nearest even); lo in bits 0..15.
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn." FMHA_PTX_ELEM "x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// Conversions of a stored element of either 16-bit type (the elementwise bias has its own dtype,
// independent of FMHA_BF16); to_float: the instance's element type.
__device__ __forceinline__ float f16_bits_to_float(uint16_t x) {
    float f;
    asm("cvt.f32.f16 %0, %1;\n" : "=f"(f) : "h"(x));
    return f;
}
__device__ __forceinline__ float bf16_bits_to_float(uint16_t x) {
    return __uint_as_float(static_cast<uint32_t>(x) << 16);
}
__device__ __forceinline__ float to_float(uint16_t x) {
    if constexpr (FMHA_BF16) return bf16_bits_to_float(x);
    else return f16_bits_to_float(x);
}
// ... and back, rounded to nearest even (dS stored as dBias in the bias's own dtype)
__device__ __forceinline__ uint16_t float_to_f16_bits(float f) {
    uint16_t h;
    asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(h) : "f"(f));
    return h;
}
__device__ __forceinline__ uint16_t float_to_bf16_bits(float f) {
    uint16_t h;
    asm("cvt.rn.bf16.f32 %0, %1;\n" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// 2^x on the FMA pipes instead of the MUFU unit (the forward's EXP_EMU variant, bench/NOTES.md step
// 87; FlashAttention-4's published remedy for exponentials that outrun the MUFU unit), for the
// softmax's arguments: x <= 0, a rounding above it (the folded form), or up to LAZY_RESCALE above it
// (valid for x < 128; 128 gives +inf). x clamped to >= -127 (max.NaN: a NaN stays NaN); n = floor(x)
// from one add rounded down against 1.5 * 2^23, whose low mantissa bits then hold n; f = x - n in
// [0, 1] (exact where x >= -0.5 or |x| >= 1; for x in [-0.5, 0) f = 1 + x rounds, and below -2^-25
// it is 1.0 with n = -1, which p(1) = 2 exactly makes right); 2^f by a cubic with p(0) = 1 and
// p(1) = 2 exactly (fitted for the least relative error, 1.04e-4: cupy_fmha.softmax_exp.POLY_EXP2);
// times 2^n, built in the exponent field from the add's bits (n = -127 gives +0.0: everything below
// -126, -inf included, comes out as 0). Nine instructions (one on the ALU pipe) against MUFU.EX2's 8
// cycles of its unit per warp. cupy_fmha.softmax_exp.poly_exp2 is its replica (tests/test_softmax_exp.py).
__device__ __forceinline__ float poly_exp2(float x) {
    float xc;
    asm("max.NaN.f32 %0, %1, 0fC2FE0000;\n" : "=f"(xc) : "f"(x));  // (-127)
    const float t = __fadd_rd(xc, 12582912.f);
    const float f = __fsub_rn(xc, __fsub_rn(t, 12582912.f));
    const float p = __fmaf_rn(__fmaf_rn(__fmaf_rn(0x1.4095eap-4f, f, 0x1.cf7a66p-3f), f, 0x1.640eaap-1f), f, 1.f);
    return __fmul_rn(p, __uint_as_float(__float_as_uint(t) * 0x800000u + 0x3f800000u));
}

__device__ __forceinline__ float shfl_xor(float v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
// v of lane (this lane ^ m) of this warp; every lane must take part.
__device__ __forceinline__ uint32_t shfl_xor_u32(uint32_t v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
// prmt.b32 of a (bytes 0-3) and b (bytes 4-7) with selector s, sign mode included (a nibble's bit 3
// replicates the top bit of the byte it selects; CUDA's __byte_perm ignores that bit)
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t s) {
    uint32_t d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(s));
    return d;
}
// Bit L: `pred` of lane L of this warp; every lane must take part.
__device__ __forceinline__ uint32_t ballot(bool pred) { return __ballot_sync(0xffffffffu, pred); }

}  // namespace fmha

namespace fmha {
// 4-byte async copy (for per-row float vectors such as LSE and D); zero-filled when !pred.
__device__ __forceinline__ void cp_async_4(unsigned dst, const void* src, bool pred) {
    int n = pred ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" :: "r"(dst), "l"(src), "r"(n));
}
}  // namespace fmha
