// Pieces shared by the two warp-specialized Hopper backward kernels (fmha_bwd_dq_dk_dv_sm90_ws.cu
// and fmha_bwd_dq_dk_dv_sm90_ws_wide.cu): the producer warp, the zeroing of the rows a TMA box
// brings from the next sequence (group mode), the CTA order and the dK/dV epilogue. Both kernels'
// shared-memory structs have the members used here: k, v (the key block's tiles), q[STAGES],
// dout[STAGES], lse[STAGES], d[STAGES] (the query blocks' ring) and the mbarriers full[STAGES],
// empty[STAGES], kv.
#pragma once
#include "common.cuh"
#include "arch/arch.cuh"
#include "block.cuh"

namespace fmha {

// Thread 0: the ring's mbarriers (full: lane 0's expect_tx and the LSE/D warp's 32 arrivals; empty:
// EMPTY arrivals, every MMA thread and, in the wide kernel's DQ_WRITER builds, the dQ writer) and
// K/V's. The caller adds its own, then mbarrier_init_fence().
template <int ST, int EMPTY, class Smem>
__device__ __forceinline__ void bwd_ws_init_barriers(Smem& sm) {
    for (int s = 0; s < ST; ++s) {
        mbarrier_init(smem_u32(&sm.full[s]), 1 + 32);
        mbarrier_init(smem_u32(&sm.empty[s]), EMPTY);
    }
    mbarrier_init(smem_u32(&sm.kv), 1);
}

// ---- The dQ writer (DQ_WRITER builds of both ws backwards; bench/NOTES.md step 75): a thread of
// the producer warpgroup adds the dQ tiles the MMA warpgroups stage in shared memory, so that the
// waits of those adds (for their reads, and in deterministic mode for the tile's turn and the add's
// completion) leave the MMA warps. Per tile MMA thread 0 fills a DqJob (bwd_dq_job) before its
// arrival on the tile's `dq_full` mbarrier; the writer waits for that, reads the job and adds
// (bwd_ws_add_dq).
struct DqJob {
    float* dst;  // the tile's first element in the tiled workspace
    int* sem;    // deterministic mode: the tile's semaphore, else null
    int target;  // ... the count it must reach before this key block adds
};

// MMA thread 0: the job of query block qb's tile (BM rows of DQ floats per tile; BN keys per key
// block kb). kb_first carries first_key_block's search from one tile to the next (the first key
// block that sees the tile: key block kb adds after kb - kb_first others; common.cuh).
template <int BM, int BN, int DQ>
__device__ __forceinline__ void bwd_dq_job(DqJob& job, const BwdParams& p, const BwdBlock& blk, int qb, int kb,
                                           int& kb_first) {
    job.dst = blk.dq_g + (index_t)qb * BM * DQ;
    job.sem = nullptr;
    job.target = 0;
    if (p.dq_sem) {
        job.sem = p.dq_sem + blk.bh * ((blk.pitch_q + BM - 1) / BM) + qb;
        kb_first = first_key_block(blk.win, qb, kb_first, qb == blk.qb_begin, BN, BM, blk.seqlen_q, blk.seqlen_k);
        job.target = kb - kb_first;
    }
}

// The writer: the tile's PARTS pieces of `bytes` each, from shared memory src[part] to job.dst +
// part * bytes / 4 (bulk reduce-adds, one group), in deterministic mode after the tile's earlier key
// blocks and complete in global memory before the next one is admitted; returns once the copies have
// read shared memory (the caller then hands the buffer back).
template <int PARTS>
__device__ __forceinline__ void bwd_ws_add_dq(const DqJob& job, const unsigned (&src)[PARTS], unsigned bytes) {
    if (job.sem) sem_wait(job.sem, job.target);
#pragma unroll
    for (int part = 0; part < PARTS; ++part) bulk_reduce_add_f32(job.dst + part * (bytes / 4), src[part], bytes);
    bulk_commit();
    if (job.sem) {
        bulk_wait<0>();
        sem_release(job.sem);
    } else {
        bulk_wait_read<0>();
    }
}

// P^T and dS^T in place from S^T and dP^T (NQ n8 tiles of query columns from q0; this warp's keys
// from key0), without a bias: one branch per tile on the mask (backward_p_ds with EDGE fixed at
// compile time; the ALiBi builds keep the run-time test in one loop: two copies spilled at hdim 128).
// `lse` and `d` point at the tile's first column's row (LSE2_: lse in log2 units); `keep`: the
// block's keep bits (DROPOUT builds: fill_keep_words' tile; unread otherwise).
// P_ONLY: P^T alone (backward_p_ds's P_ONLY; dS^T then from backward_ds_from_p).
template <int NQ, bool LSE2_, bool P_ONLY = false>
__device__ __forceinline__ void bwd_ws_p_ds(float* sacc, float* dp, const float* lse, const float* d, const BwdParams& p,
                                            const BwdBlock& blk, bool edge, int key0, int q0, const AccFrag& frag,
                                            const KeepTile& keep) {
    if (ALIBI)
        backward_p_ds<NQ, 2, LSE2_, P_ONLY>(sacc, dp, lse, d, p.scale_log2, edge, blk.win, blk.alibi, blk.bias, key0, q0,
                                            frag, blk.seqlen_q, blk.seqlen_k, blk.drop, keep);
    else if (edge)
        backward_p_ds<NQ, 1, LSE2_, P_ONLY>(sacc, dp, lse, d, p.scale_log2, true, blk.win, blk.alibi, blk.bias, key0, q0,
                                            frag, blk.seqlen_q, blk.seqlen_k, blk.drop, keep);
    else
        backward_p_ds<NQ, 0, LSE2_, P_ONLY>(sacc, dp, lse, d, p.scale_log2, false, blk.win, blk.alibi, blk.bias, key0, q0,
                                            frag, blk.seqlen_q, blk.seqlen_k, blk.drop, keep);
}

// The producer warp (its lanes 0..31; the rest of the producer warpgroup has returned). Lane 0
// issues the TMA loads: the key block's K and V once (completing `kv`), then per query block Q and
// dO into ring stage i % ST, from the ring's second round on after the stage's `empty` (BM query
// rows, BN keys, DQ / DV columns, SW: swizzled tiles). Every lane copies the block's LSE (LSE2: in
// log2 units, lse_log2) and D rows into the stage, zeros past the sequence, and arrives on the
// stage's `full` (which counts 1 + 32 arrivals: lane 0's expect_tx and the warp's release).
template <bool SW, int BM, int BN, int DQ, int DV, int ST, bool LSE2_, class Smem>
__device__ __forceinline__ void bwd_ws_produce(Smem& sm, const TmaMap& tm_q, const TmaMap& tm_k, const TmaMap& tm_v,
                                               const TmaMap& tm_do, const BwdBlock& blk, int h, int k0, int tq, int tk,
                                               int bq, int lane) {
    constexpr unsigned KV_BYTES = 2u * BN * (DQ + DV);
    constexpr unsigned QDO_BYTES = 2u * BM * (DQ + DV);
    if (lane == 0) {
        mbarrier_arrive_expect_tx(smem_u32(&sm.kv), KV_BYTES);
        tma_load_tile<SW, BN, DQ>(sm.k, tm_k, smem_u32(&sm.kv), blk.hk, tk + k0, bq);
        tma_load_tile<SW, BN, DV>(sm.v, tm_v, smem_u32(&sm.kv), blk.hk, tk + k0, bq);
    }
    for (int qb = blk.qb_begin, i = 0; qb < blk.qb_end; ++qb, ++i) {
        const int s = i % ST;
        const unsigned phase = (i / ST) & 1;
        if (i >= ST) mbarrier_wait(smem_u32(&sm.empty[s]), phase ^ 1);
        const int r0 = qb * BM;
        if (lane == 0) {
            mbarrier_arrive_expect_tx(smem_u32(&sm.full[s]), QDO_BYTES);
            tma_load_tile<SW, BM, DQ>(sm.q[s], tm_q, smem_u32(&sm.full[s]), h, tq + r0, bq);
            tma_load_tile<SW, BM, DV>(sm.dout[s], tm_do, smem_u32(&sm.full[s]), h, tq + r0, bq);
        }
#pragma unroll
        for (int r = lane; r < BM; r += 32) {
            const bool in = r0 + r < blk.seqlen_q;
            sm.lse[s][r] = in ? (LSE2_ ? lse_log2(blk.lse_g[r0 + r]) : blk.lse_g[r0 + r]) : 0.f;
            sm.d[s][r] = in ? blk.d_g[r0 + r] : 0.f;
        }
        mbarrier_arrive(smem_u32(&sm.full[s]));  // release: the LSE/D stores above
    }
}

// Group mode: rows [valid, R) of the R x C1 tile a and the R x C2 tile b hold the next sequence's
// tokens (TMA zero-fills only past the tensor); the THREADS MMA threads zero them before any GEMM
// reads them (0 * Inf is NaN), then meet at named barrier `bar`.
template <bool SW, int R, int C1, int C2, int THREADS>
__device__ __forceinline__ void bwd_ws_zero_tails(uint16_t* a, uint16_t* b, int valid, int tid, int bar) {
    zero_tile_rows<SW, R, C1, THREADS>(a, valid, tid);
    zero_tile_rows<SW, R, C2, THREADS>(b, valid, tid);
    fence_proxy_async();
    named_barrier_sync(bar, THREADS);
}

// This CTA's (key block, head, batch), and nhead_q (the number of heads the grid covers). HEADS_X 0:
// the grid is (key blocks, nhead_q, batch). HEADS_X >= 1: (nhead_q, key blocks, batch)
// (launch.dq_dk_dv_launch). The GPU starts CTAs x-fastest, so HEADS_X = 1 starts a batch entry's key
// block 0 of every head first, then key block 1, ...: under a causal mask key block kb sees the query
// rows from about its first key on, so the heaviest CTAs start first and the last ones are the
// lightest (the longest-processing-time order). The plan takes it for causal masks up to 4096 keys,
// where it measured 1-4.5% faster; from 8192 keys it lost as much again, because the CTAs running
// together then belong to every head and share less of Q and dO in L2 (bench/NOTES.md step 61).
// HEADS_X = G >= 2 keeps both: the i-th CTA to start (i = x + nhead_q y within a batch entry) is taken
// as CTA r of head group g (G heads; nhead_q a multiple of G, use_heads_x), key block r / G of head
// g G + r % G, so a group's key blocks 0 start first while the CTAs running together stay within a
// few heads (bench/NOTES.md step 65). Plain reads of blockIdx where the grid gives the coordinates:
// the compiler re-reads them where needed instead of holding them in registers (computing them from
// a linear index at run time spilled in step 61's first build; the G >= 2 builds are checked by the
// compile test).
template <int HX>
__device__ __forceinline__ void bwd_ws_tile(int& kb, int& h, int& b, int& nhead_q) {
    b = blockIdx.z;
    if constexpr (HX == 0) {
        kb = blockIdx.x, h = blockIdx.y, nhead_q = gridDim.y;
    } else if constexpr (HX == 1) {
        kb = blockIdx.y, h = blockIdx.x, nhead_q = gridDim.x;
    } else {
        static_assert((HX & (HX - 1)) == 0, "bwd_ws_tile: groups of a power of two heads");
        nhead_q = gridDim.x;  // (a multiple of HX: use_heads_x)
        const unsigned i = blockIdx.x + gridDim.x * blockIdx.y, per_group = HX * gridDim.y;
        const unsigned g = i / per_group, r = i - g * per_group;
        kb = r / HX, h = g * HX + r % HX;
    }
}

// Epilogue: dK (scaled) and dV of the CTA's BLOCK_N keys from k0 (this thread's accumulators: rows
// warp_key0 + frag.row(e), NDK / NDV n8 tiles from columns dk_col0 / dv_col0). 16-bit outputs whose
// rows start 16-byte aligned are written into shared memory `stage` (rows of HDIM + 8 elements: the
// 4-byte writes of a warp fall in distinct banks) and leave with one bulk copy per key row, issued by
// MMA threads 0 .. 2 * BLOCK_N - 1 (a bulk group each; the caller's bulk_wait_read<0>() before the
// CTA exits). The 4-byte stores straight from the accumulators cost 5.8 us per CTA at hdim 128 (8
// rows of 16 bytes per warp store, each a separate line), the staged rows 2.3 (bench/NOTES.md step
// 60). GQA's fp32 workspaces (rows twice as long: the stage would not fit) and unaligned outputs
// take those stores. `stage` must hold 2 * BLOCK_N * (HDIM_Q + HDIM_V + 16) bytes that no one reads
// or writes any more (the caller's K/V/Q/dO buffers after the last block); `bar`: a free named barrier.
template <int BLOCK_N, int HDIM_Q, int HDIM_V, int MMA_THREADS, int NDK, int NDV>
__device__ __forceinline__ void bwd_ws_store_dk_dv(const BwdParams& p, const BwdBlock& blk, int b, int h, int k0,
                                                   const float* acc_dk, const float* acc_dv, int warp_key0,
                                                   const AccFrag& frag, int dk_col0, int dv_col0, uint16_t* stage,
                                                   int tid, int bar) {
    static_assert(MMA_THREADS >= 2 * BLOCK_N, "bwd_ws_store_dk_dv: one thread per row of dK and of dV");
    constexpr int PK = HDIM_Q + 8, PV = HDIM_V + 8;
    const unsigned long long bits = reinterpret_cast<unsigned long long>(blk.dk) | reinterpret_cast<unsigned long long>(blk.dv) |
                                    static_cast<unsigned long long>(2 * (p.dk.sb | p.dk.sh | p.dk.ss | p.dv.sb | p.dv.sh |
                                                                         p.dv.ss | p.hdim_q | p.hdim_v));
    if (p.dkdv_fp32 || (bits & 15)) {  // (uniform)
        bwd_store_dk_dv<NDK, NDV>(p, blk, b, h, blk.hk, acc_dk, acc_dv, k0 + warp_key0, frag, dk_col0, dv_col0);
        return;
    }
    uint16_t* sdk = stage;
    uint16_t* sdv = stage + BLOCK_N * PK;
    store_dk_dv<NDK, NDV>(acc_dk, acc_dv, p.scale, warp_key0, frag, blk.seqlen_k - k0, p.hdim_q, p.hdim_v, dk_col0,
                          dv_col0, false, sdk, sdv, 0, 0, 0, 0, PK, 0, 0, PV);
    fence_proxy_async();
    named_barrier_sync(bar, MMA_THREADS);
    const int row = tid % BLOCK_N, j = k0 + row;
    if (tid < 2 * BLOCK_N && j < blk.seqlen_k) {
        const bool is_v = tid >= BLOCK_N;
        const index_t at = is_v ? b * p.dv.sb + blk.hk * p.dv.sh + (index_t)j * p.dv.ss
                                : b * p.dk.sb + blk.hk * p.dk.sh + (index_t)j * p.dk.ss;
        bulk_store(static_cast<uint16_t*>(is_v ? blk.dv : blk.dk) + at, smem_u32(is_v ? sdv + row * PV : sdk + row * PK),
                   2u * (is_v ? p.hdim_v : p.hdim_q));
        bulk_commit();
    }
}

}  // namespace fmha
