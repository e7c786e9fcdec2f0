// Architecture layer, sm90 (sm_90a): bulk copies from shared to global memory (the TMA engine) and
// named barriers. Hand-written (the wgmma wrappers beside it are generated).
#pragma once
#include "../../common.cuh"

namespace fmha {

// Bulk (TMA-engine) reduction: global[dst .. dst + bytes) += shared[src .. src + bytes), fp32,
// element-wise atomic; bytes a multiple of 16, both addresses 16-byte aligned. The shared source
// must have been written before a fence_proxy_async() by its writers. bulk_commit() closes a
// group; bulk_wait_read<0>() waits until this thread's groups have read their sources (the
// buffer may then be rewritten), bulk_wait<0>() until they have completed.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, unsigned src, unsigned bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
                 :: "l"(dst), "r"(src), "r"(bytes) : "memory");
}
// Bulk copy: global[dst .. dst + bytes) = shared[src .. src + bytes) (same rules as above).
__device__ __forceinline__ void bulk_store(void* dst, unsigned src, unsigned bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n"
                 :: "l"(dst), "r"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read %0;\n" :: "n"(N) : "memory"); }
template <int N>
__device__ __forceinline__ void bulk_wait() { asm volatile("cp.async.bulk.wait_group %0;\n" :: "n"(N) : "memory"); }
// Barrier `id` (1..15; 0 is __syncthreads) over `count` threads (a multiple of 32).
__device__ __forceinline__ void named_barrier_sync(int id, int count) {
    asm volatile("bar.sync %0, %1;\n" :: "r"(id), "r"(count) : "memory");
}

// Ordered accumulation across CTAs (deterministic dQ): a counter in global memory admits one CTA
// at a time. sem_wait waits until *sem == value (acquire, GPU scope) and then orders the bulk
// copies this thread issues after it behind what it observed; sem_release makes this thread's
// completed bulk copies (bulk_wait<0>() first) visible before it adds 1 (release, GPU scope).
__device__ __forceinline__ void sem_wait(const int* sem, int value) {
    int seen;
    for (;;) {
        asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(seen) : "l"(sem) : "memory");
        if (seen == value) break;
        __nanosleep(64);
    }
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
}
__device__ __forceinline__ void sem_release(int* sem) {
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
    asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" :: "l"(sem) : "memory");
}

// Diagnostics (the ws backward's TIMING build): the global nanosecond timer and this SM's index.
__device__ __forceinline__ unsigned long long global_timer_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ unsigned sm_index() {
    unsigned id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    return id;
}

}  // namespace fmha
