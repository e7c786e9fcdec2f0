// Attention forward for Hopper (sm_90a): FlashAttention-2's algorithm (Dao, 2023) with both GEMMs
// on warpgroup MMA. Warpgroup w of the CTA owns query rows [64w, 64w + 64) of BLOCK_M = 64 * NWG;
// K/V blocks of BLOCK_N keys are double-buffered in shared memory (blocked layout, cp.async).
//   S = Q K^T     wgmma A = Q (smem, K-major), B = K (smem, K-major)
//   O += P V      wgmma A = P (registers),     B = V (smem, MN-major)
// Parameters: FwdParams (params.cuh), as fmha_fwd (one launch path for both).
//
// Constants (config.cuh): FMHA_BF16, HDIM_Q, HDIM_V (padded: 64 or 128), BLOCK_N (64 or 128), NWG (warpgroups),
//            MIN_BLOCKS (CTAs per SM for __launch_bounds__), BIAS (elementwise bias), DROPOUT (0/1, as
//            fmha_fwd.cu).
#include "common.cuh"
#include "arch/arch.cuh"
#include "attention.cuh"
#include "block.cuh"

using namespace fmha;

// WG_SKIP (config.cuh): warpgroups skip key blocks none of their rows see (see fwd_step). Measured
// on the H200: +2-8% at 2 warpgroups (hdim 64); at 3 warpgroups (hdim 128, at the 168-register
// cap) the extra loop copies made every block slower (-6 to -9% at seqlen 2048-8192), and the ALiBi
// instance spills; the default is on at 2 warpgroups without ALiBi.
static_assert(BLOCK_M == 64 * NWG && NTHREADS == 128 * NWG, "fmha_fwd_sm90: one warpgroup per 64 query rows (spec.py)");

// Shared memory: Q, then K and V, double-buffered; blocked tiles (tile_blocked.cuh).
struct Smem {
    uint16_t q[BLOCK_M * HDIM_Q];
    uint16_t k[2][BLOCK_N * HDIM_Q];
    uint16_t v[2][BLOCK_N * HDIM_V];
};
static_assert(sizeof(Smem) == SMEM_BYTES, "fmha_fwd_sm90: shared-memory layout and spec.py's SMEM_BYTES disagree");

// One key block kb: wait for its K/V, start loading the next, S = Q K^T, online softmax,
// O += P V. SKIP: this warpgroup skips the block when none of its rows sees a key of it
// (wkb_begin/wkb_end); the kernel calls the SKIP version only for the blocks where the
// warpgroups differ, because the branch slows every block of a loop that contains it.
template <bool SKIP>
__device__ __forceinline__ void fwd_step(const FwdParams& p, const FwdBlock& blk, int kb, int wkb_begin, int wkb_end,
                                         const uint16_t* sQ, uint16_t* sK, uint16_t* sV, int tid, int wg, int wi,
                                         const AccFrag& f, int wq0, float* acc_o, float* row_max, float* row_sum) {
    constexpr int NS = BLOCK_N / 8, NO = HDIM_V / 8;
    const int buf = (kb - blk.kb_begin) & 1;
    cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();
    if (kb + 1 < blk.kb_end) {
        load_blocked_async<BLOCK_N, HDIM_Q, NTHREADS>(sK + (buf ^ 1) * BLOCK_N * HDIM_Q, blk.kg, p.k.ss,
                                                      (kb + 1) * BLOCK_N, blk.seqlen_k, p.hdim_q, tid);
        load_blocked_async<BLOCK_N, HDIM_V, NTHREADS>(sV + (buf ^ 1) * BLOCK_N * HDIM_V, blk.vg, p.v.ss,
                                                      (kb + 1) * BLOCK_N, blk.seqlen_k, p.hdim_v, tid);
    }
    cp_async_commit();
    const uint16_t* sKb = sK + buf * BLOCK_N * HDIM_Q;
    const uint16_t* sVb = sV + buf * BLOCK_N * HDIM_V;
    if (SKIP && (kb < wkb_begin || kb >= wkb_end)) return;  // uniform per warpgroup

    float s[NS * 4];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < HDIM_Q / 16; ++kk)
        wgmma_ss<BLOCK_N, 0, 0>(s, desc_kmajor<HDIM_Q>(sQ, wg * 64, kk * 16), desc_kmajor<HDIM_Q>(sKb, 0, kk * 16), kk > 0);
    wgmma_commit();
    const int k0 = kb * BLOCK_N;
    KeepBits<NS> keep;  // (dropout: Philox on the ALUs while the tensor cores compute S)
    if constexpr (DROPOUT) {
        keep = fwd_keep_bits<NS>(blk.drop, wq0 + wi * 16, k0, f);
        fence_operand<sizeof(keep) / 4>(&keep.w[0][0]);  // computed before the wait, not after
    }
    wgmma_wait0();
    fence_operand<NS * 4>(s);

    const bool edge = blk.win.tile_needs_test(wq0, 64, k0, BLOCK_N, blk.seqlen_q, blk.seqlen_k);
    online_softmax<NS, NO>(s, acc_o, row_max, row_sum, p.scale_log2, edge, blk.win, blk.alibi, blk.bias, wq0 + wi * 16, k0, f,
                           blk.seqlen_k, keep);
    uint32_t pa[BLOCK_N / 16][4];
#pragma unroll
    for (int kk = 0; kk < BLOCK_N / 16; ++kk) c_to_a(pa[kk], s + 8 * kk, s + 8 * kk + 4);

    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BLOCK_N / 16; ++kk)
        wgmma_rs<HDIM_V, 1>(acc_o, pa[kk], desc_mnmajor<HDIM_V>(sVb, kk * 16, 0), 1);
    wgmma_commit();
    wgmma_wait0();
    fence_operand<NO * 4>(acc_o);
}

extern "C" __global__ void __launch_bounds__(NTHREADS, MIN_BLOCKS)
fmha_fwd_sm90(const __grid_constant__ FwdParams p) {
    constexpr int NO = HDIM_V / 8;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    Smem& sm = *reinterpret_cast<Smem*>(smem_raw);
    uint16_t* sQ = sm.q;
    uint16_t* sK = &sm.k[0][0];
    uint16_t* sV = &sm.v[0][0];

    const int tid = threadIdx.x, warp = warp_of(tid);
    const int wg = warp >> 2, wi = warp & 3;  // warpgroup, warp inside it (16 rows each)
    const AccFrag frag(tid);  // this thread's accumulator elements (arch layer)
    const int h = blockIdx.y, b = blockIdx.z;
    // last row blocks first: under causal masks they see the most keys, so the tail is short
    const int q0 = (gridDim.x - 1 - blockIdx.x) * BLOCK_M;
    FwdBlock blk;
    if (!fwd_block_state<BLOCK_M, BLOCK_N, NTHREADS>(p, b, h, q0, tid, blk)) return;

    // This warpgroup's own key blocks: on the causal diagonal, and in the last row block of a
    // sequence, some warpgroups have nothing to do for a key block; they skip its GEMMs (but still
    // load and meet the barriers), leaving the tensor cores to the others.
    const int wq0 = q0 + wg * 64;
    int wkb_begin, wkb_end;
    key_block_range(blk.win, wq0, 64, BLOCK_N, blk.seqlen_q, blk.seqlen_k, wkb_begin, wkb_end);
    if (wq0 >= blk.seqlen_q) wkb_end = wkb_begin;

    load_blocked_async<BLOCK_M, HDIM_Q, NTHREADS>(sQ, blk.qg, p.q.ss, q0, blk.seqlen_q, p.hdim_q, tid);
    if (blk.kb_begin < blk.kb_end) {
        load_blocked_async<BLOCK_N, HDIM_Q, NTHREADS>(sK, blk.kg, p.k.ss, blk.kb_begin * BLOCK_N, blk.seqlen_k, p.hdim_q, tid);
        load_blocked_async<BLOCK_N, HDIM_V, NTHREADS>(sV, blk.vg, p.v.ss, blk.kb_begin * BLOCK_N, blk.seqlen_k, p.hdim_v, tid);
    }
    cp_async_commit();

    float acc_o[NO * 4];
#pragma unroll
    for (int i = 0; i < NO * 4; ++i) acc_o[i] = 0.f;
    float row_max[2] = {-FMHA_INF, -FMHA_INF}, row_sum[2] = {0.f, 0.f};
    const int warp_row0 = wg * 64 + wi * 16;  // this warp's rows in the block

    // Three phases: [blk.kb_begin, all_begin) and [all_end, blk.kb_end), where the warpgroups' key ranges
    // differ (causal diagonal, window edges, a last row block with warpgroups past the end), run
    // the skipping block; [all_begin, all_end), where every warpgroup works, the plain one.
    int all_begin = blk.kb_begin, all_end = blk.kb_end;
    for (int w = 0; w < NWG; ++w) {
        int wb, we;
        key_block_range(blk.win, q0 + w * 64, 64, BLOCK_N, blk.seqlen_q, blk.seqlen_k, wb, we);
        if (q0 + w * 64 >= blk.seqlen_q) we = wb;
        all_begin = max(all_begin, wb);
        all_end = min(all_end, we);
    }
    all_begin = min(all_begin, blk.kb_end);
    all_end = max(all_end, all_begin);
    if (!WG_SKIP && wq0 >= blk.seqlen_q) {
        // All rows of this warpgroup are past the end (the last row block of a sequence that is
        // not a multiple of BLOCK_M): it only loads and meets the barriers, so the CTA's other
        // warpgroups get the tensor cores. (fwd_step<true> with an empty range: the GEMMs are
        // compiled out of this copy.)
        for (int kb = blk.kb_begin; kb < blk.kb_end; ++kb)
            fwd_step<true>(p, blk, kb, 0, 0, sQ, sK, sV, tid, wg, wi, frag, wq0, acc_o, row_max, row_sum);
    } else {
        if (!WG_SKIP) all_begin = blk.kb_begin, all_end = blk.kb_end;
        for (int kb = blk.kb_begin; kb < all_begin; ++kb)
            fwd_step<WG_SKIP>(p, blk, kb, wkb_begin, wkb_end, sQ, sK, sV, tid, wg, wi, frag, wq0, acc_o, row_max, row_sum);
        for (int kb = all_begin; kb < all_end; ++kb)
            fwd_step<false>(p, blk, kb, wkb_begin, wkb_end, sQ, sK, sV, tid, wg, wi, frag, wq0, acc_o, row_max, row_sum);
        for (int kb = all_end; kb < blk.kb_end; ++kb)
            fwd_step<WG_SKIP>(p, blk, kb, wkb_begin, wkb_end, sQ, sK, sV, tid, wg, wi, frag, wq0, acc_o, row_max, row_sum);
    }

    fwd_store_rows<NO>(p, blk, b, h, q0 + warp_row0, acc_o, row_max, row_sum, frag);
}
