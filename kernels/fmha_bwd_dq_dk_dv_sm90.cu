// Attention backward, main kernel for Hopper (sm_90a): the same CK dq_dk_dv pipeline as
// fmha_bwd_dq_dk_dv.cu, with the five GEMMs on warpgroup MMA (wgmma) instead of mma.sync.
//
// Two warpgroups; warpgroup w owns keys [64w, 64w + 64) of the CTA's BLOCK_N = 128 keys. K and V
// stay in shared memory (blocked layout, tile_blocked.cuh); Q, dO, LSE and D blocks of
// BLOCK_M = 64 rows are double-buffered with cp.async. Per Q block:
//   GEMM0  S^T  = K Q^T     wgmma A = K (smem, K-major),   B = Q  (smem, K-major)
//   GEMM2  dP^T = V dO^T    wgmma A = V,                   B = dO
//          P^T, dS^T elementwise in registers (window test on edge tiles only)
//   GEMM1  dV  += P^T dO    wgmma A = P^T (registers),     B = dO (smem, MN-major)
//   GEMM3  dK  += dS^T Q    wgmma A = dS^T (registers),    B = Q  (smem, MN-major)
//   GEMM4  dQ   = dS K      wgmma A = dS (smem, MN-major), B = K  (smem, MN-major); warpgroup w
//                           computes columns [w * HDIM_Q/2, (w+1) * HDIM_Q/2), staged in shared
//                           memory as the workspace's tile (DQ_TILED, common.cuh) and added into
//                           the fp32 workspace by one bulk reduce-add per query block
//                           (cp.reduce.async.bulk, the TMA engine), or copied into slab kb by one
//                           bulk store when dq_split_stride != 0 (deterministic). DQ_BULK=0:
//                           red.global.add / plain stores from every thread instead (what the
//                           library runs at hdim 64, with dropout and in deterministic mode;
//                           spec.bwd_specs says why).
// DQ_BULK: per-thread red.global.add of the dQ fragments (256 threads x 16 vector atomics per Q
// block) filled the load/store queues, and the next block's cp.async loads stalled behind them
// (ncu: a sixth of all warp stall samples on the cp.async issue); the bulk copies leave the
// queues to the loads.
// Parameters: BwdParams (params.cuh), as fmha_bwd_dq_dk_dv (one launch path for both).
//
// Constants (config.cuh): FMHA_BF16, HDIM_Q, HDIM_V (padded: 64 or 128), BIAS (elementwise bias; dS for dBias
//            into dbias_acc, as in fmha_bwd_dq_dk_dv.cu), DROPOUT (0/1: see fmha_bwd_dq_dk_dv.cu).
#include "common.cuh"
#include "arch/arch.cuh"
#include "attention.cuh"
#include "block.cuh"


using namespace fmha;

static_assert(NWG == 2 && BLOCK_N == 64 * NWG && NTHREADS == 128 * NWG && BLOCK_M == 64,
              "fmha_bwd_dq_dk_dv_sm90: two warpgroups of 64 keys, 64 query rows per step (spec.py)");
// OVERLAP (config.cuh, default on): issue GEMM4 while GEMM1/3 still run (their register operands
// stay pinned). DQ_BULK (default on): dQ through shared memory and bulk reduce-adds (see above).

// DQ_BULK: one dQ block, fp32 [BLOCK_M][HDIM_Q], chunks placed by dq_tile_chunk (common.cuh): the
// workspace's tile byte for byte, so one bulk copy moves it (one per row, 128 per block, cost 9%
// of the warp stall samples: each is a loop over the issuing lanes), and the fragment stores
// (8-byte, half a warp at a time) are free of bank conflicts
static_assert(DQ_TILED == DQ_BULK && (!DQ_BULK || HDIM_Q % 64 == 0),
              "fmha_bwd_dq_dk_dv_sm90: the bulk dQ path writes the tiled workspace (spec.py sets DQ_TILED)");
template <int N> struct DqStageSmem { float dq[N]; };
template <> struct DqStageSmem<0> {};

// Shared memory: K, V; Q, dO, LSE and D double-buffered; dS^T (for GEMM4); blocked tiles
// (tile_blocked.cuh). DROPOUT: the keep bits of the Q block being processed and of the next one;
// DQ_BULK: the dQ staging block.
struct SmemTiles {
    uint16_t k[BLOCK_N * HDIM_Q];
    uint16_t v[BLOCK_N * HDIM_V];
    uint16_t q[2][BLOCK_M * HDIM_Q];
    uint16_t dout[2][BLOCK_M * HDIM_V];
    uint16_t ds[BLOCK_N * BLOCK_M];
    float lse[2][BLOCK_M];
    float d[2][BLOCK_M];
};
constexpr int KEEP_SMEM = DROPOUT ? 2 * (BLOCK_N / 8) * BLOCK_M : 0;  // bytes
constexpr int DQ_STAGE = DQ_BULK ? BLOCK_M * HDIM_Q : 0;              // floats
struct Smem : SmemTiles, KeepBitsSmem<KEEP_SMEM>, DqStageSmem<DQ_STAGE> {};
static_assert(sizeof(Smem) == SMEM_BYTES, "fmha_bwd_dq_dk_dv_sm90: shared-memory layout and spec.py's SMEM_BYTES disagree");
// the optional parts follow the tiles in order (block.cuh: addressed by these offsets)
constexpr int KEEP_OFFSET = sizeof(SmemTiles), DQ_STAGE_OFFSET = KEEP_OFFSET + KEEP_SMEM;
static_assert(sizeof(Smem) == DQ_STAGE_OFFSET + 4 * DQ_STAGE && DQ_STAGE_OFFSET % 16 == 0,
              "fmha_bwd_dq_dk_dv_sm90: keep bits and dQ staging must follow the tiles, 16-byte aligned");
// DQ_BULK: thread 0 issues the block's bulk copy
__device__ __forceinline__ bool dq_issuer() { return DQ_BULK && threadIdx.x == 0; }

extern "C" __global__ void __launch_bounds__(NTHREADS, 1)
fmha_bwd_dq_dk_dv_sm90(FMHA_BWD_PARAMS_ARGS) {
    const BwdParams p = FMHA_BWD_PARAMS_STRUCT;  // flattened ABI: see params.cuh
    constexpr int NQ = BLOCK_M / 8;               // n8 tiles of S^T / dP^T (query rows)
    constexpr int NDQ = HDIM_Q / 8, NDV = HDIM_V / 8;
    constexpr int DQ_HALF = HDIM_Q / 2;           // GEMM4 columns per warpgroup

    extern __shared__ __align__(128) unsigned char smem_raw[];
    Smem& sm = *reinterpret_cast<Smem*>(smem_raw);
    uint16_t* sK = sm.k;
    uint16_t* sV = sm.v;
    uint16_t* sQ = &sm.q[0][0];
    uint16_t* sdO = &sm.dout[0][0];
    uint16_t* sdS = sm.ds;  // dS^T, [BLOCK_N][BLOCK_M] blocked
    float* sLse = &sm.lse[0][0];
    float* sD = &sm.d[0][0];
    uint16_t* sKeep = reinterpret_cast<uint16_t*>(smem_raw + KEEP_OFFSET);  // [2][BLOCK_N / 8][BLOCK_M / 2] (DROPOUT)
    constexpr int KEEP_WORDS = (BLOCK_N / 8) * (BLOCK_M / 2);
    float* sdQ = reinterpret_cast<float*>(smem_raw + DQ_STAGE_OFFSET);  // [BLOCK_M][HDIM_Q] tile (DQ_BULK)

    const int tid = threadIdx.x, warp = warp_of(tid);
    const int wg = warp >> 2, wi = warp & 3;       // warpgroup, warp inside it (16 keys each)
    const AccFrag frag(tid);  // this thread's accumulator elements (arch layer)
    const int kb = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int k0 = kb * BLOCK_N;
    BwdBlock blk;
    if (!bwd_block_state<BLOCK_M, BLOCK_N>(p, b, h, gridDim.y, kb, k0, blk)) return;

    load_blocked_async<BLOCK_N, HDIM_Q, NTHREADS>(sK, blk.kg, p.k.ss, k0, blk.seqlen_k, p.hdim_q, tid);
    load_blocked_async<BLOCK_N, HDIM_V, NTHREADS>(sV, blk.vg, p.v.ss, k0, blk.seqlen_k, p.hdim_v, tid);
    if (blk.qb_begin < blk.qb_end) {
        const int r0 = blk.qb_begin * BLOCK_M;
        load_blocked_async<BLOCK_M, HDIM_Q, NTHREADS>(sQ, blk.qg, p.q.ss, r0, blk.seqlen_q, p.hdim_q, tid);
        load_blocked_async<BLOCK_M, HDIM_V, NTHREADS>(sdO, blk.dog, p.dout.ss, r0, blk.seqlen_q, p.hdim_v, tid);
        load_vec_async<BLOCK_M, NTHREADS>(sLse, blk.lse_g, r0, blk.seqlen_q, tid);
        load_vec_async<BLOCK_M, NTHREADS>(sD, blk.d_g, r0, blk.seqlen_q, tid);
        if constexpr (DROPOUT) fill_keep_words<BLOCK_M, BLOCK_N, NTHREADS>(sKeep, blk.drop, r0, k0, tid);
    }
    cp_async_commit();

    float acc_dk[NDQ * 4], acc_dv[NDV * 4];
#pragma unroll
    for (int i = 0; i < NDQ * 4; ++i) acc_dk[i] = 0.f;
#pragma unroll
    for (int i = 0; i < NDV * 4; ++i) acc_dv[i] = 0.f;
    const int key_row0 = wg * 64;                  // this warpgroup's keys inside the block
    const int warp_key0 = key_row0 + wi * 16;     // this warp's keys inside the block

    for (int qb = blk.qb_begin; qb < blk.qb_end; ++qb) {
        const int buf = (qb - blk.qb_begin) & 1;
        const int q0 = qb * BLOCK_M;
        cp_async_wait<0>();
        fence_proxy_async();
        __syncthreads();
        const uint16_t* sQb = sQ + buf * BLOCK_M * HDIM_Q;
        const uint16_t* sdOb = sdO + buf * BLOCK_M * HDIM_V;
        const float* sLseb = sLse + buf * BLOCK_M;
        const float* sDb = sD + buf * BLOCK_M;

        // GEMM0 and GEMM2, issued together
        float s[NQ * 4], dp[NQ * 4];
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < HDIM_Q / 16; ++kk)
            wgmma_ss<BLOCK_M, 0, 0>(s, desc_kmajor<HDIM_Q>(sK, key_row0, kk * 16), desc_kmajor<HDIM_Q>(sQb, 0, kk * 16), kk > 0);
#pragma unroll
        for (int kk = 0; kk < HDIM_V / 16; ++kk)
            wgmma_ss<BLOCK_M, 0, 0>(dp, desc_kmajor<HDIM_V>(sV, key_row0, kk * 16), desc_kmajor<HDIM_V>(sdOb, 0, kk * 16), kk > 0);
        wgmma_commit();
        // the next block's loads while GEMM0 and GEMM2 run (issued before them, the loads held the
        // tensor cores back: 1.5% at hdim 128, bench/NOTES.md step 19). Buffer nb's last readers,
        // the previous block's GEMM1 and GEMM3, completed before that block's GEMM4 wait.
        if (qb + 1 < blk.qb_end) {
            const int r0 = q0 + BLOCK_M, nb = buf ^ 1;
            load_blocked_async<BLOCK_M, HDIM_Q, NTHREADS>(sQ + nb * BLOCK_M * HDIM_Q, blk.qg, p.q.ss, r0, blk.seqlen_q, p.hdim_q, tid);
            load_blocked_async<BLOCK_M, HDIM_V, NTHREADS>(sdO + nb * BLOCK_M * HDIM_V, blk.dog, p.dout.ss, r0, blk.seqlen_q, p.hdim_v, tid);
            load_vec_async<BLOCK_M, NTHREADS>(sLse + nb * BLOCK_M, blk.lse_g, r0, blk.seqlen_q, tid);
            load_vec_async<BLOCK_M, NTHREADS>(sD + nb * BLOCK_M, blk.d_g, r0, blk.seqlen_q, tid);
        }
        cp_async_commit();
        wgmma_wait0();
        fence_operand<NQ * 4>(s);
        fence_operand<NQ * 4>(dp);

        // P^T and dS^T
        const bool edge = blk.win.tile_needs_test(q0, BLOCK_M, k0, BLOCK_N, blk.seqlen_q, blk.seqlen_k);
        backward_p_ds<NQ>(s, dp, sLseb, sDb, p.scale_log2, edge, blk.win, blk.alibi, blk.bias, k0 + warp_key0, q0, frag,
                          blk.seqlen_q, blk.seqlen_k, blk.drop, KeepTile{sKeep + buf * KEEP_WORDS, key_row0 + wi * 16});
        if constexpr (BIAS)
            if (p.dbias_acc != nullptr)  // dS in fp32 for dBias
                bwd_store_ds<NQ>(p, blk, dp, k0 + warp_key0, q0, frag);
        uint32_t pa[BLOCK_M / 16][4], dsa[BLOCK_M / 16][4];
        bwd_p_ds_operands<BLOCK_M>(s, dp, pa, dsa, sdS, warp_key0, frag);  // (+ dS^T for GEMM4)

        // GEMM1 and GEMM3 (A from registers)
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BLOCK_M / 16; ++kk) {
            wgmma_rs<HDIM_V, 1>(acc_dv, pa[kk], desc_mnmajor<HDIM_V>(sdOb, kk * 16, 0), 1);
            wgmma_rs<HDIM_Q, 1>(acc_dk, dsa[kk], desc_mnmajor<HDIM_Q>(sQb, kk * 16, 0), 1);
        }
        wgmma_commit();
        if constexpr (!OVERLAP) {
            wgmma_wait0();
            fence_operand<NDV * 4>(acc_dv);
            fence_operand<NDQ * 4>(acc_dk);
        }
        fence_proxy_async();
        // the previous block's dQ rows have left sdQ (a no-op in threads that issued no bulk
        // copies; executed by all: the predicated form spilled at hdim 128)
        if constexpr (DQ_BULK) bulk_wait_read<0>();
        __syncthreads();  // dS^T visible to both warpgroups; sdQ free

        // GEMM4: dQ[q0 .. q0 + 64, wg half of the columns] = dS K
        {
            float acc_dq[DQ_HALF / 2];
#pragma unroll
            for (int i = 0; i < DQ_HALF / 2; ++i) acc_dq[i] = 0.f;
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BLOCK_N / 16; ++kk)
                wgmma_ss<DQ_HALF, 1, 1>(acc_dq, desc_mnmajor<BLOCK_M>(sdS, kk * 16, 0),
                                        desc_mnmajor<HDIM_Q>(sK, kk * 16, wg * DQ_HALF), 1);
            wgmma_commit();
            wgmma_wait0();
            fence_operand<DQ_HALF / 2>(acc_dq);
            if constexpr (OVERLAP) {
                fence_operand<NDV * 4>(acc_dv);
                fence_operand<NDQ * 4>(acc_dk);
                fence_operand<BLOCK_M / 4>(&pa[0][0]);
                fence_operand<BLOCK_M / 4>(&dsa[0][0]);
            }
            if constexpr (DQ_BULK) {  // this warpgroup's columns of the tile into sdQ, then one bulk copy
                stage_dq_tile<DQ_HALF / 8, HDIM_Q>(sdQ, acc_dq, wi * 16, wg * DQ_HALF, frag);
                fence_proxy_async();
                named_barrier_sync(1, NTHREADS);
                if (dq_issuer()) {
                    float* dst = blk.dq_g + (index_t)q0 * HDIM_Q;
                    if (p.dq_split_stride) bulk_store(dst, smem_u32(sdQ), 4u * BLOCK_M * HDIM_Q);  // deterministic: own slab
                    else bulk_reduce_add_f32(dst, smem_u32(sdQ), 4u * BLOCK_M * HDIM_Q);
                    bulk_commit();
                }
            } else {
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const int i = q0 + wi * 16 + frag.row(2 * r);
                    if (i < blk.seqlen_q) {
                        // without dropout the row base is recomputed from the params (constant
                        // bank) and the block index: kept live through the loop, blk.dq_g spilled
                        // the deterministic build at hdim 128; the dropout builds spill less with it
                        float* row = (DROPOUT ? blk.dq_g
                                              : p.dq_acc + blockIdx.x * p.dq_split_stride +
                                                    ((index_t)blockIdx.z * gridDim.y + blockIdx.y) * blk.pitch_q * p.hdim_q) +
                                     (index_t)i * p.hdim_q + wg * DQ_HALF + frag.col(0, 0);
                        const int ncol = p.hdim_q - wg * DQ_HALF - frag.col(0, 0);
                        if (p.dq_split_stride) {  // deterministic: this CTA's slab, plain stores
#pragma unroll
                            for (int n = 0; n < DQ_HALF / 8; ++n)
                                if (n * 8 < ncol)
                                    *reinterpret_cast<float2*>(row + n * 8) =
                                        make_float2(acc_dq[4 * n + 2 * r], acc_dq[4 * n + 2 * r + 1]);
                        } else {
#pragma unroll
                            for (int n = 0; n < DQ_HALF / 8; ++n)
                                if (n * 8 < ncol) red_add_f32x2(row + n * 8, acc_dq[4 * n + 2 * r], acc_dq[4 * n + 2 * r + 1]);
                        }
                    }
                }
            }
        }
        // the next block's keep bits (read after the next iteration's barrier; the buffer's last
        // readers, in the previous iteration, are past this iteration's barrier). At the end of
        // the iteration, where S, dP and dQ are dead: anywhere else the Philox state spills.
        if constexpr (DROPOUT)
            if (qb + 1 < blk.qb_end) fill_keep_words<BLOCK_M, BLOCK_N, NTHREADS>(sKeep + (buf ^ 1) * KEEP_WORDS, blk.drop,
                                                                            q0 + BLOCK_M, k0, tid);
    }

    if constexpr (DQ_BULK) bulk_wait<0>();  // sdQ must outlive the bulk reads; the adds complete
    // epilogue: dK *= scale; write dK, dV
    bwd_store_dk_dv<NDQ, NDV>(p, blk, b, h, blk.hk, acc_dk, acc_dv, k0 + warp_key0, frag, 0, 0);
}
