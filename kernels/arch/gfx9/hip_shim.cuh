// The CUDA spellings the shared kernel sources use, for an offline clang HIP compile without the
// HIP runtime headers (-nogpuinc; tests/test_rocm_compile.py passes -DFMHA_HIP_SHIM): attributes,
// the thread/block/grid indices, the block barrier, vector types, bit casts and __umulhi, all
// through clang builtins. hiprtc brings HIP's own headers and does not use this file. Issue 12, in
// progress; never run on an AMD GPU.
#pragma once

#define __host__ __attribute__((host))
#define __device__ __attribute__((device))
#define __global__ __attribute__((global))
#define __shared__ __attribute__((shared))
#define __forceinline__ inline __attribute__((always_inline))
#define __align__(n) __attribute__((aligned(n)))
// HIP's meaning: at most n threads per block (the register budget follows), at least m waves per
// SIMD (1 when not given)
#define FMHA_HIP_LB(n, m, ...) __attribute__((amdgpu_flat_work_group_size(1, n), amdgpu_waves_per_eu(m)))
#define __launch_bounds__(...) FMHA_HIP_LB(__VA_ARGS__, 1)
#define __grid_constant__

namespace fmha_hip {
// The kernel dispatch packet (HSA): workgroup sizes at bytes 4, 6, 8 (u16), grid sizes in work
// items at bytes 12, 16, 20 (u32).
__device__ inline const unsigned char* dispatch() {
    return static_cast<const unsigned char*>(__builtin_amdgcn_dispatch_ptr());
}
__device__ inline unsigned wg_size(int d) { return *reinterpret_cast<const unsigned short*>(dispatch() + 4 + 2 * d); }
__device__ inline unsigned grid_items(int d) { return *reinterpret_cast<const unsigned*>(dispatch() + 12 + 4 * d); }
// threadIdx, blockIdx, blockDim, gridDim: .x/.y/.z read through G(0/1/2) (the dimension is a
// constant after inlining, so each read is one builtin).
__device__ inline unsigned thread_id(int d) {
    return d == 0 ? __builtin_amdgcn_workitem_id_x() : d == 1 ? __builtin_amdgcn_workitem_id_y() : __builtin_amdgcn_workitem_id_z();
}
__device__ inline unsigned block_id(int d) {
    return d == 0 ? __builtin_amdgcn_workgroup_id_x() : d == 1 ? __builtin_amdgcn_workgroup_id_y() : __builtin_amdgcn_workgroup_id_z();
}
__device__ inline unsigned grid_blocks(int d) { return (grid_items(d) + wg_size(d) - 1) / wg_size(d); }
template <unsigned (*G)(int)>
struct Dim3 {
    __declspec(property(get = gx)) unsigned x;
    __declspec(property(get = gy)) unsigned y;
    __declspec(property(get = gz)) unsigned z;
    __device__ unsigned gx() const { return G(0); }
    __device__ unsigned gy() const { return G(1); }
    __device__ unsigned gz() const { return G(2); }
};
}  // namespace fmha_hip

static constexpr fmha_hip::Dim3<fmha_hip::thread_id> threadIdx{};
static constexpr fmha_hip::Dim3<fmha_hip::block_id> blockIdx{};
static constexpr fmha_hip::Dim3<fmha_hip::wg_size> blockDim{};
static constexpr fmha_hip::Dim3<fmha_hip::grid_blocks> gridDim{};

__device__ inline void __syncthreads() {
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
    __builtin_amdgcn_s_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}
__host__ __device__ inline float __int_as_float(int x) { return __builtin_bit_cast(float, x); }
__host__ __device__ inline int __float_as_int(float x) { return __builtin_bit_cast(int, x); }
__host__ __device__ inline unsigned __float_as_uint(float x) { return __builtin_bit_cast(unsigned, x); }
__host__ __device__ inline unsigned __umulhi(unsigned a, unsigned b) {
    return (unsigned)(((unsigned long long)a * b) >> 32);
}
__device__ inline float fabsf(float x) { return __builtin_fabsf(x); }
__device__ inline float fmaxf(float a, float b) { return __builtin_fmaxf(a, b); }
__device__ inline float fminf(float a, float b) { return __builtin_fminf(a, b); }
__device__ inline float __log2f(float x) { return __builtin_amdgcn_logf(x); }  // v_log_f32: log2
template <class T>
__host__ __device__ inline T min(T a, T b) { return b < a ? b : a; }
template <class T>
__host__ __device__ inline T max(T a, T b) { return a < b ? b : a; }

struct __attribute__((aligned(16))) uint4 { unsigned x, y, z, w; };
struct __attribute__((aligned(8))) uint2 { unsigned x, y; };
struct __attribute__((aligned(16))) float4 { float x, y, z, w; };
struct __attribute__((aligned(8))) float2 { float x, y; };
__host__ __device__ inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
__host__ __device__ inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
__host__ __device__ inline float2 make_float2(float x, float y) { return {x, y}; }
__host__ __device__ inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
