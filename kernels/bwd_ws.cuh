// Pieces shared by the two warp-specialized Hopper backward kernels (fmha_bwd_dq_dk_dv_sm90_ws.cu
// and fmha_bwd_dq_dk_dv_sm90_ws_wide.cu): the producer warp, and the zeroing of the rows a TMA box
// brings from the next sequence (group mode). Both kernels' shared-memory structs have the members
// used here: k, v (the key block's tiles), q[STAGES], dout[STAGES], lse[STAGES], d[STAGES] (the
// query blocks' ring) and the mbarriers full[STAGES], empty[STAGES], kv.
#pragma once
#include "common.cuh"
#include "arch/arch.cuh"
#include "block.cuh"

namespace fmha {

// Thread 0: the ring's mbarriers (full: lane 0's expect_tx and the LSE/D warp's 32 arrivals; empty:
// every MMA thread) and K/V's. The caller adds its own, then mbarrier_init_fence().
template <int ST, int MMA_THREADS, class Smem>
__device__ __forceinline__ void bwd_ws_init_barriers(Smem& sm) {
    for (int s = 0; s < ST; ++s) {
        mbarrier_init(smem_u32(&sm.full[s]), 1 + 32);
        mbarrier_init(smem_u32(&sm.empty[s]), MMA_THREADS);
    }
    mbarrier_init(smem_u32(&sm.kv), 1);
}

// P^T and dS^T in place from S^T and dP^T (NQ n8 tiles of query columns from q0; this warp's keys
// from key0), without a bias: one branch per tile on the mask (backward_p_ds with EDGE fixed at
// compile time; the ALiBi builds keep the run-time test in one loop: two copies spilled at hdim 128).
// `lse` and `d` point at the tile's first column's row (LSE2_: lse in log2 units); `keep`: the
// warp's keep bits (DROPOUT builds: AccFrag::keep_bits_t; unread otherwise).
// P_ONLY: P^T alone (backward_p_ds's P_ONLY; dS^T then from backward_ds_from_p).
template <int NQ, bool LSE2_, bool P_ONLY = false>
__device__ __forceinline__ void bwd_ws_p_ds(float* sacc, float* dp, const float* lse, const float* d, const BwdParams& p,
                                            const BwdBlock& blk, bool edge, int key0, int q0, const AccFrag& frag,
                                            const KeepWords<NQ>& keep) {
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

}  // namespace fmha
