// Probe: wgmma descriptor semantics for no-swizzle K-major and MN-major operands, on the
// wrappers of kernels/arch_sm90.cuh (bf16). Run: python bench/probe/probe.py MODE... (each mode in
// its own process: a wrong descriptor can fault the context). Modes 0, 2, 4, 5, 7 matched numpy on
// an H200 (2026-11-29); 1, 3, 6 faulted: for MN-major operands too, LBO is the stride between core
// matrices along K and SBO the stride along M/N.
#include "common.cuh"
#include "arch_sm90.cuh"
using namespace fmha;
typedef unsigned short u16;
__device__ __forceinline__ unsigned long long desc(const void* p, int lbo, int sbo) {
    unsigned a = (unsigned)__cvta_generic_to_shared(p);
    return (unsigned long long)((a & 0x3FFFF) >> 4) | ((unsigned long long)(lbo >> 4) << 16) |
           ((unsigned long long)(sbo >> 4) << 32);
}
// blocked layout: rows x cols (cols contiguous within 8), element (r,c) at ((r/8)*(C/8) + c/8)*64 + (r%8)*8 + c%8
__device__ __forceinline__ int blk(int r, int c, int C) { return ((r >> 3) * (C >> 3) + (c >> 3)) * 64 + (r & 7) * 8 + (c & 7); }

// mode 0: A K-major [m][k], B K-major [n][k]
// mode 1: A K-major, B MN-major stored [k][n], LBO = n-stride(128B), SBO = k-stride
// mode 2: same with LBO/SBO swapped
// mode 3: A MN-major stored [k][m] (tnspA), LBO = m-stride, SBO = k-stride ; B K-major
// mode 4: mode 3 swapped
// mode 5: A from registers, B K-major
// mode 6: A from registers, B MN-major (lbo n, sbo k) ; mode 7 swapped
extern "C" __global__ void probe(const u16* A, const u16* B, float* D, int mode) {
    // A: [64][16] row-major (m,k), B: [16][64] row-major (k,n) in global
    __shared__ __align__(128) u16 sA[64 * 16];
    __shared__ __align__(128) u16 sB[16 * 64];
    int tid = threadIdx.x;
    for (int i = tid; i < 64 * 16; i += 128) {
        int m = i / 16, k = i % 16;
        if (mode == 3 || mode == 4) sA[blk(k, m, 64)] = A[i]; else sA[blk(m, k, 16)] = A[i];
        int kk = i / 64, n = i % 64;
        if (mode == 0 || mode >= 3 && mode != 6 && mode != 7) sB[blk(n, kk, 16)] = B[i]; else sB[blk(kk, n, 64)] = B[i];
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    float d[32];
    for (int i = 0; i < 32; ++i) d[i] = 0.f;
    unsigned long long da_k = desc(sA, 128, 256);         // K-major A: LBO k-step core (128B), SBO m-step (2 cores*128B)
    unsigned long long db_k = desc(sB, 128, 256);         // K-major B [n][k]: same
    unsigned long long db_mn1 = desc(sB, 128, 1024);      // MN-major B [k][n]: n-core stride 128B, k-core stride 8*128B
    unsigned long long db_mn2 = desc(sB, 1024, 128);
    unsigned long long da_mn1 = desc(sA, 128, 1024);
    unsigned long long da_mn2 = desc(sA, 1024, 128);
    int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    unsigned a[4];
    {
        const unsigned* A32 = reinterpret_cast<const unsigned*>(A);
        int r0 = warp * 16 + g;
        a[0] = A32[(r0 * 16 + 2 * t) / 2];
        a[1] = A32[((r0 + 8) * 16 + 2 * t) / 2];
        a[2] = A32[(r0 * 16 + 2 * t + 8) / 2];
        a[3] = A32[((r0 + 8) * 16 + 2 * t + 8) / 2];
    }
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    if (mode == 0) wgmma_ss_n64<0, 0>(d, da_k, db_k, 0);
    if (mode == 1) wgmma_ss_n64<0, 1>(d, da_k, db_mn1, 0);
    if (mode == 2) wgmma_ss_n64<0, 1>(d, da_k, db_mn2, 0);
    if (mode == 3) wgmma_ss_n64<1, 0>(d, da_mn1, db_k, 0);
    if (mode == 4) wgmma_ss_n64<1, 0>(d, da_mn2, db_k, 0);
    if (mode == 5) wgmma_rs_n64<0>(d, a, db_k, 0);
    if (mode == 6) wgmma_rs_n64<1>(d, a, db_mn1, 0);
    if (mode == 7) wgmma_rs_n64<1>(d, a, db_mn2, 0);
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    for (int j = 0; j < 8; ++j) {
        int r = warp * 16 + g, c = 8 * j + 2 * t;
        D[r * 64 + c] = d[4 * j]; D[r * 64 + c + 1] = d[4 * j + 1];
        D[(r + 8) * 64 + c] = d[4 * j + 2]; D[(r + 8) * 64 + c + 1] = d[4 * j + 3];
    }
}
