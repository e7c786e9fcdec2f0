// Architecture layer, sm90 (sm_90a): the tensor memory accelerator (TMA) and what goes with it:
// tensor maps, mbarriers (transaction-count barriers that TMA loads complete), register
// rebalancing between warp roles (setmaxnreg), barriers over a subset of warps, and wgmma
// descriptors of 128-byte-swizzled tiles. Hand-written; facts from the PTX ISA (cp.async.bulk.tensor,
// mbarrier, setmaxnreg, the warpgroup matrix descriptor). tests/test_gpu_tma.py checks the TMA
// loads, the mbarrier wait and the swizzle pattern below on the GPU, tests/test_gpu_wgmma_swizzle.py
// the swizzled wgmma descriptors (K-major and MN-major) against NumPy.
//
// Tensor maps are encoded on the host (cupy_fmha/backends/tma.py, the driver's
// cuTensorMapEncodeTiled) and passed to the kernel by value as `const __grid_constant__ TmaMap`;
// the TMA instructions take the parameter's own address.
//
// 128-byte swizzle (the layout TMA writes with CU_TENSOR_MAP_SWIZZLE_128B and wgmma reads with
// swizzle mode 1): a box whose inner dimension is 128 bytes (64 16-bit elements) lands as rows of
// 128 bytes, and in each row r the 16-byte chunk j is stored at chunk j ^ (r % 8). The pattern is a
// function of the shared-memory address bits (bits 4-6 ^= bits 7-9), so every tile must start on a
// 1024-byte boundary.
#pragma once
#include "../../common.cuh"

namespace fmha {

// Registers per thread of the warp-specialized kernels' roles after setmaxnreg: a producer
// warpgroup that only issues TMA copies, and MMA warpgroups (one producer and two MMA warpgroups:
// 128 * (24 + 2 * 240) = 64512 of the SM's 65536; with three, ws_mma_regs<3>: 128 * (24 + 3 * 160)).
inline constexpr int WS_PRODUCER_REGS = 24, WS_MMA_REGS = 240;
// ... per MMA thread with nwg MMA warpgroups beside the producer: the largest multiple of 8 that fits
// the CTA's pool, the registers it was launched with (a multiple of 8 per thread: 168 for 384
// threads, 128 for 512; setmaxnreg.inc waits for registers the pool lacks). A pool of 65536 would
// overstate it for two MMA warpgroups (bench/NOTES.md step 99: a 56-register producer leaves them 224, not 232).
template <int nwg> inline constexpr int ws_launch_regs = 65536 / (128 * (nwg + 1)) / 8 * 8;
template <int nwg> inline constexpr int ws_mma_regs = ((nwg + 1) * ws_launch_regs<nwg> - WS_PRODUCER_REGS) / nwg / 8 * 8;
static_assert(ws_mma_regs<2> == WS_MMA_REGS && ws_mma_regs<3> == 160, "ws_mma_regs");

// An encoded CUtensorMap (opaque, 128 bytes, 64-byte aligned).
struct __align__(64) TmaMap {
    unsigned long long opaque[16];
};

__device__ __forceinline__ unsigned long long tma_map_addr(const TmaMap& m) {
    return reinterpret_cast<unsigned long long>(&m);
}
// Fetch the map into the TMA unit's cache ahead of its first use (optional).
__device__ __forceinline__ void tma_prefetch_map(const TmaMap& m) {
    asm volatile("prefetch.tensormap [%0];\n" :: "l"(tma_map_addr(m)) : "memory");
}

// ---- mbarrier: a 64-bit shared-memory barrier with an arrival count and a transaction (byte)
// count; a phase completes when both reach zero, then the parity flips.
__device__ __forceinline__ void mbarrier_init(unsigned bar, unsigned arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(arrivals) : "memory");
}
// Make initialized barriers visible to the other threads and to the async proxy (TMA); follow
// with a CTA barrier before anyone uses them.
__device__ __forceinline__ void mbarrier_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// Arrive once and announce `bytes` more bytes that TMA copies will complete on this phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(bar) : "memory");
}
// Wait until the phase with parity `parity` has completed.
__device__ __forceinline__ void mbarrier_wait(unsigned bar, unsigned parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "wait_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra wait_%=;\n"
        "}\n" :: "r"(bar), "r"(parity) : "memory");
}

// ---- TMA loads: the box of the map at element coordinates (c0 innermost, ...) into shared memory
// at `dst`, completing `bar`'s transaction count by the box's bytes. Out-of-range elements are
// filled with zeros.
__device__ __forceinline__ void tma_load_2d(unsigned dst, const TmaMap& m, unsigned bar, int c0, int c1) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n"
        :: "r"(dst), "l"(tma_map_addr(m)), "r"(bar), "r"(c0), "r"(c1) : "memory");
}
__device__ __forceinline__ void tma_load_4d(unsigned dst, const TmaMap& m, unsigned bar, int c0, int c1, int c2, int c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], [%2];\n"
        :: "r"(dst), "l"(tma_map_addr(m)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3) : "memory");
}

__device__ __forceinline__ void tma_load_5d(unsigned dst, const TmaMap& m, unsigned bar, int c0, int c1, int c2, int c3,
                                            int c4) {
    asm volatile(
        "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6, %7}], [%2];\n"
        :: "r"(dst), "l"(tma_map_addr(m)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4) : "memory");
}

// ---- TMA store: the box of the map at element coordinates (c0 innermost, ...) from shared memory at
// `src` (laid out as a load of that box would write it; written before a fence_proxy_async() by its
// writers); elements outside the tensor are not written. A bulk group of the issuing thread
// (bulk_commit; bulk_wait_read before `src` is rewritten, async.cuh).
__device__ __forceinline__ void tma_store_4d(const TmaMap& m, unsigned src, int c0, int c1, int c2, int c3) {
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n"
                 :: "l"(tma_map_addr(m)), "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3) : "memory");
}

// ---- Register rebalancing between warpgroups of different roles (needs __launch_bounds__(n, 1));
// N a multiple of 8 in [24, 256], the same for every warp of the warpgroup.
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(N)); }
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(N)); }

// Arrive at barrier `id` over `count` threads without waiting (a producer signalling consumers that
// wait with named_barrier_sync(id, count)).
__device__ __forceinline__ void named_barrier_arrive(int id, int count) {
    asm volatile("bar.arrive %0, %1;\n" :: "r"(id), "r"(count) : "memory");
}

// ---- wgmma descriptors of 128-byte-swizzled operands (swizzle mode 1 in bits 62-63; base offset 0,
// so the 1024-byte swizzle pattern must start on a 1024-byte boundary: every tile and slab below
// does). LBO and SBO in bytes, multiples of 16.
__device__ __forceinline__ unsigned long long wgmma_desc_sw128(unsigned smem_addr, int lbo_bytes, int sbo_bytes) {
    return (unsigned long long)((smem_addr & 0x3FFFF) >> 4) |
           ((unsigned long long)((lbo_bytes >> 4) & 0x3FFF) << 16) |
           ((unsigned long long)((sbo_bytes >> 4) & 0x3FFF) << 32) | (1ull << 62);
}
// A K-major operand in 128-byte-swizzled tiles: rows of 64 16-bit elements (one swizzle atom wide
// along K), 8-row groups 1024 bytes apart (SBO); LBO is unused for K-major swizzled layouts (set
// to 16 bytes). A K step of 16 elements inside the atom adds 32 bytes to the start address.
__device__ __forceinline__ unsigned long long wgmma_desc_sw128_kmajor(unsigned smem_addr) {
    return wgmma_desc_sw128(smem_addr, 16, 1024);
}

// ---- 128-byte-swizzled tiles, as TMA boxes of 64 columns write them (the SWIZZLE=1 builds of
// fmha_fwd_sm90_ws): an R x C tile of 16-bit elements (R a multiple of 8, C of 64) is C / 64 slabs
// of R rows x 128 bytes, [C / 64][R][64], slab c holding columns 64c .. 64c + 63 (one box each).
// Inside a slab, row r lies at byte 128 r with its 16-byte chunk j at chunk j ^ (r % 8). Slabs are
// R * 128 bytes apart, a multiple of 1024, so each starts the swizzle pattern afresh.
//
// K-major operand (R rows = M or N, columns = K): the 16-wide K slice at (row0, k0), row0 a multiple
// of 8, k0 of 16: start in slab k0 / 64 at row row0, +2 bytes per column inside the atom.
template <int R>
__device__ __forceinline__ unsigned long long desc_sw_kmajor(const uint16_t* tile, int row0, int k0) {
    return desc_advance(wgmma_desc_sw128(smem_u32(tile), 16, 1024), (k0 >> 6) * (R * 128) + row0 * 128 + (k0 & 63) * 2);
}
// (this and desc_sw_mnmajor also take the tile's shared-memory address in place of its pointer)
template <int R>
__device__ __forceinline__ unsigned long long desc_sw_kmajor(unsigned tile, int row0, int k0) {
    return desc_advance(wgmma_desc_sw128(tile, 16, 1024), (k0 >> 6) * (R * 128) + row0 * 128 + (k0 & 63) * 2);
}
// MN-major operand (R rows = K, columns = M or N, C of them): the 16-deep K slice at (k0, col0), k0 a
// multiple of 16. The PTX ISA's canonical MN-major swizzled layout: LBO = the byte offset between
// swizzle atoms along M/N (here the slab stride, R * 128: the next 64 columns), SBO = the byte offset
// between groups of 8 rows along K (1024); checked on the H200 against NumPy by
// tests/test_gpu_wgmma_swizzle.py (the swapped reading is wrong). With an MN extent of one atom (64)
// LBO is not used.
// col0 a multiple of 64, or (an MN extent under 64: N = 32 at hdim 64 in the backward's GEMM4) a
// multiple of 8 with col0 % 64 + N <= 64: the start then lies 2 * (col0 % 64) bytes into the atom's
// first row, as desc_sw_kmajor's K steps do. That start offset only touches address bits 4-6, k0 * 128
// keeps bits 7-9 at the 1024-byte pattern's row 0 (base offset 0 stays right), and the chunk the
// hardware forms for row j, column col0 + 8i (bits 4-6 = col0 % 64 / 8 + i, XORed with bits 7-9 = j)
// is the chunk TMA wrote that column to; the reading relies on the swizzle being applied to the
// computed address, which the K-major K steps (same XOR, same bits) already rely on.
template <int R>
__device__ __forceinline__ unsigned long long desc_sw_mnmajor(const uint16_t* tile, int k0, int col0) {
    return desc_advance(wgmma_desc_sw128(smem_u32(tile), R * 128, 1024), (col0 >> 6) * (R * 128) + k0 * 128 + (col0 & 63) * 2);
}
template <int R>
__device__ __forceinline__ unsigned long long desc_sw_mnmajor(unsigned tile, int k0, int col0) {
    return desc_advance(wgmma_desc_sw128(tile, R * 128, 1024), (col0 >> 6) * (R * 128) + k0 * 128 + (col0 & 63) * 2);
}
// Rows [r0, R) of a swizzled tile of C columns set to zero by THREADS threads (rows a TMA box brought
// from beyond a sequence's end, group mode): the swizzle only permutes chunks inside a row, so
// these are whole 128-byte rows, bytes [128 r0, 128 R) of each slab.
template <int R, int C, int THREADS>
__device__ __forceinline__ void sw_zero_rows(uint16_t* tile, int r0, int tid) {
    const int n = (R - r0) * 8;  // 16-byte chunks per slab
    for (int u = tid; u < (C / 64) * n; u += THREADS)
        *reinterpret_cast<uint4*>(tile + (u / n) * (R * 64) + r0 * 64 + (u % n) * 8) = make_uint4(0u, 0u, 0u, 0u);
}

}  // namespace fmha
