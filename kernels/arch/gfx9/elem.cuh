// Architecture layer, gfx9 (wave64): the per-thread and per-wavefront pieces the shared kernels
// use outside the matrix instructions (lane and wave indices, shuffles, reductions over a
// wavefront, 16-bit conversions, exp2), under the same names as arch/sm80/instr.cuh and
// fragment.cuh give them for CUDA. Compiler builtins only. Issue 12, in progress; compile-checked
// for gfx90a, gfx942 and gfx950, never run on an AMD GPU.
#pragma once
#include "../../common.cuh"
#include "instr.cuh"

namespace fmha {

inline constexpr int WARP_LANES = 64;  // a wavefront: "warp" in the shared sources' names
__device__ __forceinline__ int lane_of(int tid) { return tid & 63; }
__device__ __forceinline__ int warp_of(int tid) { return tid >> 6; }
__device__ __forceinline__ float shfl_xor(float v, int m) { return gfx9::shfl_xor(v, m, 64); }
__device__ __forceinline__ float warp_reduce_sum(float x) { return gfx9::row_reduce_sum<64>(x); }

// Two floats -> one register holding two 16-bit elements, rounded to nearest even (as the CUDA
// layer's cvt.rn); lo in bits 0..15.
__device__ __forceinline__ uint32_t f32_to_16(float x) {
    if constexpr (FMHA_BF16) {
        const uint32_t u = __builtin_bit_cast(uint32_t, x);
        if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;  // NaN stays a quiet NaN
        return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    } else {
        return __builtin_bit_cast(uint16_t, static_cast<_Float16>(x));
    }
}
__device__ __forceinline__ uint32_t pack2(float lo, float hi) { return f32_to_16(lo) | (f32_to_16(hi) << 16); }
__device__ __forceinline__ float f16_bits_to_float(uint16_t x) {
    return static_cast<float>(__builtin_bit_cast(_Float16, x));
}
__device__ __forceinline__ float bf16_bits_to_float(uint16_t x) {
    return __builtin_bit_cast(float, static_cast<uint32_t>(x) << 16);
}
// ... and back, rounded to nearest even (dS stored as dBias in the bias's own dtype)
__device__ __forceinline__ uint16_t float_to_f16_bits(float f) { return __builtin_bit_cast(uint16_t, static_cast<_Float16>(f)); }
__device__ __forceinline__ uint16_t float_to_bf16_bits(float f) {
    const uint32_t u = __builtin_bit_cast(uint32_t, f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;
    return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ float to_float(uint16_t x) {
    if constexpr (FMHA_BF16) return bf16_bits_to_float(x);
    else return f16_bits_to_float(x);
}
__device__ __forceinline__ float fast_exp2(float x) { return __builtin_amdgcn_exp2f(x); }
// (the CUDA forward's EXP_EMU variant has no gfx9 form: the hardware exponential)
__device__ __forceinline__ float poly_exp2(float x) { return fast_exp2(x); }

}  // namespace fmha
